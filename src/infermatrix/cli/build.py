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
    from ..stages import run_steps, steps_named

    build_run = load_run(args)
    if args.explain:
        from ..stages.build import compile_plan_for_cells

        print(compile_plan_for_cells(build_run.ctx, build_run.cells(), build_run.options).explain())
        return 0
    [record] = run_steps(build_run, steps_named("build"))  # the main job's own build step
    return 1 if record.failed else 0
