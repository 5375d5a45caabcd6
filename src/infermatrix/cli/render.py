"""`infermatrix render`: write images/<cell-id>/ for planned cells, or check them for drift."""

from __future__ import annotations

import argparse
import sys

from .. import render
from . import common_options, load_run, selection_options


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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run = load_run(args)
    ctx, plans = run.ctx, run.plans
    prune = not args.select and not args.skip
    planned = render.planned(plans)
    if args.check:
        differ = render.check(ctx, planned, prune=prune)
        if differ:
            print(f"images/ differs from a fresh render ({len(differ)} files):", file=sys.stderr)
            for line in differ:
                print(f"  {line}", file=sys.stderr)
            print("  fix: run `infermatrix render` and commit images/", file=sys.stderr)
            return 1
        print(f"images/ is up to date ({len(planned)} cells)")
        return 0
    written = render.render_cells(ctx, planned, prune=prune)
    for path in written:
        print(path.relative_to(ctx.root))
    print(f"rendered {len(written)} cells into {ctx.images_dir.relative_to(ctx.root)}/")
    return 0
