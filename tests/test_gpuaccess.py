"""GPUs in containers, or a clear no (model/gpuaccess.py, issue 30)."""

from __future__ import annotations

import pytest

from infermatrix.model.gpuaccess import CDI_ALL_GPUS, GpuAccess, GpuUnavailable, choose

DEBIAN_20 = {"ServerVersion": "20.10.24+dfsg1", "DefaultRuntime": "runc", "CDISpecDirs": None,
             "Runtimes": {"runc": {"path": "runc"}, "io.containerd.runc.v2": {}}}
TOOLKIT = {**DEBIAN_20, "ServerVersion": "27.5.1",
           "Runtimes": {**DEBIAN_20["Runtimes"], "nvidia": {"path": "nvidia-container-runtime"}}}
CDI_28_2 = {"ServerVersion": "28.3.0", "Runtimes": {"runc": {}}, "DefaultRuntime": "runc",
            "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"],
            "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"},
                                  {"Source": "cdi", "ID": "nvidia.com/gpu=all"}]}


def test_the_nvidia_runtime_means_a_gpu_device_request():
    access = choose(TOOLKIT, "gpu-host")
    assert access.kind == "runtime" and access.cli == ["--gpus", "all"]


def test_cdi_devices_mean_a_cdi_request_by_name():
    access = choose(CDI_28_2, "spark")
    assert access.kind == "cdi" and access.cli == ["--device", CDI_ALL_GPUS]
    assert "nvidia.com/gpu=0" in access.detail
    # Docker 25-28.1 reads CDI specs but does not list their devices: tried by name
    older = {**CDI_28_2, "ServerVersion": "26.1.4"}
    older.pop("DiscoveredDevices")
    assert choose(older, "spark").kind == "cdi"


def test_cdi_specs_without_an_nvidia_gpu_are_a_clear_no():
    other = {**CDI_28_2, "DiscoveredDevices": [{"Source": "cdi", "ID": "vendor.com/fpga=0"}]}
    with pytest.raises(GpuUnavailable, match="none defines an NVIDIA GPU"):
        choose(other, "spark")


def test_an_engine_with_neither_says_which_engine_and_both_fixes():
    with pytest.raises(GpuUnavailable) as caught:
        choose(DEBIAN_20, "builder-a (ssh://root@gpu1)")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("engine builder-a (ssh://root@gpu1) (Docker 20.10.24+dfsg1)")
    assert "no CDI (Docker < 25)" in message
    assert "nvidia-ctk runtime configure" in message and "nvidia-ctk cdi generate" in message
    assert GpuAccess("runtime", "").cli == ["--gpus", "all"]


@pytest.mark.docker
def test_the_real_engine_without_a_gpu_runtime_refuses_in_one_line(docker_available,
                                                                    built_base):
    """This machine's engine (Debian's dockerd, no nvidia runtime, no CDI): a GPU request is
    refused before any container exists, in one line naming the engine and the fix."""
    from infermatrix.engine import docker as engine

    machine = engine.Engine()
    with pytest.raises(engine.EngineError) as caught:
        machine.run_container(built_base, ["true"], gpus=True)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert "cannot give a container a GPU" in message and machine.label() in message
    assert "nvidia-container-toolkit" in message


@pytest.mark.docker
def test_a_gpu_request_the_daemon_cannot_serve_is_translated(docker_available, built_base):
    """FAKE: an engine that claims the nvidia runtime (its info is overridden), so the request
    reaches the real daemon, whose refusal ("could not select device driver") becomes one line
    with the fix, not an SDK traceback."""
    from infermatrix.engine import docker as engine

    claiming = engine.Engine()
    claiming._gpu_access = GpuAccess("runtime", "claimed by the test")
    with pytest.raises(engine.EngineError) as caught:
        claiming.run_container(built_base, ["true"], gpus=True)
    message = str(caught.value)
    assert "\n" not in message
    assert "refused the GPU request" in message and "could not select device driver" in message
    assert "nvidia-ctk" in message
