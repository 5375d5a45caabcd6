"""`infermatrix smoke` (tiered tests of built images) and `infermatrix tag` (the tag policy)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..levels import NAMES as LEVELS
from . import common_options, load_run, run_options, selection_options, wait_option

if TYPE_CHECKING:
    from ..model.cell import CellPlan
    from ..stages.steps import Run


def register(subparsers: argparse._SubParsersAction) -> None:
    smoke = subparsers.add_parser("smoke", help=f"test built images: {', '.join(LEVELS)} levels")
    common_options(smoke)
    selection_options(smoke)
    smoke.add_argument("cells", nargs="*", metavar="CELL_ID",
                       help="cells to test (default: every planned cell with a passed build)")
    run_options(smoke, "levels", "smoke_on", "model_path", "fixture", "image")
    wait_option(smoke)
    smoke.set_defaults(func=run_smoke)

    tag = subparsers.add_parser("tag", help="tag the cells whose required smoke levels passed")
    common_options(tag)
    selection_options(tag)
    tag.add_argument("cells", nargs="*", metavar="CELL_ID",
                     help="cells to tag (default: every planned cell with a smoke result)")
    run_options(tag, "tag_repository", "wait")
    tag.set_defaults(func=run_tag)


def _plans(args: argparse.Namespace, stage: str) -> tuple[Run, list[CellPlan]]:
    """The run, and its planned cells named by ids/selectors; by default those with a journal
    `stage` record."""
    from .. import journal
    from ..errors import UsageError

    explicit = bool(args.cells or args.select)
    run = load_run(args, extra_select=args.cells)
    ctx, plans = run.ctx, run.plans
    not_planned = [p for p in plans if not p.planned]
    if args.cells and not_planned:
        named = [p for p in not_planned if p.id in args.cells]
        if named:
            reasons = "; ".join(v.reason for v in named[0].verdicts) or named[0].status
            raise UsageError(f"{named[0].id} is not a planned cell ({reasons})")
    plans = [p for p in plans if p.planned]
    if not explicit:
        records = journal.load_records(ctx.state)
        plans = [p for p in plans if p.id in records
                 and records[p.id].status_of(stage) == journal.Status.PASS]
    if not plans:
        raise UsageError(f"no cell to {'test' if stage == 'build' else 'tag'} "
                         f"(nothing with a passed {stage} in {ctx.state.journal})")
    return run, plans


def run_smoke(args: argparse.Namespace) -> int:
    import dataclasses

    from ..stages import run_steps, steps_named
    from ..stages.smoke import levels_to_run, model_source, smoke_endpoint
    from ..state import run_lock

    if args.image and len(args.cells) != 1:
        from ..errors import UsageError

        raise UsageError("--image tests one image: name exactly one CELL_ID with it")
    run, plans = _plans(args, "build")
    ctx = run.ctx
    options = run.options
    # usage errors before anything runs: a bad level list, model path or smoke engine
    levels_to_run(ctx, options.levels)
    model_source(ctx, options)
    smoke_endpoint(ctx, options.smoke_on)
    with run_lock(ctx.state, wait=run.options.wait):  # the main job's own smoke step
        [record] = run_steps(dataclasses.replace(run, plans=plans), steps_named("smoke"))
    return 1 if record.failed else 0


def run_tag(args: argparse.Namespace) -> int:
    """The main job's own tag step; a cell the policy does not let through is exit 1."""
    import dataclasses

    from ..stages import run_steps, steps_named
    from ..state import run_lock

    run, plans = _plans(args, "smoke")
    with run_lock(run.ctx.state, wait=run.options.wait):
        [record] = run_steps(dataclasses.replace(run, plans=plans), steps_named("tag"))
    return 1 if record.failed or record.dropped else 0
