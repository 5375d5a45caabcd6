"""`infermatrix proxmox lxc-config`: the lines that give a Proxmox LXC container the host's
NVIDIA GPUs so Docker inside it can run a pinned image.

Run on the Proxmox host. Device majors come from /proc/devices: nvidia-uvm's (and
nvidia-caps') major is dynamic, so a hard-coded 511 breaks on the next boot or driver
(nvidia-container-toolkit#1934); /dev/nvidia-uvm only appears after its first use. Inside an
unprivileged container libnvidia-container cannot set device cgroups ("bpf_prog_query(
BPF_CGROUP_DEVICE) failed: operation not permitted", libnvidia-container#154): the toolkit
needs `no-cgroups = true` and the devices passed explicitly with `--device`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import StageFailure, UsageError

# Character devices a CUDA container needs: the GPUs and control node (major 195, listed as
# `nvidia` / `nvidiactl`, `nvidia-frontend` on older drivers), unified memory, MIG capabilities.
NEEDED_DEVICES = ("nvidia", "nvidiactl", "nvidia-frontend", "nvidia-uvm", "nvidia-caps")
NODE_PATTERN = re.compile(r"nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)")
DEFAULT_NODES = ["nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character devices of /proc/devices: name -> major."""
    devices: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("devices:"):
            in_char = stripped.startswith("Character")
            continue
        parts = stripped.split(None, 1)
        if in_char and len(parts) == 2 and parts[0].isdigit():
            devices.setdefault(parts[1], int(parts[0]))
    return devices


def nvidia_majors(devices: dict[str, int]) -> dict[int, list[str]]:
    """major -> the NVIDIA device names that use it, for the devices a container needs."""
    majors: dict[int, list[str]] = {}
    for name in NEEDED_DEVICES:
        if name in devices:
            majors.setdefault(devices[name], []).append(name)
    return dict(sorted(majors.items()))


def nvidia_nodes(dev_dir: Path) -> tuple[list[str], bool]:
    """Device nodes under /dev to bind (names), and whether /dev/nvidia-caps exists."""
    if not dev_dir.is_dir():
        return [], False
    names = sorted(p.name for p in dev_dir.iterdir() if NODE_PATTERN.fullmatch(p.name))
    gpus = sorted((n for n in names if n[6:].isdigit()), key=lambda n: int(n[6:]))
    others = [n for n in names if not n[6:].isdigit()]
    return gpus + others, (dev_dir / "nvidia-caps").is_dir()


def check_ctid(ctid: int) -> None:
    if ctid < 100:
        raise UsageError(f"--ctid {ctid}: Proxmox container ids start at 100")


# What to do inside the container, after its .conf lines ({driver}: the host's driver version).
INSIDE_THE_CONTAINER = [
    "",
    "# Inside the container, /etc/nvidia-container-runtime/config.toml: an unprivileged",
    "# container cannot manage device cgroups (bpf_prog_query(BPF_CGROUP_DEVICE) failed:",
    "# operation not permitted, libnvidia-container#154), so pass the devices explicitly:",
    "[nvidia-container-cli]",
    "no-cgroups = true",
    "# (or: nvidia-ctk config --set nvidia-container-cli.no-cgroups=true --in-place)",
    "",
    "# WARNING: the container's NVIDIA userspace libraries must be exactly the host driver "
    "version ({driver}); a mismatch fails with \"Failed to initialize NVML: Driver/library "
    "version mismatch\". Install the same driver inside the container without its kernel "
    "module (--no-kernel-module), and upgrade both together.",
    "# Storage: Docker on ZFS before 2.2 falls back to vfs (full copies per layer); give "
    "/var/lib/docker 150-200 GB on ZFS >= 2.2 or ext4/xfs.",
]


def lxc_config_lines(ctid: int, proc_devices: str, nodes: list[str], has_caps: bool,
                     driver: str | None, run_line: str | None = None,
                     cgroup_v1: bool = False) -> list[str]:
    """The text to print: /etc/pve/lxc/<ctid>.conf lines, then what to do inside the container.

    Raises StageFailure when /proc/devices shows no NVIDIA driver."""
    check_ctid(ctid)
    majors = nvidia_majors(parse_proc_devices(proc_devices))
    if not any("nvidia" in names or "nvidia-frontend" in names or "nvidiactl" in names
               for names in majors.values()):
        raise StageFailure("/proc/devices lists no NVIDIA device: load the NVIDIA driver on the "
                           "Proxmox host first (nvidia-smi must work there)")
    allow_key = "lxc.cgroup.devices.allow" if cgroup_v1 else "lxc.cgroup2.devices.allow"
    lines = [f"# /etc/pve/lxc/{ctid}.conf: NVIDIA GPUs for container {ctid} "
             "(majors read from this host's /proc/devices)"]
    for major in majors:
        lines.append(f"{allow_key}: c {major}:* rwm")
    notes = []
    if not any("nvidia-uvm" in names for names in majors.values()):
        notes.append("# WARNING: nvidia-uvm is not loaded yet, so its (dynamic) major is "
                     "unknown: run `nvidia-modprobe -u -c=0` (or any CUDA program) on the host, "
                     "then run this command again")
    if not nodes:
        notes.append("# WARNING: no /dev/nvidia* nodes found; the lines below use the usual "
                     "names: check `ls -l /dev/nvidia*` on the host")
        nodes = DEFAULT_NODES
    lines += notes
    for node in nodes:
        lines.append(f"lxc.mount.entry: /dev/{node} dev/{node} none bind,optional,create=file")
    if has_caps:
        lines.append("lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none "
                     "bind,optional,create=dir")
    lines.append("# Docker inside the container (unprivileged): nesting and keyctl")
    lines.append("features: keyctl=1,nesting=1")
    lines += [line.format(driver=driver or "see nvidia-smi on the host")
              for line in INSIDE_THE_CONTAINER]
    if run_line:
        lines += ["", "# The pinned image (pulled by digest), devices passed explicitly:",
                  run_line]
    else:
        lines += ["", "# Pass --cell (and --lock) to print the pinned `docker run` line."]
    return lines


DEPLOYMENT_SUPPORT_NODES = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]


def deployment_nodes(gpus: list[int]) -> list[str]:
    """The /dev nodes GPUs N.. need (assumes /dev/nvidiaN is GPU index N, the usual case)."""
    return [f"nvidia{g}" for g in gpus] + DEPLOYMENT_SUPPORT_NODES


def deployment_lines(proc_devices: str, gpus: list[int], driver: str | None) -> list[str]:
    """lxc_config_lines for the GPUs of an `infermatrix deploy` (container id left as <CTID>);
    when this host's /proc/devices shows no NVIDIA driver, the command to run on the Proxmox
    host instead."""
    nodes = deployment_nodes(gpus)
    command = "infermatrix proxmox lxc-config --ctid <CTID>"
    try:
        lines = lxc_config_lines(100, proc_devices, nodes, False, driver)
    except StageFailure as exc:
        return [f"# {exc}", f"# then run on the Proxmox host: {command}"]
    lines = [line.replace("/etc/pve/lxc/100.conf", "/etc/pve/lxc/<CTID>.conf")
             .replace("container 100", "the container") for line in lines
             if not line.startswith("# Pass --cell")]
    return [*lines, "", ("# Then, inside the container, in the deployment directory: "
                         "docker compose up -d (or docker-compose up -d)")]


def device_flags(nodes: list[str]) -> list[str]:
    """`--device` paths for docker run inside the container (no-cgroups needs them)."""
    return [f"/dev/{n}" for n in (nodes or DEFAULT_NODES) if n != "nvidia-modeset"]


def choose_entry(lock: dict[str, Any], selector: str | None) -> dict[str, Any] | None:
    from ..imageslock import select_entries

    if not selector:
        return None
    chosen = select_entries(lock, selector)
    if len(chosen) > 1:
        raise UsageError(f"--cell {selector!r} matches {len(chosen)} cells "
                         f"({', '.join(e['cell'] for e in chosen)}): name one")
    return chosen[0]
