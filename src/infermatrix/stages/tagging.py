"""`infermatrix tag`: tag only the cells whose smoke levels pass, on the exact image tested.

The policy (matrix.yaml `tag_policy`) names the levels that must pass. Decisions are pure
(`decide_tag`: a journal record in, a TagDecision out):
  - no image, no passed build, no finished smoke run: not tagged;
  - the image was rebuilt after the smoke run (journal image id != the tested one): not tagged;
  - any level that failed, required or not: not tagged;
  - a required level that did not run or was skipped: not tagged ("built, not verified"),
    except that a level that does not apply to the cell (gpu on a CPU cell, model for an
    engine that serves nothing: smoke records `applicable: false`) is not required,
    and, when `allow_static_only` is true, a GPU cell whose only missing levels were skipped
    for want of a GPU and whose static level passed gets a *static-only* tag.
A static-only tag cannot sit on the tested image itself, because it is marked by a label and
a label changes the image id. It goes on a derived image, committed from the tested one with
the labels `io.infermatrix.verified=static-only` and `io.infermatrix.tested-image=<id>` and
nothing else changed (its parent is the tested id); the journal records both ids.
A tag that already names another image is never moved: the cell fails with the fix.
`tag_policy.throughput` (off by default) adds a floor: min_tokens_per_s_per_gpu for GPU cells,
min_tokens_per_s_cpu for the CPU lane, on the throughput level's tokens/s per replica (one
replica per GPU); when the cell's lane has a floor, the throughput level is required.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any

from ..engine.docker import Engine
from .. import journal
from ..config import Matrix
from ..context import Context
from ..errors import ConfigError, StageFailure
from .. import levels as level_table
from ..model.cell import Cell
from ..model.spec import CellSpec
from ..outcome import Level
from ..model.tagpolicy import (DEFAULT_POLICY, STATIC_ONLY, TESTED,  # noqa: F401
                               required_levels, throughput_floor)
from .steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401

VERIFIED_LABEL = "io.infermatrix.verified"
TESTED_IMAGE_LABEL = "io.infermatrix.tested-image"


@dataclass
class TagDecision:
    cell_id: str
    allowed: bool
    reason: str
    kind: str | None = None  # tested | static-only when allowed
    image_id: str | None = None  # the tested image
    skipped: dict[str, str] = field(default_factory=dict)  # required level -> why skipped
    failed: bool = False  # the tag step itself failed (a tag naming another image): exit 1

    def as_dict(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "kind": self.kind, "reason": self.reason,
                "image_id": self.image_id, "skipped": self.skipped}


def below_floor(levels: dict[str, Level], policy: dict[str, Any], cell: Cell) -> str | None:
    """Why the measured throughput is under the policy's floor, or None."""
    floor = throughput_floor(policy, cell)
    level = levels.get("throughput", Level())
    if floor is None or level.status != "pass":
        return None
    measured = level.per_replica_tokens_per_s or 0.0
    if measured >= floor:
        return None
    unit = "GPU" if cell.is_gpu else "CPU replica"
    return (f"throughput {measured:g} output tokens/s per {unit} is under the floor "
            f"tag_policy.throughput ({floor:g})")


def skipped_for_no_gpu(level: Level) -> bool:
    return level.status == "skip" and bool(level.needs_gpu)


def required_outcomes(levels: dict[str, Level], policy: dict[str, Any],
                      cell: Cell) -> tuple[list[str], dict[str, str]]:
    """(required levels that did not run, required levels skipped -> why)."""
    missing, skipped = [], {}
    for name in required_levels(policy, cell):
        level = levels.get(name)
        if level is not None and level.applicable is False:
            continue  # e.g. model on an engine that serves nothing: recorded as not applicable
        if level is None:
            missing.append(name)
        elif level.status == "skip":
            skipped[name] = level.reason or "skipped"
        elif level.status not in ("pass", "fail"):
            missing.append(name)
    return missing, skipped


def decide_tag(record: journal.CellRecord, policy: dict[str, Any], cell: Cell) -> TagDecision:
    """Whether a cell may be tagged, and how, from its journal record alone."""
    def refuse(reason: str, **kw: Any) -> TagDecision:
        return TagDecision(cell.id, False, reason, **kw)

    image_id = record.image_id
    if not image_id or record.status_of("build") != journal.Status.PASS:
        return refuse("not built: no passed build in the journal")
    smoke = record.stage("smoke")
    if smoke is None or smoke.status == journal.Status.RUNNING:
        return refuse("not smoke-tested (no finished smoke run)", image_id=image_id)
    tested = record.smoke.image_id
    if tested != image_id:
        return refuse(f"the image was rebuilt after the smoke test (tested {tested}, built "
                      f"{image_id}): run smoke again", image_id=image_id)
    audit = record.stage("audit")
    if audit is not None and audit.status == journal.Status.FAIL:  # e.g. `infermatrix audit` run on its own after smoke
        return refuse(f"the audit failed: {audit.reason or 'see the audit stage'}",
                      image_id=image_id)
    levels = record.smoke.levels
    missing, skipped = required_outcomes(levels, policy, cell)
    failed = {name: lv.reason for name, lv in levels.items() if lv.status == "fail"}
    if failed:
        return refuse("failed: " + "; ".join(f"{n}: {r}" for n, r in failed.items()),
                      image_id=image_id, skipped=skipped)
    if missing:
        return refuse(f"required level(s) not run: {', '.join(missing)}", image_id=image_id,
                      skipped=skipped)
    slow = below_floor(levels, policy, cell)
    if slow:
        return refuse(slow, image_id=image_id, skipped=skipped)
    if not skipped:
        return TagDecision(cell.id, True, "every required level passed", TESTED, image_id)
    return static_only(cell, policy, levels, skipped, image_id)


def static_only(cell: Cell, policy: dict[str, Any], levels: dict[str, Level],
                skipped: dict[str, str], image_id: str) -> TagDecision:
    """Required levels were skipped: a static-only tag, if the policy allows it, else none."""
    why = "; ".join(f"{n}: {r}" for n, r in skipped.items())
    not_verified = f"built, not verified (required level(s) skipped: {why})"
    gpu_only = all(n in level_table.STATIC_ONLY_WAIVES and skipped_for_no_gpu(levels[n]) for n in skipped)
    static_passed = levels.get("static", Level()).status == "pass"
    if not (policy.get("allow_static_only") and cell.is_gpu and gpu_only and static_passed):
        return TagDecision(cell.id, False, not_verified, image_id=image_id, skipped=skipped)
    return TagDecision(cell.id, True, f"static only: {not_verified}", STATIC_ONLY, image_id,
                       skipped)


# --------------------------------------------------------------------------------------------
# Tag templates (publish.tag, publish.aliases): the local tag and the published ones
# --------------------------------------------------------------------------------------------

TAG_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # Docker's tag grammar


def tag_fields(cell: Cell) -> dict[str, str]:
    """What a tag template may name."""
    return {"cell_id": cell.id, "cuda": cell.cuda, "cuda_tag": cell.cuda_tag,
            "torch": cell.torch, "engine": cell.engine, "engine_version": cell.engine_version,
            "arch": cell.arch, "arch_tag": cell.arch_tag}


def render_tag(template: str, cell: Cell, matrix: Matrix | None = None,
               key_path: tuple[Any, ...] = ("publish", "tag")) -> str:
    """Fill a tag template; unknown placeholders and invalid tags are config errors."""
    fields = tag_fields(cell)
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    unknown = [n for n in names if n not in fields]
    problem = None
    if unknown:
        problem = f"unknown placeholder {{{unknown[0]}}} in tag template {template!r}"
    else:
        tag = template.format(**fields)
        if not TAG_PATTERN.fullmatch(tag):
            problem = f"tag template {template!r} gives {tag!r}, which is not a valid tag"
    if problem:
        fix = f"placeholders: {', '.join('{' + f + '}' for f in fields)}"
        if matrix is not None:
            raise matrix.error(problem, *key_path, fix=fix)
        raise ConfigError(problem, fix=fix)
    return tag


# --------------------------------------------------------------------------------------------
# Applying a decision (Docker)
# --------------------------------------------------------------------------------------------

def tag_ref(ctx: Context, cell: Cell, repository: str | None = None) -> str:
    """The local tag: `<publish.repository>:<publish.tag rendered for the cell>`."""
    publish = ctx.matrix.publish
    repo = repository or publish.get("repository", "infermatrix")
    return f"{repo}:{render_tag(publish.get('tag', '{cell_id}'), cell, ctx.matrix)}"


def static_only_labels(image_id: str) -> dict[str, str]:
    return {VERIFIED_LABEL: STATIC_ONLY, TESTED_IMAGE_LABEL: image_id}


def apply_tag(decision: TagDecision, ref: str, docker: Engine) -> dict[str, Any]:
    """Tag the tested image (or its static-only derivative) as `ref` in `docker`; never move
    a tag."""
    assert decision.allowed and decision.image_id
    current = docker.inspect_image(ref)
    if decision.kind == TESTED:
        if current is not None and current["Id"] != decision.image_id:
            raise_moved(ref, current["Id"], decision.image_id)
        if current is None:
            docker.tag_image(decision.image_id, ref)
        return {"ref": ref, "image_id": decision.image_id, "tagged_image_id": decision.image_id,
                "kind": TESTED, "unchanged": current is not None}
    labels = static_only_labels(decision.image_id)
    if current is not None:
        current_labels = (current.get("Config") or {}).get("Labels") or {}
        if current_labels.get(TESTED_IMAGE_LABEL) != decision.image_id or \
                current_labels.get(VERIFIED_LABEL) != STATIC_ONLY:
            raise_moved(ref, current["Id"], f"a static-only image of {decision.image_id}")
        derived = current["Id"]
    else:
        derived = docker.commit_with_labels(decision.image_id, ref, labels)
    return {"ref": ref, "image_id": decision.image_id, "tagged_image_id": derived,
            "kind": STATIC_ONLY, "labels": labels, "unchanged": current is not None}


def raise_moved(ref: str, current: str, wanted: str) -> None:
    raise StageFailure(f"tag {ref} already names {current}; tags are not moved (wanted "
                       f"{wanted})", fix=f"`docker rmi {ref}` if it is to be replaced, or change "
                       "publish.tag")


def tag_cell(ctx: Context, cell: Cell, repository: str | None = None,
             *, docker: Engine) -> TagDecision:
    """Decide, apply (in `docker`) and record the tag stage of one cell."""
    record = journal.cell_record(ctx.state, cell.id)
    policy = {**DEFAULT_POLICY, **(ctx.matrix.tag_policy or {})}
    decision = decide_tag(record, policy, cell)
    if not decision.allowed:
        journal.record_stage(ctx.state, cell.id, "tag", journal.Status.SKIP, reason=decision.reason,
                             details={"decision": decision.as_dict(), "policy": policy})
        return decision
    ref = tag_ref(ctx, cell, repository)
    try:
        applied = apply_tag(decision, ref, docker)
    except StageFailure as exc:
        decision.allowed, decision.reason, decision.failed = False, str(exc), True
        journal.record_stage(ctx.state, cell.id, "tag", journal.Status.FAIL, reason=str(exc),
                             details={"decision": decision.as_dict(), "ref": ref})
        return decision
    journal.record_stage(ctx.state, cell.id, "tag", journal.Status.PASS, reason=None,
                         details={**applied, "decision": decision.as_dict(), "policy": policy})
    return decision

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """Tag the exact tested image of each cell the policy allows. A refusal (a CUDA cell on a
    GPU-less host is "built, not verified") drops the cell from publish without failing the
    run; a tag that fails (its tag already names another image) is a failure."""
    tagged: list[str] = []
    refused: list[str] = []
    failed: list[str] = []
    for cell in cells:
        decision = tag_cell(run.ctx, cell.cell, run.options.tag_repository, docker=run.docker)
        outcome = tagged if decision.allowed else failed if decision.failed else refused
        outcome.append(cell.id)
        verdict = f"tagged {tag_ref(run.ctx, cell.cell, run.options.tag_repository)} " \
            f"({decision.kind}) on {(decision.image_id or '')[:19]}" if decision.allowed else (
                "tag failed" if decision.failed else "not tagged")
        echo(f"{cell.id}: {verdict}: {decision.reason}")
    return step_record("tag", tagged, failed, dropped=refused,
                       note=f"{len(refused)} not tagged" if refused else "")
