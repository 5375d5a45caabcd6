"""`infermatrix render`: write images/<cell-id>/ for planned cells, or check them for drift."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from ..stages import Run, render, run_steps, steps_named
from ..model.spec import check_lock_files
from . import common_options, load_context, load_run, selection_options, wait_option


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "render", help="render one Dockerfile + build context per planned cell into images/",
        description="Render templates/ into images/<cell-id>/ for every planned cell (and remove "
        "directories of cells no longer planned when no --select/--skip is given). With --check, "
        "write nothing and exit 1 naming the files that differ from a fresh render.")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--check", action="store_true",
                        help="compare images/ with a fresh render; exit 1 on any difference")
    wait_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..state import run_lock

    ctx = load_context(args, log=False)  # bad input writes nothing
    with run_lock(ctx.state, wait=args.wait):  # plan fills the cache, render writes images/
        return _render(args, load_run(args))


def _render(args: argparse.Namespace, run: Run) -> int:
    ctx, plans = run.ctx, run.plans
    prune = not args.select and not args.skip
    check_lock_files(ctx, plans)  # a damaged lock is named before render reads it
    planned = render.planned(plans)
    missing = render.unrendered(plans)
    if args.check:
        differ = render.check(ctx, plans, prune=prune)
        if differ:
            print(f"images/ differs from a fresh render ({len(differ)} entries):", file=sys.stderr)
            for line in differ:
                print(f"  {line}", file=sys.stderr)
            print("  fix: " + (_unresolved_fix(args) if missing and len(missing) == len(differ)
                               else "run `infermatrix render` and commit images/"), file=sys.stderr)
            return 1
        print(f"images/ is up to date ({len(planned)} cells)")
        return 0
    render_run = dataclasses.replace(run, options=dataclasses.replace(run.options,
                                                                      prune_images=prune))
    [record] = run_steps(render_run, steps_named("render"))  # the main job's own render step
    written = list(record.results.values())
    for path in written:
        print(path.relative_to(ctx.root))
    print(f"rendered {len(written)} cells into {ctx.images_dir.relative_to(ctx.root)}/")
    if missing:
        print(f"infermatrix: error: {len(missing)} cells could not be rendered; their committed "
              "files under images/ are kept as they were:", file=sys.stderr)
        for cell_id, why in missing:
            print(f"  {cell_id}: {why}", file=sys.stderr)
        print(f"  fix: {_unresolved_fix(args)}", file=sys.stderr)
        return 1
    return 0


def _unresolved_fix(args: argparse.Namespace) -> str:
    if args.offline:
        return "run `infermatrix plan` once online to fill the metadata cache, then render again"
    return "the package index could not be reached: check the network (or INFERMATRIX_INDEX_URL) " \
           "and render again"
