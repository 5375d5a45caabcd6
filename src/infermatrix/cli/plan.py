"""`infermatrix plan`: the cells of the matrix, planned or pruned, with every reason."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..context import Context
from ..stages.lock import prune_unsatisfiable
from ..model.cell import CellPlan, CellSettings
from ..stages.plan import Plan, passed_over_notes, plan_full
from ..options import from_environment, package_index
from ..state import state_lock
from . import common_options, load_context, selection_options, wait_option
from .views import STATUS_STYLE, plan_view, print_lines


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="expand matrix.yaml and prune impossible cells",
                            description="Expand the axes of matrix.yaml into cells (engine "
                            "releases resolved from the package index, torch from the engine) "
                            "and prune the ones that cannot work, naming each rule and its source.")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--planned", action="store_true", help="list planned cells only")
    parser.add_argument("--all", action="store_true",
                        help="one row per cell, pruned ones included, each reason in full with "
                        "its source (default: one line per cell, pruned ones grouped by rule, "
                        "each reason once below)")
    parser.add_argument("--diff", action="store_true",
                        help="what changed since the committed plan (locks/plan.json, written "
                        "by `infermatrix lock`): cells that appear or go away, and why; exit 1 "
                        "when something changed")
    parser.add_argument("--forecast", action="store_true",
                        help="after the plan, what building the planned cells would take on "
                        "this host (time per cell, disk, memory, total, critical path), "
                        "without building")
    wait_option(parser)
    parser.set_defaults(func=run)


def load_full_plan(args: argparse.Namespace) -> tuple[Context, Plan]:
    """The plan with what was never generated (`plan` shows it); other commands take
    cli.load_run's cells, planned the same way."""
    ctx = load_context(args)
    return ctx, plan_full(ctx, args.select, args.skip)


def _backend_text(settings: CellSettings) -> str:
    """The backend and where it comes from: the engine's own default (rules.yaml, read from its
    released code) or a matrix.yaml override; the full why is in `plan --json` source_urls."""
    why = settings.source_urls.get("attention_backend", "")
    if not settings.attention_backend:
        return ""
    origin = "matrix.yaml" if why.startswith("matrix.yaml") else "engine default"
    return f"attention={settings.attention_backend} ({origin})"


def _settings_text(plan: CellPlan) -> str:
    s = plan.settings
    if s is None:
        return ""
    parts = [_backend_text(s), ",".join(s.kernels),
             f"driver>={s.driver_floor}" if s.driver_floor else ""]
    if plan.resolution and plan.resolution.get("resolved_at"):
        selector = plan.resolution["selector"]
        skipped = [w.partition(":")[0] for w in plan.resolution.get("passed_over", [])]
        parts.append(f"{selector} (not {', '.join(skipped)})" if skipped else selector)
    return " ".join(p for p in parts if p)


def profile_lines(plan: CellPlan) -> list[str]:
    """`plan --all`: each serve profile's verdict on the cell, with the FP8 GEMM object and
    kernel it runs, the attention backend, the capacity figure, or the reason it is not planned."""
    lines = []
    for p in (plan.settings.profiles if plan.settings else None) or []:
        parts = [f"profile {p['profile']} {p['status']} ({p['checkpoint']}"
                 + (f"; {' '.join(p['engine_args'])}" if p.get("engine_args") else "") + ")"]
        gemm = p.get("fp8_gemm") or {}
        if gemm.get("coverage"):
            parts.append(f"FP8 GEMM {gemm['member']}"
                         + (f" {gemm['kernel']}" if gemm.get("kernel") else "")
                         + f": {gemm['coverage']}" + (f" by {gemm['by']}" if gemm.get("by") else ""))
        kv = p.get("fp8_kv") or {}
        if kv.get("backend"):
            moved = kv.get("instead_of") not in (None, kv["backend"])
            parts.append(f"FP8 KV on {kv['backend']}"
                         + (f" (instead of {kv['instead_of']})" if moved else ""))
        if (p.get("capacity") or {}).get("tokens_per_s") is not None:
            c = p["capacity"]
            parts.append(f"{c['tokens_per_s']:,.0f} tok/s/GPU at {c['max_sequences']} seqs "
                         f"({c['gpu']})")
        parts += [f"{r['rule']}: {r['reason']}" for r in p.get("reasons") or []]
        lines.append("; ".join(parts))
    return lines


def plan_table(plans: list[CellPlan], every_row: bool = False) -> Table:
    table = Table(title="infermatrix plan", show_lines=False)
    table.add_column("cell", no_wrap=True)
    table.add_column("status")
    table.add_column("settings / reasons", overflow="fold")
    grouped: dict[str, list[CellPlan]] = defaultdict(list)
    for plan in plans:
        style = STATUS_STYLE.get(plan.status, "white")
        if plan.status == "pruned" and not every_row:
            grouped[plan.verdicts[0].rule if plan.verdicts else "?"].append(plan)
            continue
        if plan.verdicts:
            text = "\n".join(f"{v.rule}: {v.reason}" + (f" — {v.source}" if every_row else "")
                             for v in plan.verdicts)
        else:
            text = _settings_text(plan)
        if every_row:
            text = "\n".join([text, *profile_lines(plan)]).strip("\n")
        table.add_row(plan.id, f"[{style}]{plan.status}[/{style}]", escape(text))
    for rule, members in sorted(grouped.items(), key=lambda kv: -len(kv[1])):
        example = members[0].verdicts[0]
        table.add_row(f"{len(members)} × {rule}", "[yellow]pruned[/yellow]",
                      f"e.g. {members[0].id}: {example.reason} (--all: every row)")
    return table


def run(args: argparse.Namespace) -> int:
    ctx = load_context(args, log=False)  # bad input writes nothing
    # planning writes the metadata cache; offline it only reads: beside a run (issue 47)
    with state_lock(ctx.state, shared=ctx.offline, wait=args.wait):
        ctx, full = load_full_plan(args)
    plans = full.cells
    prune_unsatisfiable(ctx, plans)  # cells whose last `infermatrix lock` found no solution
    if args.diff:
        return _print_diff(ctx, plans, whole=not (args.select or args.skip))
    if args.planned:
        plans = [p for p in plans if p.planned]
    if args.json:
        print(json.dumps([p.as_dict() for p in plans], indent=2, sort_keys=True))
        return 0
    console = Console()
    if args.all:  # every row, every reason in full with its source
        console.print(plan_table(plans, every_row=True))
    else:  # one line per cell, the reasons once each below
        print_lines(plan_view(plans, _settings_text), console)
    counts = {s: sum(p.status == s for p in plans)
              for s in ("planned", "unverified", "pruned", "unresolved")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no cells"
    newest = passed_over_notes(plans)
    if newest:  # said in the summary line itself, then each in full
        summary += f"; {len(newest)} \"latest\" passed over a newer release (below)"
    console.print(summary)
    for line in newest:
        console.print(f"[bold yellow]NOT THE NEWEST:[/bold yellow] {escape(line)}")
    for why, n in sorted(full.not_generated.items()):
        console.print(f"not generated: {n} combination(s) with a {why}")
    if args.forecast:
        _print_forecast(ctx, plans, args)
    return 0


def _print_forecast(ctx: Context, plans: list[CellPlan], args: argparse.Namespace) -> None:
    """`plan --forecast`: the pipeline's forecast table for the planned cells (issue 47)."""
    from ..options import resolve
    from ..stages.forecast import print_forecast

    print_forecast(ctx, ctx.specs(plans), resolve(args, ctx.matrix.data), print)


def _print_diff(ctx: Context, plans: list[CellPlan], whole: bool) -> int:
    """`plan --diff`; a damaged plan file is rebuilt from the plan of the `whole` matrix."""
    from . import plandiff
    from ..model.index import IndexUnavailable, release_list

    committed = plandiff.load_snapshot(ctx.root, plans if whole else None)
    if committed is None:
        print(f"no committed plan at {plandiff.plan_path(ctx.root)} (run `infermatrix lock`)")
        return 1
    on_index: dict[str, set[str]] = {}
    for engine, spec in ctx.matrix.engines.items():
        if spec.get("package"):
            try:
                listing = release_list(ctx.state.index_cache, spec["package"], offline=ctx.offline,
                                       index=package_index(),
                                       ttl_s=from_environment("index_ttl_s"))
                on_index[engine] = set(listing.versions)
            except IndexUnavailable:
                pass
    lines = plandiff.diff(committed, plandiff.snapshot(plans), on_index)
    for line in lines:
        print(line)
    print(f"{len(lines)} change(s) since {plandiff.plan_path(ctx.root).relative_to(ctx.root)}"
          if lines else "no change since the committed plan")
    return 1 if lines else 0
