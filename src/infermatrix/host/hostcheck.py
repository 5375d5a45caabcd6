"""What `infermatrix pull` checks on the host before it pulls a cell (images of many GB).

- the NVIDIA driver against the image's driver floor: its driver-floor label (read from the
  image config in the registry, before the pull), else images.lock's `min_driver`
  (data/drivers.yaml);
- the GPU's compute capability against the cell's arch (coverage rules, as `doctor`);
- inside an LXC guest, the device nodes a GPU container needs; what is missing comes with the
  lines for the Proxmox host from `proxmox lxc-config`.

The readings are doctor's (`HostReaders`), so a test feeds a recorded host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import doctor, proxmox
from ..errors import StageFailure
from ..model.cell import CPU

# The label the build writes (knowledge issue: io.infermatrix.driver.floor), and the name first
# proposed for it; the first one present wins.
DRIVER_FLOOR_LABELS = ("io.infermatrix.driver.floor", "org.infermatrix.driver-floor")
# The nodes a CUDA container opens: a GPU (nvidia0...), the control node, unified memory.
LXC_REQUIRED_NODES = ("nvidiactl", "nvidia-uvm")


@dataclass
class HostCheck:
    problems: list[str] = field(default_factory=list)  # empty: the host can run the cell
    advice: list[str] = field(default_factory=list)  # lines to print after the problems

    @property
    def ok(self) -> bool:
        return not self.problems


def image_driver_floor(entry: dict[str, Any], labels: dict[str, str] | None) -> str | None:
    """The minimum driver: the image's own label when it has one, else images.lock's."""
    labels = labels or {}
    found = next((labels[name] for name in DRIVER_FLOOR_LABELS if labels.get(name)), None)
    return found or entry.get("min_driver")


def missing_lxc_nodes(readers: doctor.HostReaders) -> list[str]:
    nodes, _ = proxmox.nvidia_nodes(readers.root / "dev")
    missing = [f"/dev/{name}" for name in LXC_REQUIRED_NODES if name not in nodes]
    if not any(name[6:].isdigit() for name in nodes):
        missing.insert(0, "/dev/nvidia0 (or another /dev/nvidiaN)")
    return missing


def proxmox_lines(readers: doctor.HostReaders, ctid: int | None, cell: str,
                  driver: str | None) -> list[str]:
    """`proxmox lxc-config` lines for the Proxmox host. The guest shares the host's kernel,
    so its /proc/devices has the host's majors; the node names are the usual ones."""
    command = f"infermatrix proxmox lxc-config --ctid {ctid or '<CTID>'} --cell {cell}"
    try:
        lines = proxmox.lxc_config_lines(ctid or 100, readers.read("proc/devices") or "",
                                         [], False, driver)
    except StageFailure as exc:
        return [f"# on the Proxmox host: {exc}", f"# then run there: {command}"]
    if ctid is None:
        lines = [line.replace("/etc/pve/lxc/100.conf", "/etc/pve/lxc/<CTID>.conf")
                 .replace("container 100", "this container") for line in lines]
    return [f"# on the Proxmox host (or run there: {command}):"] + lines


def check_host(entry: dict[str, Any], labels: dict[str, str] | None,
               readers: doctor.HostReaders | None = None, ctid: int | None = None) -> HostCheck:
    """Whether this host can run the cell's image; a CPU cell needs nothing."""
    result = HostCheck()
    if entry.get("arch") == CPU:
        return result
    readers = readers or doctor.HostReaders()
    facts = doctor.gather(readers)
    floor = image_driver_floor(entry, labels)
    fit = doctor.cell_fit({**entry, "min_driver": floor}, facts)
    if not fit.fits:
        result.problems += fit.reasons
    if facts.lxc:
        missing = missing_lxc_nodes(readers)
        if missing:
            result.problems.append(f"inside an LXC guest ({facts.lxc}) without the GPU device "
                                   f"nodes: missing {', '.join(missing)}")
            driver = facts.gpus[0].driver if facts.gpus else None
            result.advice += proxmox_lines(readers, ctid, entry["cell"], driver)
    return result
