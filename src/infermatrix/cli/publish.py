"""`infermatrix publish` (tagged cells to the registry, images.lock) and `infermatrix pull`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..host import doctor, hostcheck

if TYPE_CHECKING:
    from ..consumer.pull import HostChecker
from ..errors import StageFailure, UsageError
from ..imageslock import IMAGES_LOCK_NAME, read_images_lock, select_entries
from ..consumer.pull import docker_run_line, pull_entry
from ..engine.docker import Engine
from ..engine.registry import REGISTRY_PASSWORD_ENV, REGISTRY_USER_ENV
from ..model.selectors import Selection
from ..state import run_lock
from ..supplychain import sign
from . import common_options, load_run, run_options, selection_options


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "publish", help="push tagged cells under immutable tags and write images.lock",
        description="Push every cell whose tag stage passed to publish.registry/repository, "
        "under the publish.tag template; a tag that holds another image is refused. "
        "Credentials: INFERMATRIX_REGISTRY_USER/_PASSWORD, else Docker's config and "
        "credential helpers (`docker login`).")
    common_options(parser)
    selection_options(parser)
    run_options(parser, "registry", "images_lock", "wait", "allow_retag")
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
    pull.add_argument("--lock", metavar="PATH", type=Path, default=Path(IMAGES_LOCK_NAME),
                      help=f"the lock to read (default: ./{IMAGES_LOCK_NAME})")
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
    """pull's and deploy's verification flags (supplychain/sign.py)."""
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
    """The main job's own publish step over the selected planned cells."""
    from ..stages import run_steps, steps_named
    from ..stages.publish import registry_configured, tagged_cells, target_repository

    run = load_run(args, quiet=True)  # its CellSpecs give images.lock's serve command
    if not registry_configured(run.ctx.matrix, run.options.registry):
        target_repository(run.ctx.matrix, run.options.registry)  # says what to set, exit 2
    planned = {p.id for p in run.plans if p.planned}
    for cand in tagged_cells(run.ctx.state, Selection(args.select, args.skip)):
        if cand.cell_id not in planned:
            print(f"not published {cand.cell_id}: tagged, but not planned in "
                  f"{run.ctx.matrix.path} (pruned or removed since)", file=sys.stderr)
    with run_lock(run.ctx.state, wait=run.options.wait):  # the journal is written per cell
        [record] = run_steps(run, steps_named("publish"))
    if record.failed:
        raise StageFailure("publish incomplete: see the refused/failed cells above")
    return 0


def host_checker(args: argparse.Namespace) -> HostChecker | None:
    """The check pull runs before a pull: problems go to stderr, then one failure line (None:
    --skip-host-check)."""
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
    from ..engine import registry as registries

    if not args.lock.is_file():
        raise UsageError(f"{args.lock} does not exist: run `infermatrix publish` first or "
                         "pass --lock PATH")
    lock = read_images_lock(args.lock)
    entries = select_entries(lock, args.cell)
    consumer_state(args.lock)
    docker = Engine()  # DOCKER_HOST / the current context
    verify = None if args.no_pull else \
        sign.verify_options(args.key, args.skip_verify, args.require_levels)
    for entry in entries:
        if verify is None:
            print(f"# not pulled, not verified (--no-pull): {entry['reference']}")
            print(sign.skip_warning(entry).replace(sign.SKIP_FLAG, "--no-pull"),
                  file=sys.stderr)
            acted = entry
        else:  # the signed statement, checked against this cell and images.lock, or --skip-verify
            creds = registries.credentials_for(entry["repository"])
            acted = sign.verified_entry(entry["cell"], entry, verify, creds)
            info = pull_entry(acted, creds, host_check=host_checker(args), docker=docker)
            said = "the signed statement" if acted.get("verified_by") else \
                "images.lock (NOT VERIFIED)"
            print(f"# pulled {acted['reference']} (image {info['Id']}, labels match {said})")
        print(docker_run_line(acted, args.model_dir, args.port))
    return 0


def consumer_state(lock: Path) -> None:
    """pull's and verify's state directory (no matrix): .state beside the images.lock read;
    cosign's registry credentials go under its secrets/ (engine/cosign.py)."""
    from ..engine import cosign
    from ..state import DEFAULT_STATE_DIR

    cosign.use_state_dir(lock.absolute().parent / DEFAULT_STATE_DIR)
