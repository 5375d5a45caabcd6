"""`infermatrix doctor` reading the machine's real engine (the tests on recorded host outputs are
tests/unit/host/test_doctor.py)."""

from __future__ import annotations

import json

import pytest

from infermatrix.cli import main
from infermatrix.host import doctor
from tests.unit.host.test_doctor import HOST


def docker_cli_info() -> dict:
    """`docker info` through the CLI: the reading doctor's (SDK) answer is checked against."""
    import subprocess

    from infermatrix.engine import docker as engine

    done = subprocess.run([engine.docker_cli(), "info", "--format", "{{json .}}"],
                          capture_output=True, text=True, timeout=60, check=True)
    info = json.loads(done.stdout)
    return {"storage_driver": info["Driver"], "runtimes": sorted(info["Runtimes"]),
            "default_runtime": info["DefaultRuntime"], "cgroup_version": info["CgroupVersion"],
            "server_version": info["ServerVersion"],
            "cdi_spec_dirs": info.get("CDISpecDirs") or []}


GPU_KEYS = ("gpu_access", "gpu_access_error")


def without_gpu_access(info: dict) -> dict:
    return {k: v for k, v in info.items() if k not in GPU_KEYS}


@pytest.mark.docker
def test_docker_reading_of_the_real_engine(docker_available):
    from infermatrix.engine import docker as engine

    expected = docker_cli_info()
    read = engine.Engine().host_info()
    assert without_gpu_access(read) == expected
    assert without_gpu_access(doctor.read_docker_info()) == expected
    assert "runc" in expected["runtimes"] and expected["storage_driver"]
    # this machine's engine (no nvidia runtime, no CDI): GPUs in containers, a clear no
    if "nvidia" not in expected["runtimes"] and not expected["cdi_spec_dirs"]:
        assert read["gpu_access"] is None
        assert "cannot give a container a GPU" in read["gpu_access_error"]
        assert "nvidia-container-toolkit" in read["gpu_access_error"]


@pytest.mark.docker
def test_doctor_command_reads_the_real_engine(docker_available, capsys):
    code = main(["doctor", "--nvidia-smi-csv", str(HOST / "gb10-sample" / "nvidia-smi.csv"),
                 "--host-root", str(HOST / "lxc-guest-sample"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["host"]["docker_error"] is None
    assert without_gpu_access(out["host"]["docker"]) == docker_cli_info()
    facts = doctor.gather(doctor.HostReaders(root=HOST / "no-such-root",
                                             nvidia_smi=lambda: (None, doctor.NO_DRIVER_HINT)))
    line = next(ln for ln in doctor.report_lines(facts, []) if ln.startswith("docker:"))
    assert facts.docker["server_version"] in line and facts.docker["storage_driver"] in line
