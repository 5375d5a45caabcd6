"""`infermatrix build`: build the rendered cells on the Docker engine."""

from __future__ import annotations

import argparse

from . import common_options, compile_options, selection_options, wait_option


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("build", help="build the rendered cells (BuildKit)")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop at the first failed cell (default: build the others)")
    parser.add_argument("--timeout-min", type=float, default=None, metavar="N",
                        help="per-cell time limit in minutes (default: build.timeout_minutes)")
    compile_options(parser)
    parser.add_argument("--explain", action="store_true",
                        help="print the compile plan with where each figure came from; "
                             "build nothing")
    wait_option(parser)
    parser.add_argument("--force", action="store_true",
                        help="rebuild even the cells whose inputs did not change")
    parser.add_argument("--ca-bundle", default=None, metavar="FILE",
                        help="CA bundle passed to builds as the `ca_bundle` secret "
                             "(default: $SSL_CERT_FILE or the system bundle)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..build import BuildOptions, build_cells
    from ..context import Context, setup_command_log
    from ..errors import UsageError
    from ..plan import plan_matrix

    ctx = Context.load(args.matrix, args.state_dir, args.offline)
    if args.ca_bundle and not Path(args.ca_bundle).is_file():
        raise UsageError(f"--ca-bundle {args.ca_bundle}: no such file")
    setup_command_log(ctx.state, args.verbose)
    plans = plan_matrix(ctx, select=args.select, skip=args.skip)
    options = BuildOptions(fail_fast=args.fail_fast, timeout_min=args.timeout_min,
                           max_jobs=args.max_jobs, nvcc_threads=args.nvcc_threads,
                           wait=args.wait, force=args.force,
                           ca_bundle=Path(args.ca_bundle) if args.ca_bundle else None)
    if args.explain:
        from ..build import compile_plan_for_cells

        print(compile_plan_for_cells(ctx, plans, options).explain())
        return 0
    results = build_cells(ctx, plans, options)
    built = [r for r in results.values() if r.status != "skip"]
    failed = [r for r in built if r.status == "fail"]
    reused = sum(1 for r in built if r.reused)
    print(f"build: {len(built) - len(failed)} passed ({reused} unchanged), {len(failed)} failed"
          + (f": {', '.join(r.cell_id for r in failed)}" if failed else ""))
    return 1 if failed else 0
