"""Per-cell journal: input hash, image id, stage results, durations, log paths.

One JSON file per cell under <state>/journal/, rewritten atomically on every change, so an
interrupted run leaves each record either before or after a stage, never half-written.
Layout of a record:
    {"cell": id, "input_hash": str|None, "image_id": str|None, "updated": iso,
     "stages": {stage: {"status": "pass"|"fail"|"skip"|"running", "duration_s": float,
                        "started": iso, "log": path|None, "reason": str|None,
                        "details": {...}}}}
Stages: plan, lock, render, build, audit, smoke, tag, publish.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .state import StatePaths, write_json_atomic

STAGES = ("plan", "lock", "render", "build", "audit", "smoke", "tag", "publish")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def record_path(state: StatePaths, cell_id: str) -> Path:
    return state.journal / f"{cell_id}.json"


def load(state: StatePaths, cell_id: str) -> dict[str, Any]:
    path = record_path(state, cell_id)
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return {"cell": cell_id, "input_hash": None, "image_id": None, "stages": {}}


def load_all(state: StatePaths) -> dict[str, dict[str, Any]]:
    if not state.journal.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(state.journal.glob("*.json"))}


def save(state: StatePaths, record: dict[str, Any]) -> None:
    record["updated"] = _now()
    write_json_atomic(record_path(state, record["cell"]), record)


def update(state: StatePaths, cell_id: str, **fields: Any) -> dict[str, Any]:
    """Set top-level fields (input_hash, image_id, ...) of a cell's record."""
    record = load(state, cell_id)
    record.update(fields)
    save(state, record)
    return record


def record_stage(state: StatePaths, cell_id: str, stage: str, status: str, *,
                 duration_s: float | None = None, log: Path | str | None = None,
                 reason: str | None = None, details: dict[str, Any] | None = None,
                 **fields: Any) -> dict[str, Any]:
    """Record a stage result for a cell (and optional top-level fields) in one atomic write."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}")
    record = load(state, cell_id)
    record.update(fields)
    record.setdefault("stages", {})[stage] = {
        "status": status, "finished": _now(),
        "duration_s": None if duration_s is None else round(duration_s, 3),
        "log": None if log is None else str(log), "reason": reason,
        "details": details or {},
    }
    save(state, record)
    return record


def stage_status(record: dict[str, Any], stage: str) -> str | None:
    return record.get("stages", {}).get(stage, {}).get("status")
