"""`proxmox lxc-config` against recorded /proc/devices and /dev listings (tests/fixtures/host/)."""

from __future__ import annotations

from tests.paths import TESTS

import re
import shutil
from pathlib import Path

import pytest

from infermatrix.host import proxmox
from infermatrix.stages import publish
from infermatrix.cli import main
from infermatrix.errors import StageFailure, UsageError
from infermatrix.model.cell import Cell

HOST = TESTS / "fixtures" / "host"


def host_root(tmp_path: Path, sample: str, proc_devices: str = "proc-devices") -> Path:
    """A host root with proc/devices and, for the H200 recording, the /dev nodes it listed."""
    root = tmp_path / sample
    (root / "proc").mkdir(parents=True)
    shutil.copy(HOST / sample / proc_devices, root / "proc" / "devices")
    listing = HOST / sample / "dev-nvidia-ls.txt"
    if listing.exists():
        dev = root / "dev"
        for path in re.findall(r"(/dev/nvidia[\w-]*)$", listing.read_text(), re.M):
            (dev / path[len("/dev/"):]).parent.mkdir(parents=True, exist_ok=True)
            (dev / path[len("/dev/"):]).touch()
        (dev / "nvidia-caps").mkdir(exist_ok=True)
    return root


def test_parse_proc_devices_reads_character_devices_only():
    devices = proxmox.parse_proc_devices((HOST / "h200-580" / "proc-devices").read_text())
    assert devices["nvidia"] == 195 and devices["nvidia-uvm"] == 238
    assert devices["nvidia-caps"] == 241 and devices["nvidia-nvswitch"] == 239
    assert "loop" not in devices  # a block device
    assert proxmox.nvidia_majors(devices) == {195: ["nvidia", "nvidiactl"],
                                              238: ["nvidia-uvm"], 241: ["nvidia-caps"]}


def test_lines_for_the_recorded_h200_use_its_dynamic_majors(tmp_path):
    root = host_root(tmp_path, "h200-580")
    nodes, has_caps = proxmox.nvidia_nodes(root / "dev")
    assert nodes == ["nvidia0", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"] and has_caps

    lines = proxmox.lxc_config_lines(101, (root / "proc/devices").read_text(), nodes, has_caps,
                                     "580.159.04")

    config = [ln for ln in lines if ln.startswith("lxc.")]
    assert config[:3] == ["lxc.cgroup2.devices.allow: c 195:* rwm",
                          "lxc.cgroup2.devices.allow: c 238:* rwm",
                          "lxc.cgroup2.devices.allow: c 241:* rwm"]
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" \
        in config
    assert "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir" \
        in config
    assert not any("511" in ln for ln in config)  # nothing hard-coded
    text = "\n".join(lines)
    assert "no-cgroups = true" in text and "[nvidia-container-cli]" in text
    assert "580.159.04" in text and "version mismatch" in text
    assert "features: keyctl=1,nesting=1" in text


def test_legacy_names_and_the_classic_511(tmp_path):
    text = (HOST / "rtx-pro-6000-sample" / "proc-devices").read_text()
    lines = proxmox.lxc_config_lines(200, text, ["nvidia0", "nvidia1", "nvidiactl"], False, None,
                                     cgroup_v1=True)
    assert "lxc.cgroup.devices.allow: c 195:* rwm" in lines
    assert "lxc.cgroup.devices.allow: c 511:* rwm" in lines
    assert "lxc.cgroup.devices.allow: c 236:* rwm" in lines


def test_warns_when_nvidia_uvm_is_not_loaded_yet():
    text = (HOST / "rtx-pro-6000-sample" / "proc-devices-before-uvm").read_text()
    lines = proxmox.lxc_config_lines(101, text, [], False, None)
    joined = "\n".join(lines)
    assert "nvidia-uvm is not loaded yet" in joined and "nvidia-modprobe -u -c=0" in joined
    assert "no /dev/nvidia* nodes found" in joined


def test_a_host_without_the_driver_is_a_failure():
    text = (HOST / "no-gpu-this-machine" / "proc-devices").read_text()
    with pytest.raises(StageFailure, match="no NVIDIA device"):
        proxmox.lxc_config_lines(101, text, [], False, None)


def test_ctid_must_be_a_proxmox_id():
    with pytest.raises(UsageError):
        proxmox.check_ctid(7)


def test_lxc_config_command_prints_the_pinned_run_line(tmp_path, capsys):
    root = host_root(tmp_path, "h200-580")
    cell = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")
    lock = publish.empty_images_lock()
    digest = "sha256:" + "3" * 64
    lock["images"][cell.id] = {
        "cell": cell.id, "repository": "ghcr.io/acme/infermatrix", "digest": digest,
        "reference": f"ghcr.io/acme/infermatrix@{digest}", "arch": "sm_120", "cuda": "13.0",
        "run": {"command": ["python3", "-m", "sglang.launch_server", "--port", "{port}",
                            "--model-path", "{model}"], "env": {}, "gpu": True,
                "shm_size": "16g", "port": 30000}}
    publish.write_images_lock(tmp_path / "images.lock", lock)

    code = main(["proxmox", "lxc-config", "--ctid", "105", "--host-root", str(root),
                 "--nvidia-smi-csv", str(HOST / "h200-580" / "nvidia-smi.csv"),
                 "--lock", str(tmp_path / "images.lock"), "--cell", "*-sm120"])

    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("# /etc/pve/lxc/105.conf")
    run_line = out.strip().splitlines()[-1]
    assert run_line.startswith("docker run --rm") and f"@{digest}" in run_line
    assert "--gpus all" in run_line and "--device /dev/nvidia-uvm" in run_line
    assert "--device /dev/nvidiactl" in run_line and "-p 127.0.0.1:30000:30000" in run_line
    assert "host driver version (580.159.04)" in out


def test_lxc_config_command_exit_codes(tmp_path, capsys):
    root = host_root(tmp_path, "no-gpu-this-machine")
    assert main(["proxmox", "lxc-config", "--ctid", "101", "--host-root", str(root)]) == 1
    assert "no NVIDIA device" in capsys.readouterr().err
    assert main(["proxmox", "lxc-config", "--ctid", "42", "--host-root", str(root)]) == 2
    with pytest.raises(SystemExit) as missing:
        main(["proxmox", "lxc-config"])
    assert missing.value.code == 2
