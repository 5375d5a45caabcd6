"""The pipeline's steps, one list: plan → lock → render → base → build → audit → smoke → tag →
publish → report.

Every step has the same interface: `step(run, alive) -> StepRecord`. `run` is what the loader
resolved once (context, every planned or pruned cell, run options); `alive` are the cells the
earlier steps let through. The per-cell facts go to the journal (written by each stage module,
under the same stage names: `journal.STAGES` is `STEP_NAMES`); the `StepRecord` only steers
the next step and is what the pipeline prints and keeps in <state>/run.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Iterable

from rich.console import Console

from .. import journal
from ..context import Context
from ..engine.docker import Engine
from ..model.cell import CellPlan
from ..options import RunOptions
from ..model.selectors import Selection

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


def _record(name: str, passed: list[str], failed: list[str], note: str = "",
            dropped: list[str] | None = None) -> StepRecord:
    status = StepStatus.RAN if passed or failed else StepStatus.NOTHING_TO_DO
    return StepRecord(name, status, passed, failed, dropped or [], note=note)


def plan_cells(ctx: Context, select: Iterable[str] = (), skip: Iterable[str] = (),
               source: Any = None) -> list[CellPlan]:
    """The plan every command works from: the matrix's rules, then the lock's verdicts (a
    cell whose last `infermatrix lock` found no solution is pruned). `source`: the package
    metadata reader (default: the index through the state directory's cache)."""
    from .lock import prune_unsatisfiable
    from .plan import plan_matrix

    return prune_unsatisfiable(ctx, plan_matrix(ctx, select, skip, source=source))


def step_plan(run: Run, alive: list[CellPlan]) -> StepRecord:
    """Every cell's plan outcome in the journal (the report shows pruned cells too)."""
    for plan in alive:
        status = journal.Status.PASS if plan.planned else journal.Status.SKIP
        reason = "; ".join(v.reason for v in plan.verdicts) or None
        journal.record_stage(run.ctx.state, plan.id, "plan", status, reason=reason,
                             details=plan.as_dict())
    pruned = [p.id for p in alive if p.status == "pruned"]
    return _record("plan", [p.id for p in alive if p.planned],
                   [p.id for p in alive if p.status == "unresolved"],
                   note=f"{len(pruned)} pruned", dropped=pruned)


def step_lock(run: Run, alive: list[CellPlan]) -> StepRecord:
    """Builds install from the committed locks; say which cells have none (build refuses
    them until `infermatrix lock` is run for them and the lock committed)."""
    from ..model.spec import lock_path
    missing = [p.id for p in alive if not lock_path(run.ctx, p.id).is_file()]
    note = (f"no lock for {len(missing)} cell(s), their build is refused: run `infermatrix "
            "lock`" if missing else "")
    return _record("lock", [p.id for p in alive if p.id not in missing], [], note)


def step_render(run: Run, alive: list[CellPlan]) -> StepRecord:
    from ..model.spec import check_lock_files
    from .render import render_cells
    check_lock_files(run.ctx, alive)
    render_cells(run.ctx, alive)
    return _record("render", [p.id for p in alive], [])


def step_base(run: Run, alive: list[CellPlan]) -> StepRecord:
    """Build (or find) the debootstrap bases the cells stand on, for each image platform. A
    base that cannot be made here (an arm64 base on an x86_64 host without an emulator) fails
    the cells that need it, with the fix, and not the others."""
    from .base import build_base, debootstrap_bases
    from ..errors import InfermatrixError
    from ..model.spec import base_chain
    debootstrap = set(debootstrap_bases(run.ctx.matrix))
    needs: dict[tuple[str, str], list[str]] = {}
    for plan in alive:
        if plan.settings:
            for name in set(base_chain(run.ctx.matrix, plan.settings.base)) & debootstrap:
                for platform in _base_platforms(run, plan):
                    needs.setdefault((name, platform), []).append(plan.id)
    made: list[str] = []
    failed: dict[str, str] = {}  # cell -> why
    refs: dict[str, list[str]] = {}
    for (name, platform), cells in sorted(needs.items()):
        try:
            result = build_base(run.ctx.matrix, name, run.ctx.state, platform=platform,
                                echo=echo, docker=run.docker)
            echo(f"base {name} ({platform}): {result.ref}")
            made.append(name)
            for cell_id in cells:
                refs.setdefault(cell_id, []).append(result.ref)
        except InfermatrixError as exc:
            echo(f"base {name} ({platform}): {exc}")
            failed.update({cell_id: f"base {name} ({platform}): {exc}" for cell_id in cells})
    for plan in alive:
        if plan.id in failed:
            journal.record_stage(run.ctx.state, plan.id, "base", journal.Status.FAIL,
                                 reason=failed[plan.id])
        elif plan.id in refs:
            journal.record_stage(run.ctx.state, plan.id, "base", journal.Status.PASS,
                                 details={"images": refs[plan.id]})
    passed = [p.id for p in alive if p.id not in failed]
    return _record("base", passed, sorted(failed), note=", ".join(sorted(set(made))))


def _base_platforms(run: Run, plan: CellPlan) -> list[str]:
    """The platforms whose base a cell builds on: its image's, and this machine's when its
    byte-code is compiled on the build machine's CPU (templates/blocks/bytecode.j2)."""
    from .render import bytecode_hosts
    from ..engine.docker import host_platform
    assert plan.settings is not None
    platforms = [plan.settings.platform]
    if bytecode_hosts(run.ctx.matrix, plan) and host_platform() not in platforms:
        platforms.append(host_platform())
    return platforms


def step_build(run: Run, alive: list[CellPlan]) -> StepRecord:
    from .build import build_cells
    results = build_cells(run.ctx, alive, run.options, echo=echo, docker=run.docker)
    passed = [i for i, r in results.items() if r.status == "pass"]
    failed = [i for i, r in results.items() if r.status == "fail"]
    return _record("build", passed, failed)


def step_audit(run: Run, alive: list[CellPlan]) -> StepRecord:
    """Kernel coverage, CUDA major, pins, pip check and the engine floor of each built image,
    without a GPU (smoke's static level then reuses this record for the same image)."""
    from .audit import audit_cell
    from ..engine.docker import host_platform
    from ..errors import InfermatrixError
    from ..model.tritontwin import natives_first, twin_archs_for
    passed, failed = [], []
    host = host_platform()
    for plan in natives_first(alive, host):  # a twin's Triton result before its foreign cell
        image = journal.load(run.ctx.state, plan.id).get("image_id")
        try:
            result = audit_cell(run.ctx, plan, image,
                                twin_archs=twin_archs_for(plan, run.plans, host),
                                docker=run.docker)
            ok = result.passed
            echo(f"{plan.id}: audit {result.status}" +
                 (f": {result.reason}" if result.reason else ""))
        except InfermatrixError as exc:
            ok = False
            echo(f"{plan.id}: audit failed: {exc}")
        (passed if ok else failed).append(plan.id)
    return _record("audit", passed, failed)


def step_smoke(run: Run, alive: list[CellPlan]) -> StepRecord:
    """static (imports; the audit of the step before) → gpu → model, per matrix.yaml or
    --levels."""
    from .smoke import smoke_cells
    results = smoke_cells(run.ctx, alive, run.options, docker=run.docker,
                          on_result=lambda result: echo("\n".join(result.lines())))
    passed = [r.cell_id for r in results if r.status != "fail"]
    failed = [r.cell_id for r in results if r.status == "fail"]
    return _record("smoke", passed, failed)


def step_tag(run: Run, alive: list[CellPlan]) -> StepRecord:
    """Tag the exact tested image of each cell the policy allows; refusals are not failures
    of the run (a CUDA cell on a GPU-less host is "built, not verified"), a tag step that
    fails (its tag already names another image) is."""
    from .tagging import tag_cell
    tagged, refused, failed = [], [], []
    for plan in alive:
        decision = tag_cell(run.ctx, plan.cell, docker=run.docker)
        outcome = tagged if decision.allowed else failed if decision.failed else refused
        outcome.append(plan.id)
        verdict = f"tagged ({decision.kind})" if decision.allowed else (
            "tag failed" if decision.failed else "not tagged")
        echo(f"{plan.id}: {verdict}: {decision.reason}")
    return _record("tag", tagged, failed, note=f"{len(refused)} not tagged" if refused else "")


def step_publish(run: Run, alive: list[CellPlan]) -> StepRecord:
    from .publish import publish, registry_configured
    if not run.options.publish or not registry_configured(run.ctx.matrix):
        return StepRecord("publish", StepStatus.NOT_CONFIGURED,
                          note="no publish.registry in matrix.yaml (or --no-publish)")
    if not alive:  # an empty selection would mean every cell
        return _record("publish", [], [])
    result = publish(run.ctx, Selection([p.id for p in alive]), say=echo, docker=run.docker,
                     plans=alive)  # their CellSpecs give images.lock's serve command
    return _record("publish", [*result.pushed, *result.unchanged],
                   [*result.refused, *result.failed])


def step_report(run: Run, alive: list[CellPlan]) -> StepRecord:
    """The HTML/Markdown/JSON report over every cell of the plan, pruned ones included (the
    plan of this run: the lock's verdicts are in it)."""
    from .report import build_report, fill_image_sizes, print_summary, write_report
    records = journal.load_records(run.ctx.state)
    fill_image_sizes(records, run.docker)
    report = build_report(records, run.plans, run.ctx.state)
    files = write_report(report, run.ctx.state.reports)
    print_summary(report, files.html)
    return StepRecord("report", StepStatus.RAN, note=str(files.html))


Step = Callable[[Run, list[CellPlan]], StepRecord]

# The names are declared once, as the journal's stage names (journal.STAGES); each step is
# the function `step_<name>` above, in that order.
STEPS: tuple[tuple[str, Step], ...] = tuple((name, globals()[f"step_{name}"])
                                            for name in journal.STAGES)
STEP_NAMES = journal.STAGES


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


def builder_groups(run: Run, alive: list[CellPlan]) -> list[tuple[Any, list[CellPlan]]]:
    """(engine or None for the default one, its cells), by the builder each cell was built on."""
    from .builders import endpoints_for

    endpoints = {e.name: e for e in endpoints_for(run.ctx.matrix, run.options.builders)}
    if not endpoints:
        return [(None, alive)]
    engines: dict[str, Any] = {}
    groups: dict[str | None, list[CellPlan]] = {}
    for plan in alive:
        name = (journal.load(run.ctx.state, plan.id).get("builder") or {}).get("name")
        key = name if name in endpoints else None
        if key and key not in engines:
            engines[key] = Engine(endpoints[key])
        groups.setdefault(key, []).append(plan)
    return [(engines.get(key) if key else None, cells) for key, cells in groups.items()]


def _step_per_builder(run: Run, name: str, step: Step, alive: list[CellPlan]) -> StepRecord:
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
                      note="; ".join(p.note for p in parts if p.note))


def run_steps(run: Run, steps: tuple[tuple[str, Step], ...] = STEPS,
              announce: Callable[[str], None] | None = None) -> list[StepRecord]:
    """Run the steps in order; a cell a step failed or dropped is left out of the later ones."""
    records: list[StepRecord] = []
    alive = list(run.plans)
    for name, step in steps:
        if announce:
            announce(name)
        started = time.monotonic()
        record = _step_per_builder(run, name, step, alive)
        record.seconds = time.monotonic() - started
        records.append(record)
        echo(record.summary())
        gone = set(record.failed) | set(record.dropped)
        alive = [p for p in alive if p.id not in gone]
        if record.failed and run.options.fail_fast:
            echo(f"--fail-fast: stopping after {name}")
            break
    return records
