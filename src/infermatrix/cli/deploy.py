"""`infermatrix deploy`: write a Compose deployment (one server per GPU, or N CPU replicas) of
a published image, its Proxmox LXC lines and a README."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import StageFailure, UsageError
from ..host import proxmox
from ..consumer import deploy
from ..imageslock import IMAGES_LOCK_NAME, read_images_lock
from ..stages.publish import cell_from_labels
from ..model.spec import Launch
from ..stages import sign
from ..engine import registry as registries
from . import common_options, load_context
from .publish import verify_flags


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "deploy", help="write a Compose file: one server per GPU from a published image",
        description="Write OUT/compose.yaml (the images.lock image by digest, one service per "
        "GPU pinned by a device reservation and NVIDIA_VISIBLE_DEVICES, its own port, the "
        "cell's launch flags, shm, the model read-only, a health check), "
        "OUT/proxmox-lxc.conf and OUT/README.md. Start it with `docker compose up -d`.")
    parser.add_argument("cell", metavar="CELL", help="a cell id of images.lock")
    common_options(parser)
    parser.add_argument("--gpus", metavar="LIST",
                        help="GPU indices, one server each: 0-7, 0,2,5 or 0-3,6")
    parser.add_argument("--cpu-lane", type=int, metavar="N", default=None,
                        help="deploy N replicas of the CPU cell (no GPU)")
    parser.add_argument("--cpus", metavar="LIST", default=None,
                        help="the host CPUs the CPU replicas share out, each its own block "
                        "(Compose `cpuset`; default: the CPUs this command may run on)")
    parser.add_argument("--model-dir", required=True, metavar="DIR",
                        help="host directory with the model weights, mounted read-only")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="where to write (default: ./deploy/CELL)")
    parser.add_argument("--lock", type=Path, default=None, metavar="PATH",
                        help=f"the images.lock to read (default: {IMAGES_LOCK_NAME} beside "
                        "the matrix)")
    parser.add_argument("--base-port", type=int, default=None, metavar="PORT",
                        help="host port of the first server, the next ones count up "
                        "(default: the image's port, 8000)")
    parser.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                        help="host address the ports listen on (default 127.0.0.1; 0.0.0.0 "
                        "for every interface)")
    parser.add_argument("--lxc", action="store_true",
                        help="the deployment runs inside an unprivileged Proxmox LXC guest "
                        "(toolkit no-cgroups): also pass each GPU's /dev nodes as devices")
    parser.add_argument("--memory-from", type=Path, default=Path("/proc/meminfo"),
                        metavar="MEMINFO", help="where the host's available memory is read "
                        "for a unified-memory GPU (DGX Spark / GB10): run deploy on that host, "
                        "or give a copy of its /proc/meminfo (default: this host's)")
    verify_flags(parser)
    parser.set_defaults(func=run_deploy)


def run_deploy(args: argparse.Namespace) -> int:
    ctx = load_context(args, log=False)
    lock_path = args.lock or ctx.matrix.root / IMAGES_LOCK_NAME
    if not lock_path.is_file():
        raise UsageError(f"{lock_path} does not exist: run `infermatrix publish` first or pass "
                         "--lock PATH")
    entry = deploy.locked_entry(read_images_lock(lock_path), args.cell, str(lock_path))
    try:
        cell = cell_from_labels(entry.get("labels") or {})
    except StageFailure as exc:
        raise UsageError(f"{lock_path}: cell {args.cell}: {exc}", fix="publish it again") from None
    if cell.engine not in ctx.matrix.engines:
        raise UsageError(f"engine {cell.engine!r} of {cell.id} is not in {ctx.matrix.path}",
                         fix="pass --matrix PATH, the matrix the image was built from")
    gpus = deploy.parse_gpus(args.gpus) if args.gpus is not None else None
    model_dir = Path(args.model_dir).expanduser().absolute()
    if not model_dir.is_dir():
        print(f"warning: --model-dir {model_dir} is not a directory here; it must exist on "
              "the host that starts the deployment", file=sys.stderr)
    cpus = deploy.parse_cpus(args.cpus) if args.cpus is not None else None
    if cpus is not None and not args.cpu_lane:
        raise UsageError("--cpus shares CPUs out among CPU replicas: it needs --cpu-lane N")
    if args.lxc and not gpus:
        raise UsageError("--lxc passes GPU device nodes: it needs --gpus")
    verify = sign.verify_options(args.key, args.skip_verify, args.require_levels)
    if not verify.skip:  # the digest's signature and test results, in its registry
        sign.verify_signatures(entry, verify, registries.credentials_for(entry["repository"]))
    else:
        sign.verify_signatures(entry, verify, registries.RegistryCredentials())
    lxc_lines = proxmox.deployment_lines(_read(Path("/proc/devices")), gpus, None) \
        if gpus else None
    lxc_nodes = {g: proxmox.deployment_nodes([g]) for g in gpus} if args.lxc and gpus else None
    unified = _unified_sizing(cell, gpus, args.memory_from)
    if unified is not None:
        print(f"{cell.id}: {unified.describe()}")
    # What was tested is what starts: images.lock's recorded launch (the engine's health
    # path from the matrix for an entry published before images.lock kept it).
    launch = Launch.from_locked(entry["run"], health=ctx.matrix.engines[cell.engine].get("health"))
    result = deploy.deployment(entry, launch, str(model_dir), gpus,
                               args.cpu_lane, args.base_port, args.bind, lxc_lines, lxc_nodes,
                               cpus, unified)
    out = args.out or Path("deploy") / args.cell
    out.mkdir(parents=True, exist_ok=True)
    for name, text in result.files().items():
        (out / name).write_text(text, encoding="utf-8")
        print(out / name)
    print(f"deployed {len(result.compose['services'])} server(s) of {entry['reference']}; "
          f"start: cd {out} && docker compose up -d   (or docker-compose up -d)")
    return 0


def _unified_sizing(cell, gpus: list[int] | None, meminfo: Path):
    """Each server's memory on a unified-memory GPU (an sm_121 cell), from MemAvailable now;
    None for other cells."""
    from ..model import unifiedmem

    if not gpus:
        return None
    return unifiedmem.size_from_meminfo(meminfo, cell.arch, cell.engine, servers=len(gpus))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""
