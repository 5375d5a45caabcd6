"""`infermatrix compile-plan`: MAX_JOBS, NVCC_THREADS, cells in parallel and the expected peak,
for this host or one you are not on (what to check before starting a multi-hour build)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Callable

from ..options import positive_int
from . import common_options, compile_options

if TYPE_CHECKING:  # imported where they run: the command line starts without them
    from ..context import Context
    from ..model import compileplan
    from ..model.cell import CellPlan


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compile-plan", help="plan the kernel compile for a host (this one or another)",
        description="Size MAX_JOBS / NVCC_THREADS / cells in parallel from the memory model "
        "(data/compile_model.yaml and what earlier builds recorded) for the given memory and "
        "CPUs, or this host's when they are left out. Prints where each figure came from.")
    common_options(parser)
    parser.add_argument("--memory", default=None, metavar="SIZE",
                        help="memory of the target host, e.g. 512G (default: this host's)")
    parser.add_argument("--cpus", type=positive_int, default=None, metavar="N",
                        help="CPUs of the target host (default: this host's)")
    parser.add_argument("--cell", action="append", default=[], metavar="ID",
                        help="plan for this cell's kernels only (fnmatch pattern; repeatable); "
                             "default: every planned cell that compiles kernels")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    compile_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..model import compileplan
    from ..stages.build import kernel_need, plan_options
    from ..context import Context, setup_command_log
    from ..errors import UsageError
    from ..options import resolve
    from ..stages.plan import plan_matrix

    ctx = Context.load(args.matrix, args.state_dir, args.offline)
    options = resolve(args, ctx.matrix.data)  # --max-jobs/--nvcc-threads validated as everywhere
    setup_command_log(ctx.state, args.verbose)
    try:
        memory = compileplan.parse_size(args.memory) if args.memory else None
    except ValueError as exc:
        raise UsageError(f"--memory: {exc}") from None
    plans = [p for p in plan_matrix(ctx, select=args.cell) if p.planned and p.settings]
    needs_per_cell = [cell_needs(ctx, p, kernel_need) for p in plans]
    needs = [n for cell in needs_per_cell for n in cell]
    reading = compileplan.read_host()
    here_memory, here_source = compileplan.effective_memory(reading)
    plan = compileplan.plan_for_needs(
        memory if memory is not None else here_memory,
        args.cpus or compileplan.effective_cpus(reading), needs,
        memory_source="--memory" if memory is not None else here_source,
        **plan_options(ctx, options, needs_per_cell))
    cells = [p.id for p, cell in zip(plans, needs_per_cell) if cell]
    if args.json:
        print(json.dumps({**plan.as_dict(), "cells": cells}, indent=2, default=str))
    else:
        print(plan.explain())
        print(f"  cells compiling kernels: {len(cells)}" + (f" ({', '.join(cells[:6])}"
              + (", ..." if len(cells) > 6 else "") + ")" if cells else ""))
    return 0


def cell_needs(ctx: Context, plan: CellPlan,
               kernel_need: Callable[[dict[str, dict[str, Any]], Any], compileplan.Need]
               ) -> list[compileplan.Need]:
    """The memory model's keys of a cell's kernels: its CUDA, one target (its own arch), the
    version its lock pins when the matrix says `match-engine` (spec.resolve_spec reads it)."""

    specs = ctx.matrix.build.get("kernels", {})
    resolved = {k.name: k.version for k in ctx.spec(plan).kernels}
    needs = []
    for name in plan.settings.kernels if plan.settings else ():  # planned: it has settings
        need = kernel_need(specs, name)
        version = need.version or resolved.get(name)
        needs.append(type(need)(need.package, version, plan.cell.cuda, 1, need.legacy_gb))
    return needs
