"""The main job: plan → render → base → build → audit/smoke → tag → publish → report.

Each step works on the cells the previous one let through; a failed cell drops out of the
later steps without stopping the others (unless --fail-fast). Every step records its result
in the journal, so a rerun resumes: build skips unchanged cells, and tags only ever land on
the image id that passed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from rich.console import Console

from . import journal
from .context import Context
from .model import CellPlan
from .plan import plan_matrix

console = Console(stderr=True)


@dataclass
class PipelineOptions:
    select: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    fail_fast: bool = False
    levels: list[str] | None = None  # smoke levels; None: matrix.yaml's
    publish: bool = True
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    timeout_min: float | None = None
    wait: bool = False


@dataclass
class StepOutcome:
    name: str
    status: str  # "ran", "nothing to do", "not configured"
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""


def record_plan(ctx: Context, plans: list[CellPlan]) -> None:
    """Every cell's plan outcome in the journal (the report shows pruned cells too)."""
    for plan in plans:
        status = "pass" if plan.planned else "skip"
        reason = "; ".join(v.reason for v in plan.verdicts) or None
        journal.record_stage(ctx.state, plan.id, "plan", status, reason=reason,
                             details=plan.as_dict())


def _step(name: str, outcomes: list[StepOutcome], fn: Callable[[], StepOutcome]) -> StepOutcome:
    console.rule(f"[bold]{name}")
    started = time.monotonic()
    outcome = fn()
    outcome.seconds = time.monotonic() - started
    outcomes.append(outcome)
    detail = f"{len(outcome.passed)} passed, {len(outcome.failed)} failed" \
        if outcome.passed or outcome.failed else outcome.status
    console.print(f"{name}: {detail} ({outcome.seconds:.1f} s){' — ' + outcome.note if outcome.note else ''}")
    return outcome


def run_pipeline(ctx: Context, options: PipelineOptions) -> tuple[int, list[StepOutcome]]:
    """Run every step; exit code 0 when every planned cell got as far as its policy allows."""
    from . import stages  # the adapters to each stage module

    outcomes: list[StepOutcome] = []
    from .lock import prune_unsatisfiable
    plans = prune_unsatisfiable(ctx, plan_matrix(ctx, options.select, options.skip))
    record_plan(ctx, plans)
    planned = [p for p in plans if p.planned]
    unresolved = [p.id for p in plans if p.status == "unresolved"]
    outcomes.append(StepOutcome("plan", "ran", [p.id for p in planned], unresolved,
                                note=f"{sum(p.status == 'pruned' for p in plans)} pruned"))
    console.print(f"plan: {len(planned)} planned, "
                  f"{sum(p.status == 'pruned' for p in plans)} pruned, {len(unresolved)} unresolved")
    alive = list(planned)
    for name, step in stages.STEPS:
        outcome = _step(name, outcomes, lambda: step(ctx, alive, options))
        failed = set(outcome.failed)
        alive = [p for p in alive if p.id not in failed]
        if failed and options.fail_fast:
            console.print(f"[red]--fail-fast: stopping after {name}")
            break
    from .build import closing_summary
    console.rule("[bold]summary")
    for line in closing_summary(ctx, plans):
        console.print(line, markup=False, highlight=False)
    failed_any = any(o.failed for o in outcomes)
    return (1 if failed_any else 0), outcomes
