"""`infermatrix lock` (per-cell uv locks with hashes) and `infermatrix verify-repro`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..context import Context
from ..errors import UsageError
from ..options import positive_int
from ..state import run_lock

if TYPE_CHECKING:
    from ..stages.lock import LockRun  # imported where it runs: the CLI starts without it
from . import (common_options, compile_options, load_run, run_options, selection_options,
               wait_option)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "lock", help="resolve each planned cell with uv into locks/<cell-id>.txt",
        description="Resolve each planned cell's Python environment with uv (hashes, the cell's "
        "Python and platform, the torch index of its CUDA variant) into locks/<cell-id>.txt. "
        "The only step that needs the package index: render and build use the committed locks.")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the cells whose committed lock "
                        "differs from a fresh resolution")
    run_options(parser, "index_url")
    parser.add_argument("--jobs", type=positive_int, default=4, metavar="N",
                        help="cells resolved at once (default 4)")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    wait_option(parser)
    parser.add_argument("--allow-unreachable", action="store_true",
                        help="an index that cannot be reached (a network condition) is reported "
                        "but does not fail the run")
    parser.set_defaults(func=run_lock_command)

    repro = sub.add_parser(
        "verify-repro", help="build a cell twice without cache and compare the images",
        description="Build one rendered cell twice without cache and compare the two images "
        "file by file (path, type, mode, owner, size, content hash, link target), then by image "
        "digest (naming the metadata that differs); list every input and how it is pinned. "
        "Exit 1 when files or config differ (or the digests, with --require-digest).")
    common_options(repro)
    repro.add_argument("cell", help="the cell id (see `infermatrix plan`)")
    repro.add_argument("--keep", action="store_true", help="keep the two images (tagged)")
    repro.add_argument("--json", action="store_true", help="print the comparison as JSON")
    repro.add_argument("--require-digest", action="store_true",
                       help="also fail when the two image digests differ")
    repro.add_argument("--max-list", type=int, default=200, metavar="N",
                       help="differences printed (all are in the JSON report)")
    repro.add_argument("--kernels", action="store_true",
                       help="only the compiled kernels: compile each kernel stage twice (its "
                       "compile step only, on the cached toolchain) and compare the wheels member "
                       "by member, explaining each "
                       "differing object (ELF sections, device code, after strip)")
    repro.add_argument("--against-cache", action="store_true",
                       help="with --kernels: compile once and compare with the kernel cache's "
                       "wheel of the same key")
    compile_options(repro)
    run_options(repro, "ca_bundle")
    wait_option(repro)
    repro.set_defaults(func=run_verify_repro)


def run_lock_command(args: argparse.Namespace) -> int:
    from ..stages import lock

    lock_run = load_run(args, lock_verdicts=False)  # this step decides them again
    ctx, plans = lock_run.ctx, lock_run.plans
    all_planned = None
    if not args.select and not args.skip:
        all_planned = [p.id for p in plans if p.planned]
    if not any(p.planned for p in plans):
        raise UsageError("no planned cell in the selection (see `infermatrix plan`)")
    if args.check:  # writes nothing: no need to hold the state directory
        run = lock.lock_cells(ctx, plans, check=True, index=lock_run.options.index_url,
                              jobs=args.jobs, all_planned=all_planned)
    else:
        with run_lock(ctx.state, wait=lock_run.options.wait):
            run = lock.lock_cells(ctx, plans, index=lock_run.options.index_url, jobs=args.jobs,
                                  all_planned=all_planned)
            if all_planned is not None:  # the whole matrix: commit what its selectors resolved
                from .plandiff import write_snapshot
                write_snapshot(ctx.root, plans)
    if args.json:
        print(json.dumps(_as_json(run), indent=2, sort_keys=True))
    else:
        _print_run(ctx, run, args.check)
    unreachable = [r for r in run.results if r.status == "unreachable"
                   and not args.allow_unreachable]
    if args.check:
        return 1 if (run.drifted or run.missing or unreachable) else 0
    return 1 if unreachable else 0


def _print_run(ctx: Context, run: LockRun, check: bool) -> None:
    from ..stages import lock

    for result in run.results:
        if result.status == "locked":
            state = "up to date" if check and result.cell_id not in run.drifted \
                and result.cell_id not in run.missing else (
                    "DRIFT" if result.cell_id in run.drifted else
                    "NO COMMITTED LOCK" if check else "locked")
            path = lock.lock_path(ctx, result.cell_id).relative_to(ctx.root)
            where = "" if check else f" -> {path}"
            packages = len(lock.pinned_packages(result.text or ""))
            print(f"{result.cell_id}: {state}{where} ({packages} packages, "
                  f"{result.duration_s:.1f} s)")
            for line in run.drifted.get(result.cell_id, []):
                print(f"    {line}")
        elif result.status == "unsatisfiable":
            print(f"{result.cell_id}: UNSATISFIABLE (pruned by plan, rule "
                  f"{lock.UNSATISFIABLE_RULE}):")
            print("\n".join("    " + ln for ln in (result.explanation or "").splitlines()))
        else:
            print(f"{result.cell_id}: INDEX UNREACHABLE (network; says nothing about the cell):")
            print("\n".join("    " + ln for ln in (result.explanation or "").splitlines()[-6:]))
    for cell_id in run.stale:
        print(f"{cell_id}: stale lock (the cell is no longer planned); remove "
              f"{lock.LOCKS_DIR}/{cell_id}.txt")
    if check and (run.drifted or run.missing):
        names = sorted(set(run.drifted) | set(run.missing))
        print(f"lock drift in {len(names)} cell(s): {', '.join(names)}", file=sys.stderr)


def _as_json(run: LockRun) -> dict[str, Any]:
    return {
        "results": [{"cell": r.cell_id, "status": r.status, "explanation": r.explanation,
                     "duration_s": round(r.duration_s, 3),
                     "inputs": r.inputs.as_dict() if r.inputs else None}
                    for r in run.results],
        "drifted": run.drifted, "missing": run.missing, "stale": run.stale,
    }


def run_verify_repro(args: argparse.Namespace) -> int:
    from ..reproducibility import repro

    repro_run = load_run(args, extra_select=[args.cell])
    ctx = repro_run.ctx
    plan = next((p for p in repro_run.plans if p.id == args.cell), None)
    if plan is None or not plan.planned:
        raise UsageError(f"{args.cell} is not a planned cell (see `infermatrix plan`)")
    if args.against_cache and not args.kernels:
        raise UsageError("--against-cache needs --kernels")
    if args.kernels:
        with run_lock(ctx.state, wait=repro_run.options.wait):
            reports = repro.verify_kernels(ctx, ctx.spec(plan), against_cache=args.against_cache,
                                           options=repro_run.options, docker=repro_run.docker)
        if args.json:
            print(json.dumps([r.__dict__ | {"differences": [d.__dict__ for d in r.differences]}
                              for r in reports], indent=2, sort_keys=True, default=str))
        else:
            print("\n".join(r.summary() for r in reports))
        return 0 if all(r.identical for r in reports) else 1
    with run_lock(ctx.state, wait=repro_run.options.wait):
        report = repro.verify_repro(ctx, ctx.spec(plan), keep=args.keep, options=repro_run.options,
                                    docker=repro_run.docker)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        print(report.summary(max_list=args.max_list))
    if args.require_digest and not report.digest_identical:
        return 1
    return 0 if report.identical else 1
