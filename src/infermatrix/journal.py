"""Per-cell journal: input hash, image id, stage results, durations, log paths.

One JSON file per cell under <state>/journal/, rewritten atomically on every change, so an
interrupted run leaves each record either before or after a stage, never half-written.
A record is a `CellRecord` with one `StageRecord` per stage; on disk:
    {"cell": id, "input_hash": str|None, "image_id": str|None, "updated": iso,
     "stages": {stage: {"status": "pass"|"fail"|"skip"|"running", "duration_s": float,
                        "finished": iso, "log": path|None, "reason": str|None,
                        "details": {...}}}}
The stage names are `STAGES`, declared here once: the pipeline's steps are `stages.step_<name>`
in this order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from enum import StrEnum
from pathlib import Path
from typing import Any, Mapping, TypeVar

from .names import inside
from .outcome import (AuditDetails, BuildDetails, Details, PublishDetails, SmokeDetails,
                      TagDetails, TrainDetails, number_of, text_of)
from .state import (DamagedStateFile, StatePaths, notice, read_state_json, record_lock,
                    write_json_atomic)

STAGES = ("plan", "lock", "render", "base", "build", "audit", "smoke", "tag", "publish",
          "train", "report")


class Status(StrEnum):
    """What a stage says about a cell. `running`: started, not finished (a killed run)."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"
    RUNNING = "running"
    UNKNOWN = "unknown"  # a record written by something this code does not know


def _status(value: Any) -> Status:
    try:
        return Status(str(value))
    except ValueError:
        return Status.UNKNOWN


@dataclass
class StageRecord:
    """A stage's outcome for a cell: status, reason, duration, log and details; the details of
    the stages others read are typed (outcome.py), read with `CellRecord.build`, ..."""

    name: str
    status: Status
    finished: str | None = None
    duration_s: float | None = None
    log: str | None = None
    reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, name: str, data: Any) -> "StageRecord":
        if not isinstance(data, dict):  # a journal from elsewhere: keep what it says
            return cls(str(name), _status(data))
        details = data.get("details")
        return cls(name=str(name), status=_status(data.get("status")),
                   finished=text_of(data.get("finished") or data.get("started")),
                   duration_s=number_of(data.get("duration_s")), log=text_of(data.get("log")),
                   reason=text_of(data.get("reason")),
                   details=details if isinstance(details, dict) else {})

    def to_json(self) -> dict[str, Any]:
        return {"status": str(self.status), "finished": self.finished,
                "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
                "log": self.log, "reason": self.reason, "details": self.details}


D = TypeVar("D", bound=Details)


def _typed(name: str, kind: type[D]) -> "cached_property[D]":
    """A record's property: the details of stage `name`, read once as `kind`."""
    def read(record: "CellRecord") -> D:
        return kind.from_json(record.details_of(name))
    return cached_property(read)


@dataclass
class CellRecord:
    """One cell's journal record, typed; `extra` keeps top-level fields other stages added."""

    cell: str
    input_hash: str | None = None
    image_id: str | None = None
    updated: str | None = None
    stages: dict[str, StageRecord] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, cell_id: str, data: Any) -> "CellRecord":
        if not isinstance(data, dict):
            return cls(cell_id, problems=[f"journal record of {cell_id} is not an object"])
        stages = data.get("stages")
        stages = stages if isinstance(stages, dict) else {}
        known = {"cell", "input_hash", "image_id", "updated", "stages", "problems"}
        problems = data.get("problems")
        problems = problems if isinstance(problems, list) else []
        return cls(cell=str(data.get("cell") or cell_id),
                   input_hash=text_of(data.get("input_hash")),
                   image_id=text_of(data.get("image_id")), updated=text_of(data.get("updated")),
                   stages={str(k): StageRecord.from_json(k, v) for k, v in stages.items()},
                   extra={k: v for k, v in data.items() if k not in known},
                   problems=[str(p) for p in problems])

    def ordered_stages(self) -> list[StageRecord]:
        """Stages in pipeline order, then any stage this code does not know."""
        names = [s for s in STAGES if s in self.stages] + \
            [s for s in self.stages if s not in STAGES]
        return [self.stages[n] for n in names]

    def stage(self, name: str) -> StageRecord | None:
        return self.stages.get(name)

    def status_of(self, name: str) -> Status | None:
        stage = self.stages.get(name)
        return stage.status if stage else None

    def details_of(self, name: str) -> dict[str, Any]:
        """The stage's details; empty when the stage has no record."""
        stage = self.stages.get(name)
        return stage.details if stage else {}

    # Each stage's details, typed (empty when the stage has no record).
    build = _typed("build", BuildDetails)
    audit = _typed("audit", AuditDetails)
    smoke = _typed("smoke", SmokeDetails)
    tag = _typed("tag", TagDetails)
    publish = _typed("publish", PublishDetails)
    train = _typed("train", TrainDetails)

    @property
    def builder(self) -> dict[str, Any]:
        """The identity of the builder that built the cell (several builders); empty if one."""
        builder = self.extra.get("builder")
        return builder if isinstance(builder, dict) else {}

    @property
    def builder_name(self) -> str | None:
        """The builder that built the cell (several builders), from the build's record."""
        return text_of(self.builder.get("name"))

    @property
    def recorded_plan(self) -> dict[str, Any] | None:
        """The plan the plan step recorded (its details are `CellPlan.as_dict()`)."""
        plan = self.stages.get("plan")
        return plan.details if plan and plan.details.get("status") else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def record_path(state: StatePaths, cell_id: str) -> Path:
    return inside(state.journal, f"{cell_id}.json")


JOURNAL_FIX = ("delete the file to treat the cell as unknown (its stages run again), or "
               "restore it from a backup")
_REPORTED: set[Path] = set()  # damaged records already named on stderr by this process


def _empty(cell_id: str) -> dict[str, Any]:
    return {"cell": cell_id, "input_hash": None, "image_id": None, "stages": {}}


def _read(path: Path) -> dict[str, Any]:
    """The one reader of a journal file: its data, or DamagedStateFile (empty, truncated,
    binary, or `stages` not an object of stage objects)."""
    data = read_state_json(path, "journal record", JOURNAL_FIX)
    stages = data.get("stages", {})
    if not isinstance(stages, dict) or not all(isinstance(s, dict) for s in stages.values()):
        raise DamagedStateFile("damaged journal record: `stages` is not an object of stages",
                               path, 1, JOURNAL_FIX)
    return data


def _read_or_unknown(path: Path, cell_id: str) -> tuple[dict[str, Any], str | None]:
    """(record, problem): a damaged record is said once and its cell alone is unknown."""
    try:
        return _read(path), None
    except DamagedStateFile as exc:
        if path not in _REPORTED:
            _REPORTED.add(path)
            notice(f"warning: {exc}\n  the cell {cell_id} is treated as unknown")
        return _empty(cell_id), f"unreadable journal record: {exc}"


def load(state: StatePaths, cell_id: str) -> dict[str, Any]:
    """A cell's record as stored (an empty one when missing or damaged)."""
    path = record_path(state, cell_id)
    return _read_or_unknown(path, cell_id)[0] if path.is_file() else _empty(cell_id)


def cell_record(state: StatePaths, cell_id: str) -> CellRecord:
    """A cell's record, typed: what the stages read (an empty one when missing; a damaged one
    empty, with its problem). `load` is the stored form, for the journal's own writes."""
    path = record_path(state, cell_id)
    if not path.is_file():
        return CellRecord(cell_id)
    data, problem = _read_or_unknown(path, cell_id)
    return CellRecord.from_json(cell_id, data if problem is None else
                                {**data, "problems": [problem]})


def _journal_files(state: StatePaths) -> list[Path]:
    return sorted(state.journal.glob("*.json")) if state.journal.is_dir() else []


def load_all(state: StatePaths) -> dict[str, dict[str, Any]]:
    """Every record as stored; a damaged one is an empty record with its `problems`."""
    found = {}
    for path in _journal_files(state):
        data, problem = _read_or_unknown(path, path.stem)
        found[path.stem] = data if problem is None else {**data, "problems": [problem]}
    return found


def load_records(state: StatePaths) -> dict[str, CellRecord]:
    """Every record, typed; an unreadable file becomes a record with a `problems` note (the
    report shows it, never crashes on it)."""
    return records_of(load_all(state))


def records_of(raw: Mapping[str, Any]) -> dict[str, CellRecord]:
    """Typed records from `load_all`-shaped data (or records already typed)."""
    return {str(k): v if isinstance(v, CellRecord) else CellRecord.from_json(str(k), v)
            for k, v in raw.items()}


def save(state: StatePaths, record: dict[str, Any]) -> None:
    record["updated"] = _now()
    write_json_atomic(record_path(state, record["cell"]), record)


def update(state: StatePaths, cell_id: str, **fields: Any) -> dict[str, Any]:
    """Set top-level fields (input_hash, image_id, ...) of a cell's record."""
    with record_lock(state, record_path(state, cell_id).name):
        record = load(state, cell_id)
        record.update(fields)
        save(state, record)
    return record


def record_stage(state: StatePaths, cell_id: str, stage: str, status: Status, *,
                 duration_s: float | None = None, log: Path | str | None = None,
                 reason: str | None = None, details: Details | dict[str, Any] | None = None,
                 **fields: Any) -> dict[str, Any]:
    """Record a stage result for a cell (and optional top-level fields) in one atomic write."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}")
    entry = StageRecord(stage, Status(status), finished=_now(), duration_s=duration_s,
                        log=None if log is None else str(log), reason=reason,
                        details=details.to_json() if isinstance(details, Details) else
                        details or {})
    # a reader (audit) may record beside a run
    with record_lock(state, record_path(state, cell_id).name):
        record = load(state, cell_id)
        record.update(fields)
        record.setdefault("stages", {})[stage] = entry.to_json()
        save(state, record)
    return record

