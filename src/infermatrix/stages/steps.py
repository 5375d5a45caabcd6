"""What every step shares: the `Run` the loader resolves once, the one outcome type
`StepRecord` (with `StepStatus`), `record` that makes it, and `echo` for a stage's lines. Each
pipeline step is the `step(run, cells) -> StepRecord` of its stage module (stages.STEPS)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable

from rich.console import Console

from .. import journal
from ..context import Context
from ..engine.docker import Engine
from ..model.cell import CellPlan
from ..model.spec import CellSpec
from ..options import RunOptions

console = Console(stderr=True)


def echo(line: str) -> None:
    """Print a stage's line as it is: log tails hold `[...]` that rich would read as markup,
    and a command or an image id is not wrapped at the console's width (copied, grepped)."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)

class StepStatus(StrEnum):
    RAN = "ran"
    NOTHING_TO_DO = "nothing to do"
    NOT_CONFIGURED = "not configured"

@dataclass
class StepRecord:
    """What one step did over the cells it was given."""

    name: str
    status: StepStatus
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # left out of later steps, not failures
    seconds: float = 0.0
    note: str = ""
    # each cell's result object, for the command that ran the step to show (audit's tables);
    # not in run.json: the journal keeps them
    results: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": str(self.status), "passed": self.passed,
                "failed": self.failed, "dropped": self.dropped,
                "seconds": round(self.seconds, 3), "note": self.note}

    def summary(self) -> str:
        detail = f"{len(self.passed)} passed, {len(self.failed)} failed" \
            if self.passed or self.failed else str(self.status)
        return f"{self.name}: {detail} ({self.seconds:.1f} s)" + \
            (f" — {self.note}" if self.note else "")

@dataclass
class Run:
    """What every step reads: resolved once by the loader (cli.load_run or the pipeline)."""

    ctx: Context
    plans: list[CellPlan]  # every selected cell, planned, pruned or unresolved
    options: RunOptions
    select: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    # The Docker engine the steps talk to, passed by hand to every stage function (with
    # several builders, a step over one builder's cells gets a Run whose `docker` is that
    # builder's: _step_per_builder).
    docker: Engine = field(default_factory=Engine)
    # cell id -> the image to take instead of the journal's build (`infermatrix audit IMAGE`)
    images: dict[str, str] = field(default_factory=dict)

    def cells(self, ids: list[str] | None = None) -> list[CellSpec]:
        """The CellSpec of each planned cell (of `ids`, in the run's order): what every step
        receives. Resolved once per run by the context (again only for a cell whose lock the
        lock step just wrote)."""
        wanted = None if ids is None else set(ids)
        return self.ctx.specs(p for p in self.plans if wanted is None or p.id in wanted)


def step_record(name: str, passed: list[str], failed: list[str], note: str = "",
                dropped: list[str] | None = None) -> StepRecord:
    status = StepStatus.RAN if passed or failed or dropped else StepStatus.NOTHING_TO_DO
    return StepRecord(name, status, passed, failed, dropped or [], note=note)


Step = Callable[[Run, list[CellSpec]], StepRecord]


def builder_groups(run: Run, alive: list[CellSpec]) -> list[tuple[Any, list[CellSpec]]]:
    """(engine or None for the default one, its cells), by the builder each cell was built on."""
    from ..engine.builders import endpoints_for

    if not alive:  # nothing left (every cell failed earlier): the step runs on no cell
        return [(None, alive)]
    endpoints = {e.name: e for e in endpoints_for(run.ctx.matrix, run.options.builders)}
    if not endpoints:
        return [(None, alive)]
    engines: dict[str, Any] = {}
    groups: dict[str | None, list[CellSpec]] = {}
    for plan in alive:
        name = journal.cell_record(run.ctx.state, plan.id).builder_name
        key = name if name in endpoints else None
        if key and key not in engines:
            engines[key] = Engine(endpoints[key])
        groups.setdefault(key, []).append(plan)
    return [(engines.get(key) if key else None, cells) for key, cells in groups.items()]
