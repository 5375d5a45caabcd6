"""`infermatrix deploy`: write a Compose deployment (one server per GPU, or N CPU replicas) of
a published image, its Proxmox LXC lines and a README."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StageFailure, UsageError
from ..host import proxmox
from ..consumer import deploy
from ..imageslock import IMAGES_LOCK_NAME, read_images_lock
from ..stages.publish import cell_from_labels
from ..model import unifiedmem
from ..model.spec import Launch
from ..supplychain import sign
from ..engine import cosign, registry as registries
from . import common_options, load_context
from .publish import verify_flags

if TYPE_CHECKING:
    from ..context import Context
    from ..model.cell import Cell
    from ..model.profiles import ProfileSpec


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
    parser.add_argument("--context-tokens", type=int, default=deploy.DEFAULT_CONTEXT_TOKENS,
                        metavar="N", help="prompt tokens per request the sizing plans for "
                        f"(default {deploy.DEFAULT_CONTEXT_TOKENS})")
    parser.add_argument("--output-tokens", type=int, default=deploy.DEFAULT_OUTPUT_TOKENS,
                        metavar="N", help="answer tokens (thinking included) per request the "
                        f"sizing plans for (default {deploy.DEFAULT_OUTPUT_TOKENS})")
    parser.add_argument("--max-seqs", type=int, default=None, metavar="N",
                        help="sequences each server runs at once (the engine's --max-num-seqs "
                        "/ --max-running-requests; default: the capacity model's figure for "
                        "the cell's GPU at --context-tokens + --output-tokens, written into "
                        "compose.yaml and deployment.json, which `generate` reads)")
    parser.add_argument("--profile", default=deploy.DEFAULT_PROFILE, metavar="NAME",
                        help="serve profile of matrix.yaml `profiles` (bf16, fp8, bf16-kv-fp8): "
                        "its launch flags are added to the serve command, the sizing and the "
                        "prediction use its bytes, and --model-dir must hold its checkpoint "
                        f"(default {deploy.DEFAULT_PROFILE}, the one every cell is tested with)")
    verify_flags(parser)
    parser.set_defaults(func=run_deploy)


def _profile(ctx: Context, name: str, model_dir: Path) -> ProfileSpec:
    """The chosen profile; a usage error for an unknown one or a model directory whose
    config.json holds another kind of checkpoint."""
    import json

    from ..model.profiles import profile_specs

    specs = {s.key: s for s in profile_specs(ctx.matrix.data)}
    if name not in specs:
        raise UsageError(f"unknown profile {name!r}: choose one of {', '.join(specs)} "
                         "(matrix.yaml profiles)")
    spec = specs[name]
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    why = deploy.profile_matches_checkpoint(spec.needs, config if isinstance(config, dict)
                                            else None)
    if why:
        raise UsageError(f"--profile {name} ({spec.checkpoint}) with --model-dir {model_dir}: "
                         f"{why}", fix=f"download {spec.checkpoint} and pass its directory")
    return spec


def run_deploy(args: argparse.Namespace) -> int:
    ctx = load_context(args, log=False)
    lock_path = args.lock or ctx.matrix.root / IMAGES_LOCK_NAME
    if not lock_path.is_file():
        raise UsageError(f"{lock_path} does not exist: run `infermatrix publish` first or pass "
                         "--lock PATH")
    locked = deploy.locked_entry(read_images_lock(lock_path), args.cell, str(lock_path))
    _cell_of(locked, lock_path, args.cell, ctx)  # usage errors before the registry is asked
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
    out = args.out or Path("deploy") / args.cell
    verify = sign.verify_options(args.key, args.skip_verify, args.require_levels)
    cosign.use_state_dir(ctx.state.root)  # where cosign's registry credentials go, 0700
    # What runs is what is signed: the verified statement, checked against this cell and
    # images.lock (--skip-verify: images.lock's entry, marked NOT VERIFIED in the files).
    creds = registries.RegistryCredentials() if verify.skip else \
        registries.credentials_for(locked["repository"])
    entry = sign.verified_entry(args.cell, locked, verify, creds)
    cell = _cell_of(entry, lock_path, args.cell, ctx)
    if args.bind not in LOOPBACK:
        print(f"warning: --bind {args.bind}: the engine servers answer anyone who reaches "
              f"{args.bind} (no authentication); bind 127.0.0.1 and put an authenticating "
              "proxy in front to serve others", file=sys.stderr)
    lxc_lines = proxmox.deployment_lines(_read(Path("/proc/devices")), gpus, None) \
        if gpus else None
    lxc_nodes = {g: proxmox.deployment_nodes([g]) for g in gpus} if args.lxc and gpus else None
    # each server's memory on a unified-memory GPU (an sm_121 cell), from MemAvailable now
    unified = unifiedmem.size_from_meminfo(args.memory_from, cell.arch, cell.engine,
                                           servers=len(gpus)) if gpus else None
    # What was tested is what starts: the signed launch (the engine's health path from the
    # matrix for an entry published before images.lock kept it).
    launch = Launch.from_locked(entry["run"], health=ctx.matrix.engines[cell.engine].get("health"))
    for flag, value in (("--context-tokens", args.context_tokens),
                        ("--output-tokens", args.output_tokens), ("--max-seqs", args.max_seqs)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: give a positive number")
    deploy.check_lane(entry, launch, gpus, args.cpu_lane)  # usage errors before the sizing
    load = deploy.Load(_profile(ctx, args.profile, model_dir), args.context_tokens,
                       args.output_tokens, args.max_seqs)
    sizing = deploy.server_sizing(entry, model_dir, load)
    result = deploy.deployment(deploy.Request(
        entry, launch, str(model_dir), gpus, args.cpu_lane, cpus, args.base_port, args.bind,
        lxc_lines, lxc_nodes, unified, sizing))
    files = result.files()
    check_out_dir(out, files)  # nothing written when a file there is not deploy's
    if unified is not None:
        print(f"{cell.id}: {unified.describe()}")
    print(f"{cell.id}: profile {load.profile.key} ({load.profile.checkpoint}"
          + (f"; {' '.join(sizing.profile_args)}" if sizing.profile_args else "") + "); "
          f"{sizing.flag or 'sequence limit'} {sizing.max_seqs or 'engine default'} "
          f"per server ({sizing.source}); predicted {sizing.predicted_tokens_per_s or '?'} "
          "output tokens/s per server")
    write_out_dir(out, files, entry)
    for name in files:
        print(out / name)
    print(f"deployed {len(result.compose['services'])} server(s) of {entry['reference']}; "
          f"start: cd {out} && docker compose up -d   (or docker-compose up -d)")
    return 0


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
RECORD_NAME = ".infermatrix-deploy.json"


def _cell_of(entry: dict[str, Any], lock_path: Path, cell_id: str, ctx: Context) -> Cell:
    try:
        cell = cell_from_labels(entry.get("labels") or {})
    except StageFailure as exc:
        raise UsageError(f"{lock_path}: cell {cell_id}: {exc}", fix="publish it again") from None
    if cell.engine not in ctx.matrix.engines:
        raise UsageError(f"engine {cell.engine!r} of {cell.id} is not in {ctx.matrix.path}",
                         fix="pass --matrix PATH, the matrix the image was built from")
    return cell


def file_digest(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def written_record(out: Path) -> dict:
    """What an earlier deploy wrote into `out` (RECORD_NAME): file name -> sha256, the cell,
    the reference and the key its statement verified against; {} when none."""
    import json

    try:
        data = json.loads((out / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_out_dir(out: Path, files: dict[str, str]) -> None:
    """A file of `files` already in `out` is overwritten only when deploy wrote it there and it
    is unchanged since (RECORD_NAME); anything else is the user's: exit 2, nothing written."""
    recorded = written_record(out).get("files") or {}
    for name in sorted(files):
        path = out / name
        if not path.exists() and not path.is_symlink():
            continue
        if path.is_symlink() or not path.is_file():
            why = "is not a regular file"
        elif recorded.get(name) is None:
            why = "was not written by infermatrix deploy"
        elif recorded[name] != file_digest(path.read_bytes()):
            why = "was changed since infermatrix deploy wrote it"
        else:
            continue
        raise UsageError(f"{path} exists and {why}: not overwritten (nothing written)",
                         fix="pass --out DIR, a new or empty directory (default "
                         "./deploy/CELL), or move the file away")


def write_out_dir(out: Path, files: dict[str, str], entry: dict) -> None:
    from ..state import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    write_json_atomic(out / RECORD_NAME, {
        "written_by": "infermatrix deploy", "cell": entry["cell"],
        "reference": entry["reference"], "verified_by": entry.get("verified_by"),
        "files": {name: file_digest(text.encode("utf-8")) for name, text in files.items()}})


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""
