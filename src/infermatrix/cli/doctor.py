"""`infermatrix doctor` (which cells of images.lock fit this host) and
`infermatrix proxmox lxc-config` (the LXC lines that pass the NVIDIA GPUs to a container)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..host import doctor, proxmox
from ..errors import UsageError
from ..imageslock import IMAGES_LOCK_NAME, read_images_lock
from ..consumer.pull import docker_run_line


def _host_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lock", metavar="PATH", type=Path, default=Path(IMAGES_LOCK_NAME),
                        help=f"the images.lock to check (default: ./{IMAGES_LOCK_NAME})")
    parser.add_argument("--nvidia-smi-csv", metavar="FILE", type=Path,
                        help="read this recorded `nvidia-smi --query-gpu=index,name,compute_cap,"
                        "driver_version --format=csv` output instead of running nvidia-smi")
    parser.add_argument("--host-root", metavar="DIR", type=Path, default=Path("/"),
                        help="read proc/, sys/, run/ and dev/ under DIR (a copy of another "
                        "host's files); default /")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="check this host and say which published cells fit",
                            description="Read the GPU (nvidia-smi), Docker's storage driver and "
                            "runtimes, LXC, the cgroup memory limit; say which cells of "
                            "images.lock can run here and why the others cannot.")
    _host_options(parser)
    parser.add_argument("--no-docker", action="store_true", help="do not ask the Docker engine")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("--cell", action="append", default=[], metavar="SELECTOR",
                        help="the cells you mean to run (fnmatch); exit 1 when none of them "
                        "fits this host (driver below the image's floor, arch, ...)")
    parser.set_defaults(func=run_doctor)

    proxmox_parser = sub.add_parser("proxmox", help="Proxmox helpers (run on the Proxmox host)")
    proxmox_sub = proxmox_parser.add_subparsers(dest="proxmox_command", metavar="COMMAND")
    proxmox_sub.required = True
    lxc = proxmox_sub.add_parser(
        "lxc-config", help="print /etc/pve/lxc/<ctid>.conf lines for the NVIDIA GPUs",
        description="Print the lines that pass this host's NVIDIA devices to an LXC container "
        "(majors from /proc/devices), the container toolkit setting for unprivileged "
        "containers, the driver-match warning and the pinned `docker run` line.")
    lxc.add_argument("--ctid", type=int, required=True, help="the container id (100 and up)")
    _host_options(lxc)
    lxc.add_argument("--cell", metavar="SELECTOR",
                     help="the images.lock cell for the pinned docker run line")
    lxc.add_argument("--model-dir", default="/srv/models/model", metavar="DIR",
                     help="model directory inside the container, mounted read-only")
    lxc.add_argument("--cgroup-v1", action="store_true",
                     help="the host uses cgroup v1 (Proxmox 6 and older)")
    lxc.set_defaults(func=run_lxc_config)


def _readers(args: argparse.Namespace, docker: bool = True) -> doctor.HostReaders:
    readers = doctor.HostReaders(root=args.host_root)
    if args.nvidia_smi_csv is not None:
        try:
            recorded = args.nvidia_smi_csv.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--nvidia-smi-csv: {exc}") from None
        readers.nvidia_smi = lambda: (0, recorded)
    if not docker:
        def no_docker() -> dict:
            raise UsageError("not asked (--no-docker)")
        readers.docker_info = no_docker
    return readers


def _lock(path: Path) -> dict:
    return read_images_lock(path) if path.is_file() else {"images": {}}


def run_doctor(args: argparse.Namespace) -> int:
    facts = doctor.gather(_readers(args, docker=not args.no_docker))
    cell_fits = doctor.fits(_lock(args.lock), facts)
    if args.json:
        print(json.dumps({"host": facts.as_dict(), "warnings": doctor.warnings(facts),
                          "cells": [f.as_dict() for f in cell_fits]}, indent=2, sort_keys=True))
    else:
        if not args.lock.is_file():
            print(f"images.lock: {args.lock} not found (pass --lock PATH)")
        print("\n".join(doctor.report_lines(facts, cell_fits)))
    if args.cell:
        from ..model.selectors import Selection

        wanted = [f for f in cell_fits if Selection(args.cell, [])(f.cell)]
        if not wanted:
            raise UsageError(f"--cell {' '.join(args.cell)} matches no cell of {args.lock}")
        return 0 if any(f.fits for f in wanted) else 1
    return 0


def run_lxc_config(args: argparse.Namespace) -> int:
    proxmox.check_ctid(args.ctid)
    readers = _readers(args, docker=False)
    proc_devices = readers.read("proc/devices")
    if proc_devices is None:
        raise UsageError(f"cannot read {args.host_root / 'proc/devices'}")
    facts = doctor.gather(readers)
    nodes, has_caps = proxmox.nvidia_nodes(args.host_root / "dev")
    run_line = None
    if args.cell:
        if not args.lock.is_file():
            raise UsageError(f"--cell needs images.lock: {args.lock} not found (pass --lock)")
        entry = proxmox.choose_entry(read_images_lock(args.lock), args.cell)
        if entry is not None:
            run_line = docker_run_line(entry, args.model_dir,
                                       devices=proxmox.device_flags(nodes))
    driver = facts.gpus[0].driver if facts.gpus else None
    print("\n".join(proxmox.lxc_config_lines(args.ctid, proc_devices, nodes, has_caps, driver,
                                             run_line, cgroup_v1=args.cgroup_v1)))
    return 0
