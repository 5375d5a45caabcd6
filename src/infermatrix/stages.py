"""The pipeline's steps: thin adapters from `pipeline.run_pipeline` to each stage module.

Each step takes the cells still alive and returns which passed and which failed; the journal
(written by the stage modules) is the record, these outcomes only steer the next step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from rich.console import Console

from .context import Context
from .model import CellPlan
from .selectors import Selection

if TYPE_CHECKING:
    from .pipeline import PipelineOptions, StepOutcome

console = Console(stderr=True)


def echo(line: str) -> None:
    """Print a stage's line as it is: log tails hold `[...]` that rich would read as markup."""
    console.print(line, markup=False, highlight=False)


def _outcome(name: str, passed: list[str], failed: list[str], note: str = "") -> "StepOutcome":
    from .pipeline import StepOutcome
    return StepOutcome(name, "ran" if passed or failed else "nothing to do", passed, failed,
                       note=note)


def step_lock(ctx: Context, plans: list[CellPlan], options: "PipelineOptions") -> "StepOutcome":
    """Builds install from the committed locks; say which cells have none (build refuses
    them until `infermatrix lock` is run for them and the lock committed)."""
    from .lock import lock_path
    missing = [p.id for p in plans if not lock_path(ctx, p.id).is_file()]
    note = (f"no lock for {len(missing)} cell(s), their build is refused: run `infermatrix "
            "lock`" if missing else "")
    return _outcome("lock", [p.id for p in plans if p.id not in missing], [], note)


def step_render(ctx: Context, plans: list[CellPlan], options: "PipelineOptions") -> "StepOutcome":
    from .render import render_cells
    render_cells(ctx, plans)
    return _outcome("render", [p.id for p in plans], [])


def step_base(ctx: Context, plans: list[CellPlan], options: "PipelineOptions") -> "StepOutcome":
    """Build (or find) the debootstrap bases the cells stand on, for each image platform. A
    base that cannot be made here (an arm64 base on an x86_64 host without an emulator) fails
    the cells that need it, with the fix, and not the others."""
    from .base import build_base, debootstrap_bases
    from .errors import InfermatrixError
    debootstrap = set(debootstrap_bases(ctx.matrix))
    needs: dict[tuple[str, str], list[str]] = {}
    for plan in plans:
        if plan.settings:
            for name in _with_parents(ctx, {plan.settings.base}) & debootstrap:
                needs.setdefault((name, plan.settings.platform), []).append(plan.id)
    made, failed = [], []
    for (name, platform), cells in sorted(needs.items()):
        try:
            result = build_base(ctx.matrix, name, ctx.state, platform=platform)
            echo(f"base {name} ({platform}): {result.ref}")
            made.append(name)
        except InfermatrixError as exc:
            echo(f"base {name} ({platform}): {exc}")
            failed += cells
    alive = [p.id for p in plans if p.id not in failed]
    return _outcome("base", alive, sorted(set(failed)), note=", ".join(sorted(set(made))))


def _with_parents(ctx: Context, names: set[str]) -> set[str]:
    definitions = ctx.matrix.bases["definitions"]
    result = set(names)
    for name in names:
        parent = definitions.get(name, {}).get("from")
        while parent and parent not in result:
            result.add(parent)
            parent = definitions.get(parent, {}).get("from")
    return result


def step_build(ctx: Context, plans: list[CellPlan], options: "PipelineOptions") -> "StepOutcome":
    from .build import BuildOptions, build_cells
    results = build_cells(ctx, plans, BuildOptions(
        fail_fast=options.fail_fast, timeout_min=options.timeout_min, max_jobs=options.max_jobs,
        nvcc_threads=options.nvcc_threads, wait=options.wait, echo=echo))
    passed = [i for i, r in results.items() if r.status == "pass"]
    failed = [i for i, r in results.items() if r.status == "fail"]
    return _outcome("build", passed, failed)


def step_smoke(ctx: Context, plans: list[CellPlan], options: "PipelineOptions") -> "StepOutcome":
    """static (the audit + imports) → gpu → model, per matrix.yaml or --levels."""
    from .smoke import SmokeOptions, smoke_cells
    results = smoke_cells(ctx, plans, SmokeOptions(levels=options.levels))
    passed = [r.cell_id for r in results if r.status != "fail"]
    failed = [r.cell_id for r in results if r.status == "fail"]
    return _outcome("smoke", passed, failed)


def step_tag(ctx: Context, plans: list[CellPlan], options: "PipelineOptions") -> "StepOutcome":
    """Tag the exact tested image of each cell the policy allows; refusals are not failures
    of the run (a CUDA cell on a GPU-less host is "built, not verified")."""
    from .tagging import tag_cell
    tagged, refused = [], []
    for plan in plans:
        decision = tag_cell(ctx, plan.cell)
        (tagged if decision.allowed else refused).append(plan.id)
        verdict = f"tagged ({decision.kind})" if decision.allowed else "not tagged"
        echo(f"{plan.id}: {verdict}: {decision.reason}")
    return _outcome("tag", tagged, [], note=f"{len(refused)} not tagged" if refused else "")


def step_publish(ctx: Context, plans: list[CellPlan], options: "PipelineOptions") -> "StepOutcome":
    from .pipeline import StepOutcome
    from .publish import publish, registry_configured
    if not options.publish or not registry_configured(ctx.matrix):
        return StepOutcome("publish", "not configured",
                           note="no publish.registry in matrix.yaml (or --no-publish)")
    result = publish(ctx, Selection([p.id for p in plans]), say=echo)
    return _outcome("publish", [*result.pushed, *result.unchanged],
                    [*result.refused, *result.failed])


def step_report(ctx: Context, plans: list[CellPlan], options: "PipelineOptions") -> "StepOutcome":
    """The HTML/Markdown/JSON report over every cell of the plan, pruned ones included."""
    from .cli.report import fill_image_sizes
    from .plan import plan_matrix
    from .report import build_report, load_journal, print_summary, write_report
    records = load_journal(ctx.state)
    fill_image_sizes(records)
    report = build_report(records, plan_matrix(ctx, options.select, options.skip), ctx.state)
    files = write_report(report, ctx.state.reports)
    print_summary(report, files.html)
    from .pipeline import StepOutcome
    return StepOutcome("report", "written", note=str(files.html))


Step = Callable[[Context, list[CellPlan], "PipelineOptions"], "StepOutcome"]

STEPS: list[tuple[str, Step]] = [
    ("lock", step_lock), ("render", step_render), ("base", step_base), ("build", step_build),
    ("smoke", step_smoke), ("tag", step_tag), ("publish", step_publish), ("report", step_report),
]
