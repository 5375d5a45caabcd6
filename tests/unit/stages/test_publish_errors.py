"""Pure parts of the consumer's path: how registry failures become one line and its fix, the
shared credential path, and the host check pull runs before it pulls. No Docker, no registry
(the same failures against the real registry: test_publish_registry.py, test_publish_consumer.py).

The daemon messages below are the texts dockerd 20.10 answers with (recorded on this machine,
and from the distribution registry's error codes)."""

from __future__ import annotations

from tests.paths import TESTS

import shutil
from pathlib import Path

import pytest

from infermatrix.host import doctor, hostcheck
from infermatrix.stages import publish
from infermatrix.engine import registry as reg
from infermatrix.errors import UsageError

HOST = TESTS / "fixtures" / "host"
DIGEST = "sha256:" + "d" * 64

DAEMON_MESSAGES = [
    (f'Get "http://127.0.0.1:5000/v2/imx/manifests/{DIGEST}": no basic auth credentials',
     reg.RegistryAuthError),
    ("unauthorized: authentication required", reg.RegistryAuthError),
    ("denied: requested access to the resource is denied", reg.RegistryAuthError),
    (f"manifest for 127.0.0.1:5000/imx@{DIGEST} not found: manifest unknown: manifest unknown",
     reg.RegistryNotFound),
    # the port holds "401": a status code is matched as a word, never inside a number
    ('Get "http://127.0.0.1:54013/v2/": dial tcp 127.0.0.1:54013: connect: connection refused',
     reg.RegistryUnreachable),
    ('Get "https://registry.lan:5000/v2/": dial tcp: lookup registry.lan: no such host',
     reg.RegistryUnreachable),
    ('Get "https://10.0.0.5:5000/v2/": x509: certificate signed by unknown authority',
     reg.RegistryTLSError),
    ('Get "https://10.0.0.5:5000/v2/": http: server gave HTTP response to HTTPS client',
     reg.RegistryTLSError),
    ("filesystem layer verification failed for digest " + DIGEST + ": digest mismatch",
     reg.DigestMismatch),
    ("something nobody has seen", reg.RegistryError),
]


@pytest.mark.parametrize(("message", "kind"), DAEMON_MESSAGES)
def test_daemon_messages_are_classified(message, kind):
    assert reg.classify(message) is kind


@pytest.mark.parametrize(("message", "kind"), DAEMON_MESSAGES)
def test_every_registry_error_is_one_line_with_the_fix(message, kind):
    creds = reg.RegistryCredentials("alice", "s3cret-pw", reg.REGISTRY_USER_ENV)
    error = reg.registry_error("pull of 127.0.0.1:5000/imx@" + DIGEST, message + "\n  more",
                               "127.0.0.1:5000", creds)
    text = str(error)
    assert isinstance(error, kind) and error.exit_code == (5 if kind is reg.RegistryUnreachable
                                                           else 1)
    assert "\n" not in error.message and error.fix
    assert text == f"{error.message}\n  fix: {error.fix}"  # errors.py's form: message, fix line
    assert "alice" in text and "s3cret-pw" not in text
    if kind is reg.RegistryAuthError:
        assert reg.REGISTRY_USER_ENV in text and "docker login 127.0.0.1:5000" in text
    if kind is reg.RegistryTLSError:
        assert "/etc/docker/certs.d/127.0.0.1:5000/ca.crt" in text


def test_publish_and_pull_share_one_credential_path(monkeypatch, tmp_path):
    """The variables first, then Docker's config (DOCKER_CONFIG honoured), else anonymous."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # an empty config: no stored logins
    monkeypatch.setenv(reg.REGISTRY_USER_ENV, "bob")
    monkeypatch.setenv(reg.REGISTRY_PASSWORD_ENV, "pw")
    creds = reg.credentials_for("127.0.0.1:5000/team/infermatrix")
    assert (creds.username, creds.password, creds.source) == \
        ("bob", "pw", f"{reg.REGISTRY_USER_ENV}/{reg.REGISTRY_PASSWORD_ENV}")
    monkeypatch.delenv(reg.REGISTRY_USER_ENV)
    assert reg.credentials_for("127.0.0.1:5000/team/infermatrix").anonymous
    with pytest.raises(UsageError, match="names no registry host"):
        reg.credentials_for("infermatrix")


# --- host check before a pull ---------------------------------------------------------------

def entry(arch: str = "sm_120", cuda: str = "13.0") -> dict:
    cell = f"cu130-torch2.11.0-sglang0.5.11-{arch.replace('_', '')}" if arch != "cpu" else \
        "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
    return {"cell": cell, "arch": arch, "cuda": cuda, "min_driver": publish.min_driver_for(cuda)}


def host(smi: str | None, root: Path) -> doctor.HostReaders:
    text = (HOST / smi).read_text() if smi else doctor.NO_DRIVER_HINT
    return doctor.HostReaders(root=root, nvidia_smi=lambda: (0 if smi else None, text),
                              docker_info=lambda: {"runtimes": ["nvidia", "runc"]})


def test_a_cpu_cell_needs_nothing_of_the_host(tmp_path):
    assert hostcheck.check_host(entry("cpu", "cpu"), {}, host(None, tmp_path)).ok


def test_a_gpu_cell_on_a_host_without_a_gpu_is_refused(tmp_path):
    result = hostcheck.check_host(entry(), {}, host(None, tmp_path))
    assert not result.ok and "needs an NVIDIA GPU" in result.problems[0]


def test_a_gpu_of_another_arch_is_refused(tmp_path):
    result = hostcheck.check_host(entry(), {}, host("h200-580/nvidia-smi.csv", tmp_path))
    assert any("arch mismatch" in p and "sm_120" in p for p in result.problems)


def test_the_images_driver_floor_label_wins_over_images_lock(tmp_path):
    smi = "rtx-pro-6000-sample/nvidia-smi.csv"  # driver 580.95.05, compute capability 12.0
    assert hostcheck.check_host(entry(), {}, host(smi, tmp_path)).ok  # lock: 580.65.06
    for label in hostcheck.DRIVER_FLOOR_LABELS:
        result = hostcheck.check_host(entry(), {label: "590.44.01"}, host(smi, tmp_path))
        assert result.problems == [
            "driver 580.95.05 is below 590.44.01, the minimum for CUDA 13.0; fix: install an "
            "NVIDIA driver >= 590.44.01 on the host, or pick a cell whose floor this driver "
            "meets"]


def test_an_lxc_guest_without_device_nodes_gets_the_proxmox_lines(tmp_path):
    shutil.copytree(HOST / "lxc-guest-sample", tmp_path, dirs_exist_ok=True)
    (tmp_path / "proc").mkdir()
    shutil.copy(HOST / "h200-580" / "proc-devices", tmp_path / "proc" / "devices")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()  # passed, but no GPU node and no nvidia-uvm
    readers = host("lxc-guest-sample/nvidia-smi.csv", tmp_path)

    result = hostcheck.check_host(entry(), {}, readers, ctid=117)

    assert len(result.problems) == 1
    assert "LXC" in result.problems[0] and "/dev/nvidia0" in result.problems[0]
    assert "/dev/nvidia-uvm" in result.problems[0] and "/dev/nvidiactl" not in result.problems[0]
    advice = "\n".join(result.advice)
    assert "infermatrix proxmox lxc-config --ctid 117" in advice
    assert "/etc/pve/lxc/117.conf" in advice
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in advice
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" in advice  # nvidia-uvm's dynamic major
    assert "no-cgroups = true" in advice

    (tmp_path / "dev" / "nvidia0").touch()
    (tmp_path / "dev" / "nvidia-uvm").touch()
    assert hostcheck.check_host(entry(), {}, readers).ok


def test_without_a_ctid_the_lines_name_a_placeholder(tmp_path):
    (tmp_path / "proc").mkdir()
    shutil.copy(HOST / "h200-580" / "proc-devices", tmp_path / "proc" / "devices")
    lines = hostcheck.proxmox_lines(doctor.HostReaders(root=tmp_path), None, "c", None)
    text = "\n".join(lines)
    assert "/etc/pve/lxc/<CTID>.conf" in text and "--ctid <CTID>" in text
    assert "100" not in text.replace("1000", "")
