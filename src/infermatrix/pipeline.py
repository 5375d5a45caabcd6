"""The main job: the steps of `stages.STEPS` over the selected cells.

Each step works on the cells the previous one let through; a failed cell drops out of the
later steps without stopping the others (unless --fail-fast). Every step records its result
per cell in the journal, so a rerun resumes: build skips unchanged cells, and tags only ever
land on the image id that passed. The step records of the run go to <state>/run.json.
"""

from __future__ import annotations

from .state import write_json_atomic
from .stages import Run, StepRecord, console, run_steps  # noqa: F401 - console: the steps' own


def run_pipeline(run: Run) -> tuple[int, list[StepRecord]]:
    """Run every step; exit code 0 when every planned cell got as far as its policy allows."""
    records = run_steps(run, announce=lambda name: console.rule(f"[bold]{name}"))
    write_json_atomic(run.ctx.state.root / "run.json",
                      {"options": run.options.preamble(), "steps": [r.to_json() for r in records]})
    return (1 if any(r.failed for r in records) else 0), records
