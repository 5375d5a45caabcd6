"""GPUs in containers, or a clear no (model/gpuaccess.py, issue 30)."""

from __future__ import annotations

import uuid

import pytest

from infermatrix.model import gpuaccess
from infermatrix.model.gpuaccess import (CDI_ALL_GPUS, GpuAccess, GpuSetting, GpuUnavailable,
                                         HostGpu, choose)

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
    assert "\n" not in caught.value.message and caught.value.fix  # one line, then the fix line
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
        claiming.run_container(built_base, ["true"], gpus=True, labels=mark)
    message = str(caught.value)
    assert "\n" not in caught.value.message
    assert "refused the GPU request" in message and "could not select device driver" in message
    assert "nvidia-ctk" in message
    left = claiming.sdk().containers.list(all=True, sparse=True,
                                          filters={"label": "io.infermatrix.test=" + mark[
                                              "io.infermatrix.test"]})
    assert not left, "the container the refused start had created was left behind"


# ---- the device nodes (no NVIDIA runtime, no CDI: a Proxmox LXC guest, the H200 VM) ---------

# `ldconfig -p` as an Ubuntu 24.04 host with driver 580 prints it (the i386 copies included)
LDCONFIG = """1523 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-nvvm.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-nvvm.so.4
\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6) => /lib/i386-linux-gnu/libnvidia-ml.so.1
\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so.1 (libc6) => /lib/i386-linux-gnu/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so
\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
Cache generated by: ldconfig (GNU libc) stable release version 2.39
"""
DEV = ["null", "nvidia0", "nvidia1", "nvidia10", "nvidia-caps", "nvidia-modeset", "nvidia-uvm",
       "nvidia-uvm-tools", "nvidiactl", "vda"]


def real(path: str) -> str:  # the loader names symlinks; the mounts take their targets
    return {"/lib/x86_64-linux-gnu/libcuda.so.1": "/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
            "/lib/x86_64-linux-gnu/libcuda.so": "/lib/x86_64-linux-gnu/libcuda.so.580.159.04"
            }.get(path, path)


def host_gpu(dev=DEV, ldconfig=LDCONFIG, smi="/usr/bin/nvidia-smi") -> HostGpu:
    spec = gpuaccess.devices_spec()
    devices, missing = gpuaccess.device_nodes(dev, spec)
    loader = gpuaccess.parse_ldconfig(ldconfig, "x86_64")
    files, missing_files = gpuaccess.driver_files(loader, {"nvidia-smi": smi}, spec, real)
    return HostGpu(tuple(devices), tuple(files), spec["mount_dir"], tuple(missing + missing_files))


def test_the_loader_cache_is_read_for_this_machines_abi_only():
    loader = gpuaccess.parse_ldconfig(LDCONFIG, "x86_64")
    assert loader["libcuda.so.1"] == "/lib/x86_64-linux-gnu/libcuda.so.1"  # not the i386 one
    assert loader["libnvidia-ml.so.1"].startswith("/lib/x86_64-linux-gnu/")
    assert "libc.so.6" in loader  # an "OS ABI" entry parses too
    assert gpuaccess.parse_ldconfig(LDCONFIG, "aarch64") == {}


def test_device_nodes_are_every_gpu_in_order_then_control_and_uvm():
    devices, missing = gpuaccess.device_nodes(DEV, gpuaccess.devices_spec())
    assert devices == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia10", "/dev/nvidiactl",
                       "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    assert missing == []
    _, missing = gpuaccess.device_nodes(["nvidia0", "nvidiactl"], gpuaccess.devices_spec())
    assert missing == ["/dev/nvidia-uvm"]
    _, missing = gpuaccess.device_nodes(["nvidiactl", "nvidia-uvm"], gpuaccess.devices_spec())
    assert missing == ["/dev/nvidia[0-9]*"]


def test_driver_files_go_in_under_soname_and_link_name_read_only_targets():
    files = dict((target, source) for source, target in host_gpu().files)
    lib = "/usr/local/nvidia/lib64"
    assert files[f"{lib}/libcuda.so.1"] == "/lib/x86_64-linux-gnu/libcuda.so.580.159.04"
    assert files[f"{lib}/libcuda.so"] == files[f"{lib}/libcuda.so.1"]  # Triton's -lcuda
    assert f"{lib}/libnvidia-ml.so.1" in files and f"{lib}/libnvidia-ptxjitcompiler.so.1" in files
    assert files["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
    assert "libcudadebugger.so" not in " ".join(files)  # optional and absent: left out


def test_an_engine_without_runtime_or_cdi_passes_this_hosts_device_nodes():
    access = choose(DEBIAN_20, "local", host=host_gpu())
    assert access.kind == "devices" and "no nvidia runtime or CDI spec" in access.detail
    cli = access.cli
    assert cli[:2] == ["--device", "/dev/nvidia0"] and "--pid=host" not in cli
    assert "-v" in cli and any(f.endswith("/usr/local/nvidia/lib64/libcuda.so.1:ro") for f in cli)
    assert cli[-1] == "LD_LIBRARY_PATH=/usr/local/nvidia/lib64:$LD_LIBRARY_PATH"
    # the image's own library path is kept behind the driver's
    assert access.environment({"LD_LIBRARY_PATH": "/opt/venv/lib"}) == \
        {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/opt/venv/lib"}
    assert access.environment({}) == {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}
    # the runtime wins where it is there; pid_host is the declaration's
    assert choose(TOOLKIT, "gpu", host=host_gpu()).kind == "runtime"
    pid = choose(DEBIAN_20, "local", GpuSetting("devices", pid_host=True), host_gpu())
    assert pid.cli[0] == "--pid=host" and pid.pid_host


@pytest.mark.parametrize("setting, host, words", [
    (GpuSetting("devices"), None, "does not run on this host"),
    (GpuSetting("devices"), "no-libcuda", "lacks libcuda.so"),
    (GpuSetting("devices"), "no-gpu", "lacks /dev/nvidia[0-9]*"),
    (GpuSetting("runtime"), "full", "smoke.gpu_access.mode is runtime"),
    (GpuSetting("cdi"), "full", "smoke.gpu_access.mode is cdi"),
    (GpuSetting("gpus"), "full", "expected one of auto, runtime, cdi, devices"),
])
def test_a_declared_mode_the_engine_or_host_cannot_serve_is_one_line(setting, host, words):
    hosts = {None: None, "full": host_gpu(),
             "no-libcuda": host_gpu(ldconfig=LDCONFIG.replace("libcuda.so", "libfoo.so")),
             "no-gpu": host_gpu(dev=["null", "nvidiactl", "nvidia-uvm"])}
    with pytest.raises(GpuUnavailable) as caught:
        choose(DEBIAN_20, "lxc-guest (unix:///var/run/docker.sock)", setting, hosts[host])
    message = str(caught.value)
    assert words in message and "\n" not in caught.value.message
    assert setting.mode == "gpus" or "lxc-guest" in message


def test_auto_without_any_way_names_the_device_node_shortfall_too():
    with pytest.raises(GpuUnavailable, match=r"lacks /dev/nvidia\[0-9\]\*, /dev/nvidiactl, "
                       r"/dev/nvidia-uvm\n  fix: .*devices"):
        choose(DEBIAN_20, "local", host=host_gpu(dev=["null"]))


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
