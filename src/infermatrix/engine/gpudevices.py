"""This host's NVIDIA device nodes and driver files, for the `devices` way of handing GPUs to a
container (model/gpuaccess.py, data/gpu_devices.yaml): /dev is listed, the driver libraries are
found through the dynamic loader's cache (`ldconfig -p`, logged) and the binaries on PATH."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

from .. import proc
from ..model import gpuaccess
from ..model.gpuaccess import HostGpu

LDCONFIG = ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig")


def loader_cache() -> str:
    """`ldconfig -p` output ("" when there is no ldconfig: then no library is found)."""
    for candidate in LDCONFIG:
        found = shutil.which(candidate)
        if found:
            done = proc.run([found, "-p"], check=False, tail_lines=1_000_000)
            return done.output if done.returncode == 0 else ""
    return ""


def driver_version(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    try:
        return path.read_text(encoding="utf-8").splitlines()[0].strip()
    except (OSError, IndexError):
        return None


def scan(dev: Path = Path("/dev")) -> HostGpu:
    """What this host has; HostGpu.complete says whether a container can be given its GPUs."""
    spec = gpuaccess.devices_spec()
    try:
        names = sorted(p.name for p in dev.iterdir())
    except OSError:
        names = []
    devices, missing_nodes = gpuaccess.device_nodes(names, spec)
    devices = [str(dev / Path(d).name) for d in devices]
    if f"/dev/{spec['devices']['per_gpu']}" in missing_nodes:  # no GPU: no need to ask the loader
        return HostGpu((), (), spec["mount_dir"], tuple(missing_nodes), driver_version())
    loader = gpuaccess.parse_ldconfig(loader_cache(), platform.machine())
    binaries = {name: shutil.which(name) for name in spec["binaries"]}
    files, missing_files = gpuaccess.driver_files(loader, binaries, spec, os.path.realpath)
    return HostGpu(tuple(devices), tuple(files), spec["mount_dir"],
                   tuple(missing_nodes + missing_files), driver_version())
