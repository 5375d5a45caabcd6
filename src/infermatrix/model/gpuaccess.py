"""How a Docker engine hands NVIDIA GPUs to a container, read from its own `docker info`
(issue 30). Pure: the caller fetches the info.

Two ways exist, and the engine says which it has:
- the NVIDIA runtime (nvidia-container-toolkit's `nvidia-ctk runtime configure`, or the older
  nvidia-docker2): `--gpus all`, a DeviceRequest with the `gpu` capability;
- CDI (Docker >= 25 reads Container Device Interface specs from `CDISpecDirs`;
  `nvidia-ctk cdi generate` writes one): `--device nvidia.com/gpu=all`, a DeviceRequest of
  driver `cdi`. Docker >= 28.2 lists the devices its specs define (`DiscoveredDevices`).
- device nodes: the driver's /dev/nvidia* nodes and its user-space files (libcuda, NVML,
  nvidia-smi) bind-mounted read-only from the host (data/gpu_devices.yaml), which is what an
  unprivileged Proxmox LXC guest gets and what needs no NVIDIA software in the engine at all.
  It needs the engine on this host (the files are found here) and is chosen when neither of
  the others is there, or when `smoke.gpu_access.mode: devices` says so.
An engine with none answers a GPU request with "could not select device driver": that is
turned into one line naming the engine and the fixes.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..datafiles import DATA_DIR, read_data
from ..errors import GpuUnavailable

CDI_ALL_GPUS = "nvidia.com/gpu=all"
CDI_MIN_MAJOR = 25  # Docker 25.0 added CDI device requests (--device vendor/class=name)

DEVICES_SPEC = DATA_DIR / "gpu_devices.yaml"
MODES = ("auto", "runtime", "cdi", "devices")

FIX = ("install nvidia-container-toolkit on the engine's host and run "
       "`nvidia-ctk runtime configure --runtime=docker`, or (Docker >= 25) write a CDI spec "
       "with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`; then restart dockerd; "
       "or, for an engine on this host with /dev/nvidia* (a Proxmox LXC guest), pass the "
       "device nodes: smoke.gpu_access.mode: devices")


@dataclass(frozen=True)
class GpuSetting:
    """How GPUs are requested, as matrix.yaml's `smoke.gpu_access` declares it."""

    mode: str = "auto"  # one of MODES; auto: runtime, else CDI, else device nodes
    # Share the host's pid namespace: for a host where CUDA starts in a container only so (on the
    # H200 VM, CUDA failed with error 304 without it when the host's root was chroot'ed in a
    # container; with an image of its own it was not needed: docs/h200-gpu-level-container.txt).
    pid_host: bool = False


@dataclass(frozen=True)
class HostGpu:
    """This host's NVIDIA device nodes and driver files, as found (engine/gpudevices.py)."""

    devices: tuple[str, ...]  # /dev paths
    files: tuple[tuple[str, str], ...]  # (host file, path in the container), read-only
    library_dir: str  # where the libraries are mounted: first on LD_LIBRARY_PATH
    missing: tuple[str, ...] = ()  # required entries not found
    driver: str | None = None  # /proc/driver/nvidia/version's first line

    @property
    def complete(self) -> bool:
        return bool(self.devices) and not self.missing


@dataclass(frozen=True)
class GpuAccess:
    # "runtime" (DeviceRequest, capability gpu), "cdi" (DeviceRequest, driver cdi) or
    # "devices" (device nodes and read-only driver mounts: `host`)
    kind: str
    detail: str  # what in the engine's info (or the declaration) chose it
    host: HostGpu | None = None
    pid_host: bool = False

    @property
    def cli(self) -> list[str]:
        """The `docker run` flags that make the same request (logged for re-running)."""
        flags = ["--pid=host"] if self.pid_host else []
        if self.kind == "runtime":
            return [*flags, "--gpus", "all"]
        if self.kind == "cdi":
            return [*flags, "--device", CDI_ALL_GPUS]
        assert self.host is not None
        for device in self.host.devices:
            flags += ["--device", device]
        for source, target in self.host.files:
            flags += ["-v", f"{source}:{target}:ro"]
        return [*flags, "-e", f"LD_LIBRARY_PATH={self.host.library_dir}:$LD_LIBRARY_PATH"]

    def environment(self, image_env: Mapping[str, str]) -> dict[str, str]:
        """What the request adds to a container's environment, given the image's own."""
        if self.kind != "devices" or self.host is None:
            return {}
        inherited = image_env.get("LD_LIBRARY_PATH", "")
        return {"LD_LIBRARY_PATH": ":".join(p for p in (self.host.library_dir, inherited) if p)}


def server_major(info: Mapping[str, Any]) -> int:
    version = str(info.get("ServerVersion") or "0")
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def cdi_gpus(info: Mapping[str, Any]) -> list[str] | None:
    """NVIDIA GPU devices the engine's CDI specs define, or None when it does not say
    (Docker < 28.2 has no DiscoveredDevices)."""
    devices = info.get("DiscoveredDevices")
    if devices is None:
        return None
    return [str(d.get("ID")) for d in devices
            if d.get("Source") == "cdi" and str(d.get("ID", "")).startswith("nvidia.com/gpu=")]


def choose(info: Mapping[str, Any], engine: str, setting: GpuSetting = GpuSetting(),
           host: HostGpu | None = None) -> GpuAccess:
    """The engine's way to GPUs; GpuUnavailable (one line: the engine, what it has, the fix).
    `host`: this host's device nodes and driver files when the engine runs here, else None."""
    chosen = _chosen(info, engine, setting, host)
    return GpuAccess(chosen.kind, chosen.detail, chosen.host, setting.pid_host)


def _chosen(info: Mapping[str, Any], engine: str, setting: GpuSetting,
            host: HostGpu | None) -> GpuAccess:
    if setting.mode not in MODES:
        raise GpuUnavailable(f"smoke.gpu_access.mode {setting.mode!r}: expected one of "
                             f"{', '.join(MODES)}")
    runtimes = set((info.get("Runtimes") or {}).keys())
    declared = setting.mode != "auto"
    if setting.mode in ("auto", "runtime") and \
            ("nvidia" in runtimes or info.get("DefaultRuntime") == "nvidia"):
        return GpuAccess("runtime", "the engine registers the nvidia runtime")
    spec_dirs = info.get("CDISpecDirs") or []
    if setting.mode in ("auto", "cdi") and server_major(info) >= CDI_MIN_MAJOR and spec_dirs:
        found = cdi_gpus(info)
        if found is None:
            return GpuAccess("cdi", f"CDI spec dirs {', '.join(spec_dirs)} (devices not listed "
                             f"by Docker {info.get('ServerVersion')})")
        if found:
            return GpuAccess("cdi", f"CDI devices {', '.join(sorted(found))}")
        if setting.mode == "cdi" or host is None or not host.complete:
            raise GpuUnavailable(f"engine {engine} (Docker {info.get('ServerVersion')}) reads "
                                 f"CDI specs from {', '.join(spec_dirs)} but none defines an "
                                 "NVIDIA GPU and it has no nvidia runtime", fix=FIX)
    if setting.mode in ("auto", "devices") and host is not None and host.complete:
        why = "declared (smoke.gpu_access.mode: devices)" if declared else \
            "no nvidia runtime or CDI spec; the device nodes are on this host"
        return GpuAccess("devices", f"device nodes {', '.join(host.devices)} and "
                         f"{len(host.files)} driver files from this host: {why}", host)
    if setting.mode == "devices":
        raise GpuUnavailable(f"engine {engine}: smoke.gpu_access.mode is devices, but "
                             + devices_shortfall(host))
    has = f"runtimes {', '.join(sorted(runtimes)) or 'none'}"
    cdi = "no CDI (Docker < 25)" if server_major(info) < CDI_MIN_MAJOR else "no CDI spec dirs"
    if declared:
        raise GpuUnavailable(f"engine {engine} (Docker {info.get('ServerVersion')}): "
                             f"smoke.gpu_access.mode is {setting.mode}, but it has {has}, "
                             f"{cdi}", fix=FIX)
    nodes = "" if host is None else f", {devices_shortfall(host)}"
    raise GpuUnavailable(f"engine {engine} (Docker {info.get('ServerVersion')}) cannot give a "
                         f"container a GPU: {has}, {cdi}{nodes}", fix=FIX)


def devices_shortfall(host: HostGpu | None) -> str:
    """Why device nodes cannot be passed: not this host's engine, or what is missing here."""
    if host is None:
        return "the engine does not run on this host (its device nodes cannot be read here)"
    return f"this host lacks {', '.join(host.missing)}"


# --------------------------------------------------------------------------------------------
# Device nodes and driver files (pure: engine/gpudevices.py reads /dev and `ldconfig -p`)
# --------------------------------------------------------------------------------------------

def devices_spec() -> dict[str, Any]:
    """data/gpu_devices.yaml: device nodes, driver libraries and binaries, with the source."""
    return read_data(DEVICES_SPEC)


LDCONFIG_ABI = {"x86_64": "x86-64", "aarch64": "AArch64"}
_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


def parse_ldconfig(text: str, machine: str) -> dict[str, str]:
    """`ldconfig -p` lines of this machine's ABI: {soname: path} (the first one listed)."""
    abi = LDCONFIG_ABI.get(machine)
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _LDCONFIG_LINE.match(line)
        if not match:
            continue
        name, flags, path = match.groups()
        if abi and abi not in flags.split(","):
            continue  # another ABI (i386 copies beside the x86-64 ones)
        found.setdefault(name, path)
    return found


def device_nodes(dev_names: list[str], spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """/dev paths to pass, and the required nodes missing, from the names in /dev."""
    devices = spec["devices"]
    names = set(dev_names)
    per_gpu = sorted((n for n in names if fnmatch.fnmatch(n, devices["per_gpu"])
                      and n[len("nvidia"):].isdigit()), key=lambda n: int(n[len("nvidia"):]))
    chosen = per_gpu + [n for n in devices["required"] + devices["optional"] if n in names]
    missing = ([] if per_gpu else [f"/dev/{devices['per_gpu']}"]) + \
        [f"/dev/{n}" for n in devices["required"] if n not in names]
    return [f"/dev/{n}" for n in chosen], missing


def driver_files(loader: Mapping[str, str], binaries: Mapping[str, str | None],
                 spec: Mapping[str, Any], realpath: Callable[[str], str] = lambda p: p
                 ) -> tuple[list[tuple[str, str]], list[str]]:
    """(host file, container path) pairs for the driver's libraries and binaries, and the
    required ones missing. Each library goes in under its soname and its link name
    (libcuda.so: Triton links its launcher with -lcuda)."""
    library_dir = spec["mount_dir"]
    files: list[tuple[str, str]] = []
    missing: list[str] = []
    libraries = spec["libraries"]
    for stem in libraries["required"] + libraries["optional"]:
        sonames = sorted(n for n in loader if n.startswith(stem + ".") or n == stem)
        versioned = [n for n in sonames if n != stem]
        if not versioned:
            if stem in libraries["required"]:
                missing.append(stem)
            continue
        source = realpath(loader[versioned[0]])
        for name in dict.fromkeys([versioned[0], stem]):
            files.append((source, f"{library_dir}/{name}"))
    for name in spec["binaries"]:
        path = binaries.get(name)
        if path:
            files.append((realpath(path), f"/usr/bin/{name}"))
    return files, missing


def is_gpu_refusal(message: str) -> bool:
    """The daemon's own answer to a GPU request it cannot serve."""
    return "could not select device driver" in message or "unresolvable CDI devices" in message
