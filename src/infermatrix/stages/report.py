"""The report: the whole matrix at a glance, from the journal and the plan.

`build_report(journal, plans)` is pure: it turns journal records (`journal.load_records`) and
the run's typed plans (`CellPlan`) into a `Report`: one `CellReport` per cell with its outcome,
stage results and the facts people look for (image size, versions, kernel coverage, smoke
throughput, the failing log tail). A cell goes Cell → CellPlan → CellReport, never through a
plan dict. Plans come from storage at two edges only, each read back once with
`CellPlan.from_dict`: the plan a journal-only cell recorded (`CellRecord.recorded_plan`) and a
plan JSON file (`load_plan_file`, `infermatrix plan --json` output). Journals are partial by
nature (interrupted runs, stages that never ran, records of other versions): the stages'
details are read typed (`CellRecord.build`, `.audit`, `.smoke`, ...; outcome.py), a missing
key or a value of another type an empty field, so a report never crashes on a journal.

Outputs (`write_report`): `report.html` (one self-contained file, Jinja template in
templates/report/, autoescaped, no external assets), `report.md` (a pull-request comment or a
release note) and `report.json` (for machines). `summary_table` is the rich table printed at
the end of a build that points to the HTML file.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:
    from ..engine.docker import Engine
from urllib.parse import quote, urlsplit

import jinja2
from packaging.version import InvalidVersion, Version
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import journal
from ..journal import CellRecord, StageRecord, records_of
from .. import levels as level_table
from ..model.cell import CellPlan
from ..model.spec import CellSpec
from ..outcome import AuditDetails, Level, LockEntry, Signing, SmokeDetails
from ..outcome import number_of as _number
from ..outcome import text_of as _text
from ..errors import InfermatrixError, StageFailure
from ..state import StatePaths, write_text_beside
from .steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401

TEMPLATE_DIR = Path(__file__).resolve().parents[3] / "templates" / "report"

# Outcomes, best first: (key, label, colour). The HTML grid, the legend, the Markdown and the
# tests all read this table.
OUTCOMES: tuple[tuple[str, str, str], ...] = (
    ("tagged", "tagged", "#2e7d32"),
    ("verified", "verified, not tagged", "#1565c0"),
    ("built", "built, not verified", "#f9a825"),
    ("failed", "failed", "#c62828"),
    ("not-built", "not built", "#b0bec5"),
    ("pruned", "pruned", "#eceff1"),
)
OUTCOME_LABELS = {key: label for key, label, _ in OUTCOMES}
OUTCOME_COLOURS = {key: colour for key, _, colour in OUTCOMES}
OUTCOME_ICONS = {"tagged": "✅", "verified": "🔵", "built": "🟡", "failed": "❌",
                 "not-built": "⚪", "pruned": "➖"}

LOG_TAIL_LINES = 40
LOG_TAIL_CHARS = 8000
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")


# A stage row of the report is the journal's typed stage record.
StageResult = StageRecord
UNKNOWN_AXES = {"cuda": "?", "torch": "?", "engine": "?", "arch": "?"}


@dataclass
class CellReport:
    id: str
    axes: dict[str, str]
    plan_status: str  # planned, pruned, unresolved, or "unknown" (journal only)
    outcome: str  # a key of OUTCOMES
    failed_stage: str | None = None
    interrupted_stage: str | None = None  # a stage left "running" (run killed)
    reasons: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    stages: list[StageResult] = field(default_factory=list)
    image_id: str | None = None
    image_size: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    coverage_columns: list[str] = field(default_factory=list)
    coverage_rows: list[dict[str, Any]] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)
    smoke_levels: list[dict[str, Any]] = field(default_factory=list)
    throughput: dict[str, Any] | None = None  # the throughput level's chart (throughput_chart)
    workload: dict[str, Any] | None = None  # the workload level's view (workload_view)
    tokens_per_s: float | None = None  # the best figure (concurrent, usually)
    tokens_text: str = ""  # every figure: "single 41.7, concurrent 118.4"
    audit_checks: list[dict[str, str]] = field(default_factory=list)
    log_tail: str | None = None
    in_plan: bool = True
    problems: list[str] = field(default_factory=list)  # e.g. an unreadable journal record
    signing: dict[str, Any] | None = None  # a published cell's signing status (signing_status)

    @property
    def label(self) -> str:
        if self.outcome == "failed" and self.failed_stage:
            return f"failed at {self.failed_stage}"
        if self.outcome == "not-built" and self.plan_status == "unresolved":
            return "not built (plan unresolved)"
        return OUTCOME_LABELS.get(self.outcome, self.outcome)

    @property
    def total_duration_s(self) -> float:
        return sum(s.duration_s or 0.0 for s in self.stages)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["label"] = self.label
        return data


@dataclass
class Report:
    generated: str
    cells: list[CellReport]
    rows: list[tuple[str, str]]  # (cuda, torch)
    columns: list[tuple[str, str]]  # (engine spec, arch)

    @property
    def counts(self) -> dict[str, int]:
        found = Counter(c.outcome for c in self.cells)
        return {key: found.get(key, 0) for key, _, _ in OUTCOMES}

    def cell_at(self, row: tuple[str, str], column: tuple[str, str]) -> CellReport | None:
        return self._grid.get((row, column))

    @cached_property
    def _grid(self) -> dict[tuple[tuple[str, str], tuple[str, str]], CellReport]:
        return {(_row_key(c), _column_key(c)): c for c in self.cells}

    @property
    def column_groups(self) -> list[tuple[str, int]]:
        """(engine spec, number of arch columns under it), in column order."""
        groups: list[tuple[str, int]] = []
        for engine, _ in self.columns:
            if groups and groups[-1][0] == engine:
                groups[-1] = (engine, groups[-1][1] + 1)
            else:
                groups.append((engine, 1))
        return groups

    def as_dict(self) -> dict[str, Any]:
        return {"generated": self.generated, "counts": self.counts,
                "outcomes": {k: {"label": label, "colour": colour}
                             for k, label, colour in OUTCOMES},
                "cells": [c.as_dict() for c in self.cells]}


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    markdown: Path
    json: Path


# ---------------------------------------------------------------------------------------------
# Small defensive readers: journal and plan data may have any shape.

def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _version_key(text: str) -> tuple[int, Any, str]:
    """Sort versions numerically, non-versions ("cpu", "?") after them."""
    try:
        return (0, Version(text), text)
    except (InvalidVersion, TypeError):
        return (1, Version("0"), str(text))


def _arch_key(arch: str) -> tuple[int, str]:
    return (1, arch) if arch == "cpu" or not arch.startswith("sm_") else (0, arch)


def _row_key(cell: CellReport) -> tuple[str, str]:
    return (cell.axes.get("cuda", "?"), cell.axes.get("torch", "?"))


def _column_key(cell: CellReport) -> tuple[str, str]:
    """(engine spec, arch); a cell whose axes nobody recorded gets a column of its own."""
    if cell.axes.get("engine", "?") == "?" and cell.axes.get("arch", "?") == "?":
        return ("?", cell.id)
    return (cell.axes.get("engine", "?"), cell.axes.get("arch", "?"))


def redact(text: str) -> str:
    """Hide credentials embedded in URLs (https://user:token@host) before they reach a report."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}***@", text)


def safe_url(value: Any) -> str | None:
    """The value if it is an http(s) URL (fit for an href), else None."""
    if not isinstance(value, str):
        return None
    try:
        scheme = urlsplit(value.strip()).scheme
    except ValueError:
        return None
    return value.strip() if scheme in ("http", "https") else None


# ---------------------------------------------------------------------------------------------
# Journal record → stage results, outcome, facts.

AFTER_SERVING = frozenset({"train"})  # stages on another image than the serving one


def outcome_of(plan_status: str, stages: list[StageResult]) -> tuple[str, str | None]:
    """(outcome, failed stage): a pruned cell is pruned; else the first failure wins; then
    how far the cell got. The outcome is the serving image's: the training image (the train
    stage, after it) is said beside it, never hides it (issue 47)."""
    by_name = {s.name: s.status for s in stages}
    if plan_status == "pruned":  # a verdict, the lock's included: not a failure of the run
        return "pruned", None
    for stage in stages:
        if stage.status == "fail" and stage.name not in AFTER_SERVING:
            return "failed", stage.name
    if plan_status == "unknown" and by_name.get("plan") == "skip" and len(by_name) == 1:
        return "pruned", None
    if by_name.get("tag") == "pass" or by_name.get("publish") == "pass":
        return "tagged", None
    if by_name.get("smoke") == "pass" and by_name.get("tag") != "skip":
        return "verified", None
    if by_name.get("build") == "pass":
        return "built", None
    return "not-built", None


def _best_figure(figures: dict[str, float]) -> float | None:
    return max(figures.values()) if figures else None


def _figures_text(figures: dict[str, float]) -> str:
    if len(figures) == 1:
        return f"{next(iter(figures.values())):.1f}"
    order = {"single": 0, "concurrent": 1}
    ranked = sorted(figures.items(), key=lambda item: (order.get(item[0], 2), item[0]))
    return ", ".join(f"{key} {number:.1f}" for key, number in ranked)


def image_size(record: CellRecord) -> int | None:
    """The image size in bytes, as `fill_image_sizes` read it from Docker (no stage records
    one)."""
    number = _number(record.extra.get("image_size_bytes"))
    return int(number) if number is not None and number > 0 else None


def kernel_coverage(audit: AuditDetails) -> tuple[list[str], list[dict[str, Any]], list[str]]:
    """(columns, rows with `uncovered` marks, uncovered object names) from the audit's
    coverage rows (one per object: object, package, size, cubins, ptx, a verdict per target,
    covered, group)."""
    rows = audit.coverage
    columns: list[str] = []
    for row in rows:
        columns += [str(k) for k in row if str(k) not in columns]
    # What the row is about first (journals may store keys sorted), then the verdict.
    first = [k for k in ("object", "package") if k in columns]
    last = [k for k in ("covered",) if k in columns]
    columns = first + [k for k in columns if k not in first + last] + last
    marked = [{"cells": [_coverage_text(c, row.get(c)) for c in columns],
               "uncovered": row.get("covered") is False} for row in rows]
    uncovered = audit.uncovered or [_text(r.get("object")) or "?" for r in rows
                                    if r.get("covered") is False]
    return columns, marked, uncovered


def _coverage_text(column: str, value: Any) -> str:
    if column == "size" and _number(value) is not None:
        return human_size(_number(value))
    return _cell_text(value)


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)


def audit_checks(audit: AuditDetails) -> list[dict[str, str]]:
    """The audit's checks (kernels, cuda-major, torch-cuda, pins, pip-check, engine-floor)."""
    return [{"name": c.name, "status": c.status, "detail": redact(c.detail)}
            for c in audit.checks]


def workload_view(level: Level | None) -> dict[str, Any] | None:
    """The workload level as the report shows it: the sweep as bar rows, soak, needle,
    backends seen, the target and the last published figure."""
    points = [p for p in (level.sweep.get("points") if level else None) or []
              if isinstance(p, dict)]
    if level is None or not points:
        return None
    top = max([_number(p.get("tokens_per_s")) or 0.0 for p in points] or [0.0])

    def pair(p: dict[str, Any], key: str) -> str:
        figures = _mapping(p.get(key))
        return f"{figures.get('p50', '–')} / {figures.get('p99', '–')}"

    rows = [{"concurrency": p.get("concurrency"), "tokens_per_s": _number(p.get("tokens_per_s")),
             "pct": _pct(p.get("tokens_per_s"), top), "requests": p.get("requests"),
             "mean_output": p.get("mean_output_tokens"), "ttft": pair(p, "ttft_ms"),
             "itl": pair(p, "itl_ms"),
             "problems": f"{p.get('errors', 0)} / {p.get('truncated', 0)} / "
                         f"{p.get('empty', 0)} / {p.get('malformed', 0)}"} for p in points]
    soak, needle, target, predicted = level.soak, level.needle, level.target, level.prediction
    seen = _mapping(level.backends.get("seen"))
    return {"status": level.status or "", "reason": level.reason,
            "tokens_per_s": _number(level.tokens_per_s), "rows": rows,
            "capacity": level.sweep.get("capacity"),
            "capacity_source": _text(level.sweep.get("capacity_source")),
            "soak": f"{soak.get('seconds')} s at {soak.get('concurrency')} in flight, "
                    f"{soak.get('requests')} answers, {soak.get('tokens_per_s')} tokens/s, "
                    f"{soak.get('errors', 0)} errors, server "
                    f"{'up' if soak.get('server_up') else 'DOWN'}",
            "needle": f"{needle.get('prompt_tokens')} tokens: {needle.get('status')}"
                      + (f" ({needle.get('retrieval')})" if needle.get("retrieval") else ""),
            "backends": "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in seen.items())
                        or "none named in the server's log",
            "backends_status": _text(level.backends.get("status")) or "",
            "target": target.get("target_tokens_per_s"),
            "previous": target.get("previous_tokens_per_s"),
            "regression": _text(target.get("regression")),
            "prediction": (f"predicted {predicted.get('predicted_tokens_per_s')} tokens/s at "
                           f"batch {predicted.get('batch')} ({predicted.get('device_class')}, "
                           f"{predicted.get('model')}, {predicted.get('profile')}; capacity "
                           f"model), measured {predicted.get('measured_tokens_per_s')}: ratio "
                           f"{predicted.get('ratio')}") if predicted.get("status") == "done"
            else _text(predicted.get("reason")) or "no prediction"}


def _pct(value: Any, top: float) -> float:
    number = _number(value)
    return round(100.0 * number / top, 1) if number and top > 0 else 0.0


def throughput_chart(level: Level | None) -> dict[str, Any] | None:
    """The throughput level's sweep and scaling as bar rows (width: % of the best figure)."""
    points = [p for p in level.points if isinstance(p, dict)] if level else []
    if level is None or not points:
        return None
    top = max([_number(p.get("tokens_per_s")) or 0.0 for p in points + level.scaling] or [0.0])

    def latency(p: dict[str, Any], key: str) -> str:
        figures = _mapping(p.get(key))
        return f"{figures.get('p50', '–')} / {figures.get('p95', '–')}"

    rows = [{"label": f"{p.get('replicas')} × c{p.get('concurrency')}, thinking "
                      f"{'on' if p.get('thinking') else 'off'}",
             "tokens_per_s": _number(p.get("tokens_per_s")), "pct": _pct(p.get("tokens_per_s"), top),
             "per_replica": ", ".join(f"{k} {v}" for k, v in
                                      _mapping(p.get("tokens_per_s_per_replica")).items()),
             "ttft": latency(p, "ttft_ms"), "itl": latency(p, "itl_ms"),
             "errors": p.get("errors", 0)} for p in points]
    scale = [{"label": f"{s.get('replicas')} replica(s)",
              "tokens_per_s": _number(s.get("tokens_per_s")), "pct": _pct(s.get("tokens_per_s"), top)}
             for s in level.scaling]
    return {"status": level.status or "", "replicas": level.replicas,
            "tokens_per_s": _number(level.tokens_per_s),
            "per_replica_tokens_per_s": level.per_replica_tokens_per_s,
            "scaling_ratio": level.scaling_ratio,
            "errors": level.errors or 0, "rows": rows, "scaling": scale}


def level_figures(name: str, level: Level) -> dict[str, float]:
    """A level's tokens/s figures: the model level's by name; the throughput and workload
    levels' total only (their sweeps are their charts)."""
    if name not in level_table.SUMMARISED:
        return level.figures()
    total = _number(level.tokens_per_s)
    return {} if total is None else {name: total}


def smoke_levels(smoke: SmokeDetails) -> list[dict[str, Any]]:
    """One row per smoke level (static, gpu, model, ...): status, duration, tokens/s, note."""
    rows = []
    order = level_table.NAMES  # run order; a name it lacks last
    for name, level in sorted(smoke.levels.items(),
                              key=lambda item: order.index(item[0]) if item[0] in order
                              else len(order)):
        figures = level_figures(name, level)
        rows.append({"level": name, "status": level.status or "",
                     "duration_s": level.duration_s, "tokens_per_s": _best_figure(figures),
                     "tokens_text": _figures_text(figures), "note": level.reason or ""})
    return rows


def read_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str | None:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return "\n".join(data.splitlines()[-lines:])


def stage_log_tail(stage: StageResult, record: CellRecord, cell_id: str,
                   state: StatePaths | None) -> str | None:
    """The tail of a stage's log: the tail a failed build recorded, its log file (or the
    conventional path under the state directory when the journal came from another machine),
    else its reason."""
    tail = record.build.log_tail if stage.name == "build" else None
    if not tail:
        paths = [Path(stage.log)] if stage.log else []
        if state is not None:
            paths.append(state.cell_log(cell_id, stage.name))
        tail = next((t for t in (read_tail(p) for p in paths) if t), None)
    tail = tail or stage.reason
    return redact(tail[-LOG_TAIL_CHARS:]) if tail else None


def recorded_plan(record: CellRecord) -> tuple[CellPlan | None, str]:
    """(plan, status) the journal recorded for a cell: its plan stage's details read back into
    a `CellPlan`; a stored plan that cannot be one (damaged, another version's) still gives
    its status text, else "unknown"."""
    stored = record.recorded_plan
    plan = CellPlan.from_dict(stored)
    if plan is not None:
        return plan, plan.status
    return None, _text(_mapping(stored).get("status")) or "unknown"


def cell_report(cell_id: str, plan: CellPlan | None, record: CellRecord | None,
                state: StatePaths | None = None) -> CellReport:
    """The report of one cell. `plan`: the run's plan of it; None: the plan its journal
    recorded, if any (a journal-only cell)."""
    record = record or CellRecord(cell_id)
    plan, plan_status = (plan, plan.status) if plan is not None else recorded_plan(record)
    stages = record.ordered_stages()
    outcome, failed = outcome_of(plan_status, stages)
    axes = plan.cell.axes() if plan else dict(UNKNOWN_AXES)
    reasons = [v.as_dict() for v in plan.verdicts] if plan else []
    if plan is not None:  # a selector's "latest" that passed over a newer release (#45)
        from .plan import passed_over_notes
        reasons += [{"rule": "latest-passed-over", "reason": note,
                     "source": (plan.resolution or {}).get("index") or ""}
                    for note in passed_over_notes([plan])]
    if outcome == "pruned" and not reasons:
        plan_stage = next((s for s in stages if s.name == "plan"), None)
        if plan_stage and plan_stage.reason:
            reasons = [{"rule": "plan", "reason": plan_stage.reason, "source": ""}]
    failed_stage = next((s for s in stages if s.name == failed), None)
    running = next((s for s in stages if s.status == "running"), None)
    columns, rows, uncovered = kernel_coverage(record.audit)
    smoke = record.smoke
    figures = smoke.levels["model"].figures() if "model" in smoke.levels else {}
    chart = throughput_chart(smoke.levels.get("throughput"))
    work = workload_view(smoke.levels.get("workload"))
    for name, view in (("throughput", chart), ("workload", work)):
        if view and view["tokens_per_s"] is not None:
            figures[name] = view["tokens_per_s"]
    return CellReport(
        id=cell_id, axes=axes, plan_status=plan_status, outcome=outcome, failed_stage=failed,
        interrupted_stage=running.name if running else None, reasons=reasons,
        settings=plan.settings.as_dict() if plan and plan.settings else {}, stages=stages,
        image_id=record.image_id, image_size=image_size(record),
        versions=dict(record.audit.versions), coverage_columns=columns, coverage_rows=rows,
        uncovered=uncovered, smoke_levels=smoke_levels(smoke), throughput=chart, workload=work,
        tokens_per_s=_best_figure(figures), tokens_text=_figures_text(figures),
        audit_checks=audit_checks(record.audit),
        log_tail=stage_log_tail(failed_stage, record, cell_id, state) if failed_stage
        else None,
        problems=list(record.problems), signing=signing_status(record))


def signing_status(record: CellRecord) -> dict[str, Any] | None:
    """A published cell's signing, from the images.lock entry publish recorded (None when it
    was not published): signed (key fingerprint, verdict, signature and attestation digests,
    the SBOM file publish wrote under the state directory) or unsigned."""
    if record.status_of("publish") != "pass":
        return None
    signing = (record.publish.lock_entry or LockEntry()).signing or Signing()
    if not signing.signed:
        return {"status": "unsigned", "text": "published unsigned (pull and deploy refuse it "
                "without --skip-verify)", "sbom": None, "attestations": {}, "key": None,
                "signature": None}
    key = signing.key or "keyless"
    sbom = signing.sbom_file
    return {"status": "signed",
            "text": f"signed, key {key[:23]}…, verdict {signing.verdict!r}, {signing.mode}",
            "key": key, "signature": _text(signing.signature.get("digest")),
            "attestations": {str(k): _text(v) for k, v in signing.attestations.items()},
            "sbom": f"../{sbom}" if sbom and ".." not in sbom else None}


def build_report(journal: Mapping[str, Any], plans: Iterable[CellPlan] | None,
                 state: StatePaths | Mapping[str, StatePaths] | None = None) -> Report:
    """The report of every cell of the plan and of the journal (a journal-only cell is one the
    current plan no longer has; it is kept, marked as such, placed by the plan it recorded).
    `journal`: typed records (`journal.load_records`) or their JSON form. `plans`: the run's
    typed plans (`Run.plans`, `stages.plan_cells`, `load_plan_file`). `state`: where logs
    are, or per cell id (a merged journal: each cell's fragment)."""
    by_id = {plan.id: plan for plan in plans or ()}
    records = records_of(journal if isinstance(journal, Mapping) else {})
    ids = list(by_id) + [i for i in records if i not in by_id]
    cells = []
    for i in ids:
        where = state.get(i) if isinstance(state, Mapping) else state
        cells.append(cell_report(str(i), by_id.get(i), records.get(i), where))
        cells[-1].in_plan = i in by_id or not by_id  # without a current plan, nothing is stale
    cells.sort(key=lambda c: (_version_key(c.axes.get("cuda", "?")),
                              _version_key(c.axes.get("torch", "?")), c.id))
    rows = sorted({_row_key(c) for c in cells},
                  key=lambda r: (_version_key(r[0]), _version_key(r[1])))
    columns = sorted({_column_key(c) for c in cells}, key=_engine_column_key)
    return Report(generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                  cells=cells, rows=rows, columns=columns)


def _engine_column_key(column: tuple[str, str]) -> tuple[Any, ...]:
    name, _, version = column[0].partition("==")
    return (name == "?", name, _version_key(version), _arch_key(column[1]))


def fill_image_sizes(records: Mapping[str, CellRecord], docker: Engine) -> int:
    """Set `image_size_bytes` (in memory) from `docker` for built cells whose journal has no
    size; without a Docker engine, nothing. Returns how many were filled."""
    wanting = {cid: r.image_id for cid, r in records.items()
               if r.image_id and not image_size(r)}
    if not wanting or not docker.available():
        return 0
    filled = 0
    for cell_id, image_id in wanting.items():
        try:
            info = docker.inspect_image(image_id)
        except InfermatrixError as exc:  # a size is a nicety, never a reason to fail
            print(f"infermatrix report: warning: cannot inspect {image_id}: {exc}",
                  file=sys.stderr)
            continue
        if info and isinstance(info.get("Size"), int):
            records[cell_id].extra["image_size_bytes"] = info["Size"]
            filled += 1
    return filled


# ---------------------------------------------------------------------------------------------
# Plans: from plan.plan_matrix when the matrix loads, else a saved plan JSON file.

def load_plan_file(path: Path) -> list[CellPlan]:
    """The plans of a JSON file (`infermatrix plan --json` output, a list or {"cells": ...}),
    read back into `CellPlan`s; an entry that cannot be one is named on stderr and left out."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data = data.get("cells") or data.get("plans") or []
    entries = data if isinstance(data, list) else []
    plans = [CellPlan.from_dict(entry) for entry in entries]
    unreadable = [_plan_name(e) for e, p in zip(entries, plans) if p is None]
    if unreadable:
        print(f"infermatrix report: warning: {path}: {len(unreadable)} entries are not plans "
              f"of a cell, left out: {', '.join(unreadable)}", file=sys.stderr)
    return [p for p in plans if p is not None]


def _plan_name(entry: Any) -> str:
    return redact(_text(_mapping(entry).get("id")) or repr(entry)[:60])


# ---------------------------------------------------------------------------------------------
# Rendering.

def human_size(size: int | float | None) -> str:
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def short_label(cell: CellReport) -> str:
    """What a grid cell says: a mark and a word or the failing stage."""
    if cell.outcome == "failed":
        return f"✖ {cell.failed_stage or 'failed'}"
    if cell.interrupted_stage and cell.outcome == "not-built":
        return f"stopped in {cell.interrupted_stage}"
    if cell.outcome == "not-built" and cell.plan_status == "unresolved":
        return "unresolved"
    return {"tagged": "✔ tagged", "verified": "✔ verified", "built": "built",
            "not-built": "not built", "pruned": "pruned"}.get(cell.outcome, cell.outcome)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters.update(size=human_size, duration=human_duration, safe_url=safe_url,
                       cell_text=_cell_text, redact=redact, short_label=short_label)
    env.tests["mapping"] = lambda v: isinstance(v, dict)
    env.tests["sequence_value"] = lambda v: isinstance(v, (list, tuple))
    return env


def render_html(report: Report) -> str:
    template = _environment().get_template("report.html.j2")
    return template.render(report=report, outcomes=OUTCOMES, icons=OUTCOME_ICONS,
                           css=(TEMPLATE_DIR / "report.css").read_text(encoding="utf-8"),
                           js=(TEMPLATE_DIR / "report.js").read_text(encoding="utf-8"))


def _md_cell(value: Any) -> str:
    """Text safe inside a Markdown table cell (no pipes, no newlines, no raw HTML)."""
    text = _cell_text(value).replace("\r", " ").replace("\n", " ")
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|"))


def _fence(text: str) -> str:
    """A code fence longer than any backtick run in the text, so the text cannot close it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render_markdown(report: Report, html_name: str | None = "report.html",
                    tail_lines: int = 15) -> str:
    counts = report.counts
    total = len(report.cells)
    parts = [f"{OUTCOME_ICONS[k]} {counts[k]} {OUTCOME_LABELS[k]}" for k, _, _ in OUTCOMES
             if counts[k]]
    out = ["## infermatrix report", "",
           f"**{total} cells** — " + " · ".join(parts), ""]
    newest = list(dict.fromkeys(r["reason"] for c in report.cells for r in c.reasons
                                if r.get("rule") == "latest-passed-over"))
    out += [f"> **Not the newest:** {_md_cell(note)}" for note in newest] + ([""] if newest else [])
    active = [c for c in report.cells if c.outcome != "pruned"]
    if active:
        out += ["| cell | outcome | total time | image size | tokens/s | note |",
                "|---|---|---:|---:|---:|---|"]
        for c in active:
            note = _note(c)
            tokens = f"{c.tokens_per_s:.1f}" if c.tokens_per_s is not None else ""
            out.append(f"| `{_md_cell(c.id)}` | {OUTCOME_ICONS[c.outcome]} {_md_cell(c.label)} "
                       f"| {human_duration(c.total_duration_s) if c.stages else ''} "
                       f"| {human_size(c.image_size)} | {tokens} | {_md_cell(note)} |")
        out.append("")
    pruned = [c for c in report.cells if c.outcome == "pruned"]
    if pruned:
        out += [f"<details><summary>{len(pruned)} pruned cells</summary>", "",
                "| cell | reasons |", "|---|---|"]
        out += [f"| `{_md_cell(c.id)}` | {_md_reasons(c.reasons)} |" for c in pruned]
        out += ["", "</details>", ""]
    published = [(c, c.signing) for c in report.cells if c.signing]
    if published:
        out += ["### Signing", ""]
        out += [f"- `{_md_cell(c.id)}`: {_md_cell(signing['text'])}"
                + (f" — [SBOM (CycloneDX)]({signing['sbom']})" if signing["sbom"] else "")
                for c, signing in published]
        out.append("")
    for c in (c for c in active if c.throughput):
        out += _md_throughput(c)
    for c in (c for c in active if c.workload):
        out += _md_workload(c)
    failures = [c for c in report.cells if c.outcome == "failed" and c.log_tail]
    for c in failures:
        tail = "\n".join((c.log_tail or "").splitlines()[-tail_lines:])
        fence = _fence(tail)
        out += [f"### ❌ `{c.id}` failed at {c.failed_stage}", "", f"{fence}text", tail, fence, ""]
    if html_name:
        out.append(f"Full report with every cell's detail: `{html_name}`.")
    return "\n".join(out).rstrip() + "\n"


def _md_throughput(c: CellReport) -> list[str]:
    chart = c.throughput or {}
    out = [f"### Throughput of `{c.id}`", "",
           f"{chart.get('replicas')} replica(s): best {chart.get('tokens_per_s')} output "
           f"tokens/s, {chart.get('per_replica_tokens_per_s')} per replica; scaling ratio "
           f"{chart.get('scaling_ratio')}", "",
           "| load | tokens/s | per replica | TTFT p50/p95 ms | ITL p50/p95 ms | errors |",
           "|---|---:|---|---:|---:|---:|"]
    out += [f"| {r['label']} | {r['tokens_per_s']} | {r['per_replica']} | {r['ttft']} | "
            f"{r['itl']} | {r['errors']} |" for r in chart.get("rows", [])]
    return out + [""]


def _md_workload(c: CellReport) -> list[str]:
    w = c.workload or {}
    target = f"; target {w['target']}" if w.get("target") is not None else ""
    previous = f"; last published {w['previous']}" if w.get("previous") is not None else ""
    out = [f"### Workload of `{c.id}`", "",
           f"{w.get('status')}: best {w.get('tokens_per_s')} output tokens/s per GPU{target}"
           f"{previous}; capacity {w.get('capacity')} ({_md_cell(w.get('capacity_source'))})",
           "", "| in flight | tokens/s | answers | mean output | TTFT p50/p99 ms | "
           "ITL p50/p99 ms | errors / truncated / empty / malformed |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['concurrency']} | {r['tokens_per_s']} | {r['requests']} | "
            f"{r['mean_output']} | {r['ttft']} | {r['itl']} | {r['problems']} |"
            for r in w.get("rows", [])]
    out += ["", f"- {_md_cell(w.get('prediction'))}",
            f"- soak: {_md_cell(w.get('soak'))}", f"- needle: {_md_cell(w.get('needle'))}",
            f"- backends seen: {_md_cell(w.get('backends'))} ({w.get('backends_status')})"]
    if w.get("regression"):
        out.append(f"- regression: {_md_cell(w['regression'])}")
    if w.get("reason"):
        out.append(f"- why: {_md_cell(w['reason'])}")
    return out + [""]


def _md_reasons(reasons: list[dict[str, Any]]) -> str:
    """`rule: reason ([source](url)); ...` with the text escaped and the URL percent-quoted."""
    parts = []
    for r in reasons:
        text = f"{_md_cell(r.get('rule') or '')}: {_md_cell(r.get('reason') or '')}"
        url = safe_url(r.get("source"))
        if url:
            text += f" ([source]({quote(url, safe=':/?#[]@!$&*+,;=%~.-_')}))"
        elif r.get("source"):
            text += f" (source: {_md_cell(r.get('source'))})"
        parts.append(text)
    return "; ".join(parts)


def _note(cell: CellReport) -> str:
    """One line that says what to look at first for a cell."""
    if cell.uncovered:
        return "uncovered: " + ", ".join(cell.uncovered)
    if cell.interrupted_stage:
        return f"interrupted at {cell.interrupted_stage}"
    return _failure_reason(cell) or ""


def _failure_reason(cell: CellReport) -> str | None:
    stage = next((s for s in cell.stages if s.name == cell.failed_stage), None)
    if stage is None or not stage.reason:
        return None
    first = stage.reason.strip().splitlines()[0] if stage.reason.strip() else ""
    return redact(first[:200])


def _redact_all(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_all(v) for v in value]
    return value


def report_json(report: Report) -> dict[str, Any]:
    """The report for machines; URL credentials in any recorded string are hidden."""
    return _redact_all(report.as_dict())


def write_report(report: Report, out_dir: Path) -> ReportFiles:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(html=out_dir / "report.html", markdown=out_dir / "report.md",
                        json=out_dir / "report.json")
    texts = {files.html: render_html(report),
             files.markdown: render_markdown(report, files.html.name),
             files.json: json.dumps(report_json(report), indent=2, default=str) + "\n"}
    # whole or not at all (issue 48: a plain write on a full disk truncated report.html and
    # lost the last good one, and the error named no path): the three files are written beside
    # the old ones first, and renamed over them only when all three are on disk
    written: dict[Path, Path] = {}
    try:
        for path, text in texts.items():
            written[path] = write_text_beside(path, text)
    except OSError as exc:
        for tmp in written.values():
            tmp.unlink(missing_ok=True)
        raise StageFailure(
            f"cannot write the report {exc.filename}: {exc.strerror or exc}",
            fix=f"free space under {out_dir} (or pass --out DIR elsewhere) and rerun "
                "`infermatrix report`; the last report written there is kept whole") from None
    for path, tmp in written.items():
        os.replace(tmp, path)
    return files


RICH_STYLES = {"tagged": "bold green", "verified": "bold blue", "built": "yellow",
               "failed": "bold red", "not-built": "dim", "pruned": "dim"}


def summary_table(report: Report, html_path: Path | str | None = None) -> Table:
    """A rich table of the cells that were not pruned, with a caption pointing to the HTML."""
    counts = report.counts
    title = "  ".join(f"{counts[k]} {OUTCOME_LABELS[k]}" for k, _, _ in OUTCOMES if counts[k])
    caption = f"{counts['pruned']} pruned cells not shown." if counts["pruned"] else ""
    if html_path:
        caption += f" Full report: {html_path}"
    table = Table(title=f"infermatrix: {len(report.cells)} cells — {title}",
                  caption=Text(caption.strip()) if caption.strip() else None,
                  caption_justify="left")
    widest = max((len(c.id) for c in report.cells), default=4)
    table.add_column("cell", no_wrap=True, min_width=widest)
    table.add_column("outcome", no_wrap=True, min_width=len("built, not verified"))
    for name, width in (("time", 6), ("size", 9), ("tok/s", 6)):
        table.add_column(name, justify="right", no_wrap=True, min_width=width)
    table.add_column("note", overflow="fold", min_width=16)  # the column that wraps
    for c in report.cells:
        if c.outcome == "pruned":
            continue
        table.add_row(Text(c.id), Text(c.label, style=RICH_STYLES[c.outcome]),
                      human_duration(c.total_duration_s) if c.stages else "",
                      human_size(c.image_size),
                      f"{c.tokens_per_s:.1f}" if c.tokens_per_s is not None else "",
                      Text(_shorten(_note(c), 90)))
    return table


def print_summary(report: Report, html_path: Path | str | None = None,
                  console: Console | None = None) -> None:
    """Print `summary_table`; a log (not a terminal) gets 160 columns rather than rich's 80, so
    CI logs keep one line per cell."""
    console = console or Console()
    if not console.is_terminal and console.width < 160:
        console = Console(file=console.file, width=160, color_system=None)
    console.print(summary_table(report, html_path))


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """The HTML/Markdown/JSON report over every cell of the plan, pruned ones included (the
    plan of this run: the lock's verdicts are in it)."""
    records = journal.load_records(run.ctx.state)
    fill_image_sizes(records, run.docker)
    report = build_report(records, run.plans, run.ctx.state)
    files = write_report(report, run.ctx.state.reports)
    print_summary(report, files.html)
    return StepRecord("report", StepStatus.RAN, note=str(files.html))
