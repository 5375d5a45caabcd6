"""`infermatrix build`: build the rendered cells on the Docker engine."""

from __future__ import annotations

import argparse

from . import common_options, load_run, run_options, selection_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build", help="build the rendered cells (BuildKit)")
    common_options(parser)
    selection_options(parser)
    run_options(parser, "fail_fast", "timeout_min", "max_jobs", "nvcc_threads", "wait", "force",
                "ca_bundle", "builders")
    parser.add_argument("--explain", action="store_true",
                        help="print the compile plan with where each figure came from; "
                             "build nothing")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..stages.build import build_cells

    build_run = load_run(args)
    options = build_run.options
    if args.explain:
        from ..stages.build import compile_plan_for_cells

        print(compile_plan_for_cells(build_run.ctx, build_run.plans, options).explain())
        return 0
    results = build_cells(build_run.ctx, build_run.plans, options, docker=build_run.docker)
    built = [r for r in results.values() if r.status != "skip"]
    failed = [r for r in built if r.status == "fail"]
    reused = sum(1 for r in built if r.reused)
    print(f"build: {len(built) - len(failed)} passed ({reused} unchanged), {len(failed)} failed"
          + (f": {', '.join(r.cell_id for r in failed)}" if failed else ""))
    return 1 if failed else 0
