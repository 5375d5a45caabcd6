"""GPU requests to the machine's real engine (no GPU runtime here): a one-line refusal, a
refused start that leaves no container, device nodes reaching a real container (the pure
rules of model/gpuaccess.py: tests/unit/model/test_gpuaccess.py; issue 30)."""

from __future__ import annotations

import uuid

import pytest

from infermatrix.model import gpuaccess
from infermatrix.model.gpuaccess import GpuAccess, GpuSetting, HostGpu


@pytest.mark.docker
def test_the_real_engine_without_a_gpu_runtime_refuses_in_one_line(docker_available,
                                                                    built_base):
    """This machine's engine (Debian's dockerd, no nvidia runtime, no CDI): a GPU request is
    refused before any container exists, in one line naming the engine and the fix."""
    from infermatrix.engine import docker as engine

    machine = engine.Engine()
    with pytest.raises(engine.EngineError) as caught:
        machine.run_container(engine.ContainerSpec(built_base, ["true"], gpus=True))
    message = str(caught.value)
    assert "\n" not in caught.value.message and "Traceback" not in message
    assert "cannot give a container a GPU" in message and machine.label() in message
    assert "nvidia-container-toolkit" in message


@pytest.mark.docker
def test_a_gpu_request_the_daemon_cannot_serve_is_translated(docker_available, built_base):
    """FAKE: an engine that claims the nvidia runtime (its info is overridden), so the request
    reaches the real daemon, whose refusal ("could not select device driver") becomes one line
    with the fix, not an SDK traceback."""
    from infermatrix.engine import docker as engine

    claiming = engine.Engine()
    claiming._gpu_verdicts = {GpuSetting(): GpuAccess("runtime", "claimed by the test")}
    mark = {"io.infermatrix.test": uuid.uuid4().hex}
    with pytest.raises(engine.EngineError) as caught:
        claiming.run_container(engine.ContainerSpec(built_base, ["true"], gpus=True,
                                                    labels=mark))
    message = str(caught.value)
    assert "\n" not in caught.value.message
    assert "refused the GPU request" in message and "could not select device driver" in message
    assert "nvidia-ctk" in message
    left = claiming.sdk().containers.list(all=True, sparse=True,
                                          filters={"label": "io.infermatrix.test=" + mark[
                                              "io.infermatrix.test"]})
    assert not left, "the container the refused start had created was left behind"


@pytest.mark.docker
def test_the_device_node_request_reaches_a_real_container(docker_available, built_base,
                                                          tmp_path):
    """FAKE host GPU: this machine has no NVIDIA device, so a block device of this host stands
    in for the GPU's node and two files stand in for the driver (the real run: the H200,
    docs/h200-gpu-level-container.txt). The real engine gets the devices-mode request through
    the SDK: the node is in the container, the files are mounted read-only where the library
    path points, and the image's own environment is kept."""
    import os

    from infermatrix.engine import docker as engine

    node = next(d for d in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda")
                if os.path.exists(d))
    driver = tmp_path / "libcuda.so.580.1"
    driver.write_text("not a real driver\n")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    smi.chmod(0o755)
    lib = gpuaccess.devices_spec()["mount_dir"]
    fake = HostGpu((node,), ((str(driver), f"{lib}/libcuda.so.1"),
                             (str(smi), "/usr/bin/nvidia-smi")), lib)
    machine = engine.Engine()
    machine.__dict__["_host_gpu"] = fake
    script = (f"test -b {node} && cat {lib}/libcuda.so.1 && nvidia-smi && "
              f"echo LD=$LD_LIBRARY_PATH && (echo x > {lib}/libcuda.so.1) 2>/dev/null "
              "|| echo read-only")
    with machine.container(built_base, ["sh", "-c", script],
                           gpus=GpuSetting("devices")) as cid:
        assert machine.wait_container(cid, timeout=60) == 0
        out = machine.container_logs(cid)
    assert "not a real driver" in out and "GPU 0: stand-in" in out
    assert f"LD={lib}" in out and "read-only" in out
