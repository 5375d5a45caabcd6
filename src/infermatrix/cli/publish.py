"""`infermatrix publish` (tagged cells to the registry, images.lock) and `infermatrix pull`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..host import doctor, hostcheck
from ..errors import StageFailure, UsageError
from ..imageslock import LOCK_NAME, read_lock, select_entries
from ..stages.publish import publish
from ..consumer.pull import docker_run_line, pull_entry
from ..engine.registry import REGISTRY_PASSWORD_ENV, REGISTRY_USER_ENV
from ..model.selectors import Selection
from ..state import run_lock
from ..stages import sign
from . import common_options, load_run, selection_options, wait_option


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
        description="Check the host (driver floor, GPU arch, LXC device nodes), pull by digest "
        "with the credentials publish uses (" + REGISTRY_USER_ENV + "/" + REGISTRY_PASSWORD_ENV
        + ", else Docker's config and credential helpers), check the image id and "
        "io.infermatrix labels against images.lock, and print the command that serves the "
        "model from it.")
    pull.add_argument("cell", metavar="CELL_OR_SELECTOR",
                      help="a cell id or a selector (fnmatch, {a,b} braces)")
    pull.add_argument("--lock", metavar="PATH", type=Path, default=Path(LOCK_NAME),
                      help=f"the lock to read (default: ./{LOCK_NAME})")
    pull.add_argument("--model-dir", default="$HOME/models/model", metavar="DIR",
                      help="host directory with the model weights, mounted read-only")
    pull.add_argument("--port", type=int, default=None, help="port to serve on (default 8000)")
    pull.add_argument("--no-pull", action="store_true",
                      help="only print the docker run line (no registry access)")
    pull.add_argument("--skip-host-check", action="store_true",
                      help="pull although this host cannot run the cell (e.g. to mirror it)")
    pull.add_argument("--ctid", type=int, default=None,
                      help="this LXC guest's Proxmox container id, for the lxc-config lines")
    pull.add_argument("--host-root", metavar="DIR", type=Path, default=Path("/"),
                      help="read proc/, sys/, run/ and dev/ under DIR (default /)")
    verify_flags(pull)
    pull.set_defaults(func=run_pull)


def verify_flags(parser: argparse.ArgumentParser) -> None:
    """pull's and deploy's verification flags (stages/sign.py)."""
    parser.add_argument("--key", metavar="PUB", type=Path, default=None,
                        help="the publisher's cosign public key to verify the signature and "
                        "attestations against (default: $INFERMATRIX_COSIGN_PUBLIC_KEY)")
    parser.add_argument("--require-levels", metavar="LIST", default=None,
                        help="smoke levels the test-result attestation must show passed "
                        "(default: those the publisher's tag policy required)")
    parser.add_argument("--skip-verify", action="store_true",
                        help="do not verify the signature and test results (said in the "
                        "output); an unsigned or failed image is otherwise refused")


def run_publish(args: argparse.Namespace) -> int:
    run = load_run(args, quiet=True)  # its CellSpecs give images.lock's serve command
    with run_lock(run.ctx.state, wait=run.options.wait):  # the journal is written per cell
        result = publish(run.ctx, Selection(args.select, args.skip), registry=args.registry,
                         allow_retag=args.allow_retag, lock_path=args.lock, docker=run.docker,
                         cells=run.cells())
    for cell_id, why in sorted(result.refused.items()):
        print(f"refused   {cell_id}: {why}", file=sys.stderr)
    for cell_id, why in sorted(result.failed.items()):
        print(f"failed    {cell_id}: {why}", file=sys.stderr)
    print(f"published {len(result.pushed)}, unchanged {len(result.unchanged)}, "
          f"refused {len(result.refused)}, failed {len(result.failed)}")
    if not result.ok:
        raise StageFailure("publish incomplete: see the refused/failed cells above")
    return 0


def host_checker(args: argparse.Namespace):
    """The check pull runs before a pull: problems go to stderr, then one failure line."""
    readers = doctor.HostReaders(root=args.host_root)

    def check(entry: dict, labels: dict[str, str]) -> None:
        result = hostcheck.check_host(entry, labels, readers, args.ctid)
        if result.ok:
            return
        for problem in result.problems:
            print(f"missing   {entry['cell']}: {problem}", file=sys.stderr)
        for line in result.advice:
            print(line, file=sys.stderr)
        raise StageFailure(f"this host cannot run {entry['cell']} ({len(result.problems)} "
                           "problem(s) above); fix them, or pass --skip-host-check to pull "
                           "anyway")
    return None if args.skip_host_check else check


def run_pull(args: argparse.Namespace) -> int:
    if not args.lock.is_file():
        raise UsageError(f"{args.lock} does not exist: run `infermatrix publish` first or "
                           "pass --lock PATH")
    lock = read_lock(args.lock)
    entries = select_entries(lock, args.cell)
    verify = None if args.no_pull else \
        sign.verify_options(args.key, args.skip_verify, args.require_levels)
    for entry in entries:
        if args.no_pull:
            print(f"# not pulled, not verified (--no-pull): {entry['reference']}")
        else:
            info = pull_entry(entry, host_check=host_checker(args), verify=verify)
            print(f"# pulled {entry['reference']} (image {info['Id']}, labels match "
                  f"images.lock)")
        print(docker_run_line(entry, args.model_dir, args.port))
    return 0
