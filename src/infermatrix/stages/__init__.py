"""The pipeline's steps, one list: plan → lock → render → base → build → audit → smoke → tag →
publish → train → report (train: the training images, after every serving image; train.py).

Every step has the same interface, the `step(run, cells) -> StepRecord` of its stage module
(stages/steps.py: `Run`, the one outcome type `StepRecord`). `run` is what the loader resolved
once (context, every planned or pruned cell, run options, the Docker engine); `cells` are the
CellSpecs (model/spec.py, resolved once per run through `Run.cells`) of the planned cells the
earlier steps let through. The single-stage commands run a subset (`steps_named`). The per-cell facts go to the journal (written by each stage module,
under the same stage names: `journal.STAGES` is `STEP_NAMES`); the `StepRecord` only steers
the next step and is what the pipeline prints and keeps in <state>/run.json.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Protocol

from .. import journal
from ..context import Context
from ..model.cell import CellPlan
from ..model.spec import CellSpec
from .steps import (Run, Step, StepRecord, StepStatus, builder_groups, console,  # noqa: F401
                    echo, step_record)


def plan_cells(ctx: Context, select: Iterable[str] = (), skip: Iterable[str] = (),
               source: Any = None) -> list[CellPlan]:
    """The plan every command works from: the matrix's rules, then the lock's verdicts (a
    cell whose last `infermatrix lock` found no solution is pruned). `source`: the package
    metadata reader (default: the index through the state directory's cache)."""
    from .lock import plan_cells as planned

    return planned(ctx, select, skip, source=source)


class StepModule(Protocol):
    """A stage module of the pipeline (as cibuildwheel's platform modules): its `step` runs
    the step over the cells the earlier steps let through and records each in the journal."""

    def step(self, run: Run, cells: list[CellSpec], /) -> StepRecord: ...


def step_modules() -> tuple[tuple[str, StepModule], ...]:
    """The eleven step modules in the pipeline's order, under their step names (the journal's
    stage names). Imported when a step first runs, not with the package: the command line
    starts without every stage."""
    from . import (audit, base, build, lock, plan, publish, render, report, smoke, tagging,
                   train)

    return (("plan", plan), ("lock", lock), ("render", render), ("base", base),
            ("build", build), ("audit", audit), ("smoke", smoke), ("tag", tagging),
            ("publish", publish), ("train", train), ("report", report))


def _step(name: str) -> Step:
    """Step `name`: its module's `step`, looked up when it runs (a test may replace it)."""
    def run_it(run: Run, cells: list[CellSpec]) -> StepRecord:
        return dict(step_modules())[name].step(run, cells)
    run_it.__name__ = f"{name}.step"
    return run_it


# The names are declared once, as the journal's stage names (journal.STAGES), in order; a test
# keeps step_modules() equal to them.
STEP_NAMES = journal.STAGES
STEPS: tuple[tuple[str, Step], ...] = tuple((name, _step(name)) for name in STEP_NAMES)


def steps_named(*names: str) -> tuple[tuple[str, Step], ...]:
    """The steps of STEPS a single-stage command runs (`infermatrix build` is ("build",)):
    the same functions, so the same journal records, as the main job's."""
    unknown = set(names) - set(STEP_NAMES)
    if unknown:
        raise ValueError(f"no such step: {', '.join(sorted(unknown))}")
    return tuple(step for step in STEPS if step[0] in names)


# Steps that work on the built image: with several builders, each cell's on the engine that
# built it (the journal's `builder`).
ON_THE_BUILDER = frozenset({"audit", "smoke", "tag", "publish"})




def _step_per_builder(run: Run, name: str, step: Step, alive: list[CellSpec]) -> StepRecord:
    import dataclasses

    groups = builder_groups(run, alive) if name in ON_THE_BUILDER else [(None, alive)]
    if len(groups) == 1 and groups[0][0] is None:
        return step(run, alive)
    parts = []
    for engine_of, cells in groups:  # each group's step talks to its builder's engine
        parts.append(step(dataclasses.replace(run, docker=engine_of) if engine_of else run,
                          cells))
    status = StepStatus.RAN if any(p.status == StepStatus.RAN for p in parts) else \
        parts[0].status
    return StepRecord(name, status, [c for p in parts for c in p.passed],
                      [c for p in parts for c in p.failed],
                      [c for p in parts for c in p.dropped],
                      note="; ".join(p.note for p in parts if p.note),
                      results={k: v for p in parts for k, v in p.results.items()})


def run_steps(run: Run, steps: tuple[tuple[str, Step], ...] = STEPS,
              announce: Callable[[str], None] | None = None,
              ids: list[str] | None = None) -> list[StepRecord]:
    """Run the steps in order over the planned cells (of `ids`: a single-stage command's
    choice); a cell a step failed or dropped is left out of the later ones."""
    records: list[StepRecord] = []
    alive = [p.id for p in run.plans if p.planned and (ids is None or p.id in ids)]
    for name, step in steps:
        if announce:
            announce(name)
        started = time.monotonic()
        record = _step_per_builder(run, name, step, run.cells(alive))
        record.seconds = time.monotonic() - started
        records.append(record)
        echo(record.summary())
        gone = set(record.failed) | set(record.dropped)
        alive = [cell_id for cell_id in alive if cell_id not in gone]
        if record.failed and run.options.fail_fast:
            echo(f"--fail-fast: stopping after {name}")
            break
    return records
