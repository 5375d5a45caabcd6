"""How a Docker engine hands NVIDIA GPUs to a container, read from its own `docker info`
(issue 30). Pure: the caller fetches the info.

Two ways exist, and the engine says which it has:
- the NVIDIA runtime (nvidia-container-toolkit's `nvidia-ctk runtime configure`, or the older
  nvidia-docker2): `--gpus all`, a DeviceRequest with the `gpu` capability;
- CDI (Docker >= 25 reads Container Device Interface specs from `CDISpecDirs`;
  `nvidia-ctk cdi generate` writes one): `--device nvidia.com/gpu=all`, a DeviceRequest of
  driver `cdi`. Docker >= 28.2 lists the devices its specs define (`DiscoveredDevices`).
An engine with neither answers a GPU request with "could not select device driver": that is
turned into one line naming the engine and both fixes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

CDI_ALL_GPUS = "nvidia.com/gpu=all"
CDI_MIN_MAJOR = 25  # Docker 25.0 added CDI device requests (--device vendor/class=name)

FIX = ("install nvidia-container-toolkit on the engine's host and run "
       "`nvidia-ctk runtime configure --runtime=docker`, or (Docker >= 25) write a CDI spec "
       "with `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`; then restart dockerd")


@dataclass(frozen=True)
class GpuAccess:
    kind: str  # "runtime" (DeviceRequest, capability gpu) or "cdi" (DeviceRequest, driver cdi)
    detail: str  # what in the engine's info chose it

    @property
    def cli(self) -> list[str]:
        """The `docker run` flags that make the same request (logged for re-running)."""
        return ["--gpus", "all"] if self.kind == "runtime" else ["--device", CDI_ALL_GPUS]


class GpuUnavailable(Exception):
    """The engine has no way to hand a GPU to a container."""


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


def choose(info: Mapping[str, Any], engine: str) -> GpuAccess:
    """The engine's way to GPUs; GpuUnavailable (one line: the engine, what it has, the fix)."""
    runtimes = set((info.get("Runtimes") or {}).keys())
    if "nvidia" in runtimes or info.get("DefaultRuntime") == "nvidia":
        return GpuAccess("runtime", "the engine registers the nvidia runtime")
    spec_dirs = info.get("CDISpecDirs") or []
    if server_major(info) >= CDI_MIN_MAJOR and spec_dirs:
        found = cdi_gpus(info)
        if found is None:
            return GpuAccess("cdi", f"CDI spec dirs {', '.join(spec_dirs)} (devices not listed "
                             f"by Docker {info.get('ServerVersion')})")
        if found:
            return GpuAccess("cdi", f"CDI devices {', '.join(sorted(found))}")
        raise GpuUnavailable(f"engine {engine} (Docker {info.get('ServerVersion')}) reads CDI "
                             f"specs from {', '.join(spec_dirs)} but none defines an NVIDIA GPU"
                             f" and it has no nvidia runtime; fix: {FIX}")
    has = f"runtimes {', '.join(sorted(runtimes)) or 'none'}"
    cdi = "no CDI (Docker < 25)" if server_major(info) < CDI_MIN_MAJOR else "no CDI spec dirs"
    raise GpuUnavailable(f"engine {engine} (Docker {info.get('ServerVersion')}) cannot give a "
                         f"container a GPU: {has}, {cdi}; fix: {FIX}")


def refusal(message: str) -> bool:
    """The daemon's own answer to a GPU request it cannot serve."""
    return "could not select device driver" in message or "unresolvable CDI devices" in message
