"""`infermatrix publish` (tagged cells to the registry, images.lock) and `infermatrix pull`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..options import resolve
from ..errors import StageFailure, UsageError
from ..publish import (LOCK_NAME, docker_run_line, publish, pull_entry, read_lock,
                       select_entries)
from ..selectors import Selection
from ..state import run_lock
from . import common_options, load_context, selection_options, wait_option


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "publish", help="push tagged cells under immutable tags and write images.lock",
        description="Push every cell whose tag stage passed to publish.registry/repository, "
        "under the publish.tag template; a tag that holds another image is refused. "
        "Credentials: INFERMATRIX_REGISTRY_USER/_PASSWORD, else Docker's config and "
        "credential helpers (`docker login`).")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--registry", metavar="HOST[/PATH]",
                        help="override publish.registry of matrix.yaml")
    parser.add_argument("--lock", metavar="PATH", type=Path,
                        help=f"the lock to update (default: {LOCK_NAME} beside the matrix)")
    wait_option(parser)
    parser.add_argument("--allow-retag", action="store_true",
                        help="move a tag that already holds another image (breaks consumers "
                        "pinned to the tag; those pinned by digest are safe)")
    parser.set_defaults(func=run_publish)

    pull = sub.add_parser(
        "pull", help="pull cells of images.lock by digest and print their `docker run` line",
        description="Pull by digest, check the image id and io.infermatrix labels against "
        "images.lock, and print the command that serves the model from it.")
    pull.add_argument("cell", metavar="CELL_OR_SELECTOR",
                      help="a cell id or a selector (fnmatch, {a,b} braces)")
    pull.add_argument("--lock", metavar="PATH", type=Path, default=Path(LOCK_NAME),
                      help=f"the lock to read (default: ./{LOCK_NAME})")
    pull.add_argument("--model-dir", default="$HOME/models/model", metavar="DIR",
                      help="host directory with the model weights, mounted read-only")
    pull.add_argument("--port", type=int, default=None, help="port to serve on (default 8000)")
    pull.add_argument("--no-pull", action="store_true",
                      help="only print the docker run line (no registry access)")
    pull.set_defaults(func=run_pull)


def run_publish(args: argparse.Namespace) -> int:
    ctx = load_context(args)
    with run_lock(ctx.state, wait=resolve(args, ctx.matrix.data).wait):  # the journal is written per cell
        result = publish(ctx, Selection(args.select, args.skip), registry=args.registry,
                         allow_retag=args.allow_retag, lock_path=args.lock)
    for cell_id, why in sorted(result.refused.items()):
        print(f"refused   {cell_id}: {why}", file=sys.stderr)
    for cell_id, why in sorted(result.failed.items()):
        print(f"failed    {cell_id}: {why}", file=sys.stderr)
    print(f"published {len(result.pushed)}, unchanged {len(result.unchanged)}, "
          f"refused {len(result.refused)}, failed {len(result.failed)}")
    if not result.ok:
        raise StageFailure("publish incomplete: see the refused/failed cells above")
    return 0


def run_pull(args: argparse.Namespace) -> int:
    if not args.lock.is_file():
        raise UsageError(f"{args.lock} does not exist: run `infermatrix publish` first or "
                           "pass --lock PATH")
    lock = read_lock(args.lock)
    for entry in select_entries(lock, args.cell):
        if not args.no_pull:
            info = pull_entry(entry)
            print(f"# pulled {entry['reference']} (image {info['Id']}, labels match "
                  f"images.lock)")
        print(docker_run_line(entry, args.model_dir, args.port))
    return 0
