"""`infermatrix verify CELL --model-dir DIR`: the consumer's own gpu and model levels of a
pulled image, on this host, from images.lock alone (consumer/verify.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..engine import registry as registries
from ..engine.docker import Engine
from ..errors import UsageError
from ..supplychain import sign
from .publish import consumer_state, verify_flags
from ..imageslock import IMAGES_LOCK_NAME, read_images_lock
from ..consumer.deploy import locked_entry
from ..consumer.verify import (Request, default_verdict_path, unified_sizing, verify_entry,
                               write_verdict)
from ..levels import ALL_VERIFY_LEVELS, VERIFY_LEVELS, parse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "verify", help="run the gpu and model levels of a pulled image on this host",
        description="After `infermatrix pull`: run the gpu level (the device, torch, Triton, "
        "GDN ops in a container with this host's GPUs) and the model level (the serve "
        "command images.lock recorded, on the weights of --model-dir, probed with thinking "
        "on and off) of the pulled image, and write this host's verdict as JSON. Exit 1 "
        "when a level fails.")
    parser.add_argument("cell", metavar="CELL", help="a cell id of images.lock")
    parser.add_argument("--model-dir", required=True, type=Path, metavar="DIR",
                        help="host directory with the model weights, mounted read-only")
    parser.add_argument("--lock", metavar="PATH", type=Path, default=Path(IMAGES_LOCK_NAME),
                        help=f"the lock to read (default: ./{IMAGES_LOCK_NAME})")
    parser.add_argument("--levels", default=",".join(VERIFY_LEVELS), metavar="LIST",
                        help=f"comma-separated subset of {','.join(ALL_VERIFY_LEVELS)} "
                        f"(default: {','.join(VERIFY_LEVELS)}; workload: the job's shape, "
                        "a sweep, a soak, a needle, held to the published figure)")
    parser.add_argument("--soak-s", type=float, default=None, metavar="S",
                        help="seconds of the workload level's soak (default 600, 60 for a CPU "
                        "cell)")
    parser.add_argument("--expect", default="Paris", metavar="TEXT",
                        help="the word the probe's answer must hold (default: Paris, for "
                        "the default question)")
    parser.add_argument("--no-answer-check", action="store_true",
                        help="check the answers' structure only (random fixture weights)")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="the verdict file (default: verdicts/CELL-HOSTNAME.json)")
    parser.add_argument("--memory-from", type=Path, default=Path("/proc/meminfo"),
                        metavar="MEMINFO", help="where this host's available memory is read for "
                        "a unified-memory GPU (DGX Spark / GB10: the engine's share is sized "
                        "from MemAvailable, as deploy sizes it; default /proc/meminfo)")
    verify_flags(parser)  # verified like pull before anything runs
    parser.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    try:
        levels = parse(args.levels, ALL_VERIFY_LEVELS)
    except ValueError as exc:
        raise UsageError(f"--levels {args.levels!r}: {exc}") from None
    if not args.lock.is_file():
        raise UsageError(f"{args.lock} does not exist: pass --lock PATH (the images.lock "
                         "you pulled from)")
    if not args.model_dir.is_dir():
        raise UsageError(f"--model-dir {args.model_dir} is not a directory")
    locked = locked_entry(read_images_lock(args.lock), args.cell, str(args.lock))
    options = sign.verify_options(args.key, args.skip_verify, args.require_levels)
    consumer_state(args.lock)
    # What runs is what is signed: the verified statement, checked against this cell and
    # images.lock, before any container starts (--skip-verify: images.lock's, said so).
    creds = registries.RegistryCredentials() if options.skip else \
        registries.credentials_for(locked["repository"])
    entry = sign.verified_entry(args.cell, locked, options, creds)
    unified = unified_sizing(entry, args.memory_from)  # too little memory: exit 1, nothing run
    if unified is not None:
        print(f"{args.cell}: {unified.describe()}")
    out = args.out or default_verdict_path(args.cell)
    if args.soak_s is not None and args.soak_s <= 0:
        raise UsageError(f"--soak-s {args.soak_s:g}: give a positive number of seconds")
    request = Request(entry, args.model_dir.absolute(), out.with_suffix(".log"), levels,
                      None if args.no_answer_check else args.expect, unified, args.soak_s)
    verdict = verify_entry(request, Engine())  # DOCKER_HOST / the context
    verdict["signature"] = {"verified_by": entry.get("verified_by"),
                            "note": None if entry.get("verified_by") else
                            f"NOT VERIFIED ({sign.SKIP_FLAG})"}
    write_verdict(verdict, out)
    for name, level in verdict["levels"].items():
        reason = f"  {level.get('reason')}" if level.get("reason") else ""
        print(f"  {name:<7}{level['status']:<5} {level.get('duration_s', 0):7.1f} s{reason}")
    host = verdict["host"]
    gpus = ", ".join(f"{g['name']} ({g['compute_cap']}, driver {g['driver']})"
                     for g in host["gpus"]) or "no GPU"
    print(f"{args.cell}: {verdict['status']} on {host['hostname']} ({gpus}); verdict: {out}")
    return 1 if verdict["status"] == "fail" else 0
