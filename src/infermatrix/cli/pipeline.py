"""`infermatrix pipeline`: the main job (what `nox -s build-matrix` runs)."""

from __future__ import annotations

import argparse

from ..context import Context, setup_command_log
from ..pipeline import PipelineOptions, run_pipeline
from ..state import run_lock
from . import common_options, compile_options, selection_options, wait_option


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "pipeline", help="the main job: plan, render, build, audit, smoke, tag, publish, report",
        description="Run every stage over the selected cells. A failed cell does not stop the "
        "others (unless --fail-fast); a rerun resumes from the journal.")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failed step")
    parser.add_argument("--levels", default=None,
                        help="smoke levels, comma-separated (default: matrix.yaml smoke.levels)")
    parser.add_argument("--no-publish", action="store_true", help="skip the publish step")
    compile_options(parser)
    parser.add_argument("--timeout-min", type=float, default=None, help="per-cell build timeout")
    wait_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args.matrix, args.state_dir, args.offline)
    setup_command_log(ctx.state, args.verbose)
    options = PipelineOptions(
        select=args.select, skip=args.skip, fail_fast=args.fail_fast,
        levels=args.levels.split(",") if args.levels else None, publish=not args.no_publish,
        max_jobs=args.max_jobs, nvcc_threads=args.nvcc_threads, timeout_min=args.timeout_min,
        wait=args.wait)
    with run_lock(ctx.state, wait=args.wait):
        code, _ = run_pipeline(ctx, options)
    return code
