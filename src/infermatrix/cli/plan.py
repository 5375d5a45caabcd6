"""`infermatrix plan`: the cells of the matrix, planned or pruned, with every reason."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from ..model import CellPlan
from . import common_options, load_run, selection_options

STATUS_STYLE = {"planned": "green", "pruned": "yellow", "unresolved": "magenta"}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="expand matrix.yaml and prune impossible cells",
                            description="Expand the axes of matrix.yaml into cells and prune the "
                            "ones that cannot work, naming each rule and its source.")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--planned", action="store_true", help="list planned cells only")
    parser.set_defaults(func=run)


def plan_table(plans: list[CellPlan]) -> Table:
    table = Table(title="infermatrix plan", show_lines=False)
    table.add_column("cell", no_wrap=True)
    table.add_column("status")
    table.add_column("reasons (rule: reason — source)", overflow="fold")
    for plan in plans:
        style = STATUS_STYLE.get(plan.status, "")
        if plan.verdicts:
            reasons = "\n".join(f"{v.rule}: {v.reason} — {v.source}" for v in plan.verdicts)
        else:
            s = plan.settings
            reasons = (f"base {s.base}, python {s.python}"
                       + (f", attention {s.attention_backend}" if s and s.attention_backend else "")
                       + (f", kernels {', '.join(s.kernels)}" if s and s.kernels else "")) if s else ""
        table.add_row(plan.id, f"[{style}]{plan.status}[/{style}]", reasons)
    return table


def run(args: argparse.Namespace) -> int:
    plans = load_run(args).plans  # the lock's verdicts included
    if args.planned:
        plans = [p for p in plans if p.planned]
    if args.json:
        json.dump([p.as_dict() for p in plans], sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    console = Console()
    console.print(plan_table(plans))
    counts = {s: sum(p.status == s for p in plans) for s in ("planned", "pruned", "unresolved")}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no cells")
    return 0
