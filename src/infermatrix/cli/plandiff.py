"""The resolved plan committed beside the locks (`locks/plan.json`), and what changed since.

Like docker-library's versions.json: what the selectors of matrix.yaml resolved to when the
locks were made, one entry per cell, with no timestamps (an unchanged resolution rewrites the
same bytes). `infermatrix plan --diff` compares a fresh plan with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..model.cell import CellPlan
from ..state import DamagedStateFile, notice, read_state_json

PLAN_FILE = "plan.json"


def plan_path(root: Path) -> Path:
    return root / "locks" / PLAN_FILE


def snapshot(plans: list[CellPlan]) -> dict[str, Any]:
    cells = {}
    for p in plans:
        res = p.resolution or {}
        cells[p.id] = {"status": p.status, "engine": p.cell.engine,
                       "version": p.cell.engine_version, "torch": p.cell.torch,
                       "cuda": p.cell.cuda, "arch": p.cell.arch,
                       "selector": res.get("selector"),
                       "rules": sorted({v.rule for v in p.verdicts})}
    return {"version": 1, "cells": dict(sorted(cells.items()))}


def write_snapshot(root: Path, plans: list[CellPlan]) -> Path:
    path = plan_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(snapshot(plans), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


SNAPSHOT_KEYS = {"status", "engine", "version", "rules"}


def load_snapshot(root: Path, plans: list[CellPlan] | None = None) -> dict[str, Any] | None:
    """locks/plan.json, or None when there is none. A damaged one (empty, truncated, binary,
    cells of the wrong shape) is rebuilt from `plans`, and said; without `plans` it is a
    DamagedStateFile naming the fix."""
    path = plan_path(root)
    if not path.is_file():
        return None
    try:
        return _checked_snapshot(read_state_json(path, "plan file", REBUILD_FIX), path)
    except DamagedStateFile as exc:
        if plans is None:
            raise
        write_snapshot(root, plans)
        notice(f"warning: {str(exc).splitlines()[0]}\n  rebuilt from the current plan; "
               f"`git diff {path.name}` shows what changed against the committed one")
        return snapshot(plans)


REBUILD_FIX = "run `infermatrix lock` to write it again from the current plan"


def _checked_snapshot(data: dict[str, Any], path: Path) -> dict[str, Any]:
    cells = data.get("cells")
    if not isinstance(cells, dict) or not all(
            isinstance(c, dict) and SNAPSHOT_KEYS <= c.keys() for c in cells.values()):
        raise DamagedStateFile("damaged plan file: `cells` is not an object of cells with "
                               f"{', '.join(sorted(SNAPSHOT_KEYS))}", path, 1, REBUILD_FIX)
    return data


def _releases(cells: dict[str, Any]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for entry in cells.values():
        found.setdefault(entry["engine"], set()).add(entry["version"])
    return found


def diff(committed: dict[str, Any], fresh: dict[str, Any],
         on_index: dict[str, set[str]] | None = None) -> list[str]:
    """Lines saying which cells appear, go away or change status, and why. `on_index`:
    engine -> releases on the index now (tells a yanked release from a superseded one)."""
    old, new = committed.get("cells", {}), fresh.get("cells", {})
    old_rel, new_rel = _releases(old), _releases(new)
    lines = []
    for cell_id in sorted(old.keys() | new.keys()):
        before, after = old.get(cell_id), new.get(cell_id)
        if before is None:
            why = _why_new(after, old_rel)
            lines.append(f"+ {cell_id} ({after['status']}): {why}")
        elif after is None:
            why = _why_gone(before, new_rel, on_index)
            lines.append(f"- {cell_id} (was {before['status']}): {why}")
        elif before["status"] != after["status"] or before["rules"] != after["rules"]:
            rules = ", ".join(after["rules"]) or "no rule"
            lines.append(f"~ {cell_id}: {before['status']} -> {after['status']} ({rules})")
    return lines


def _why_new(after: dict[str, Any], old_rel: dict[str, set[str]]) -> str:
    engine, version = after["engine"], after["version"]
    if version not in old_rel.get(engine, set()):
        return f"{engine} {version} is newly selected by {after['selector'] or 'the axes'!r}"
    return "new combination of the axes (matrix.yaml changed)"


def _why_gone(before: dict[str, Any], new_rel: dict[str, set[str]],
              on_index: dict[str, set[str]] | None) -> str:
    engine, version = before["engine"], before["version"]
    if version in new_rel.get(engine, set()):
        return "combination no longer in the axes (matrix.yaml changed)"
    if on_index is not None and engine in on_index and version not in on_index[engine]:
        return f"{engine} {version} is no longer on the index (yanked or removed)"
    now = ", ".join(sorted(new_rel.get(engine, set()))) or "none"
    return (f"{engine} {version} is no longer selected by {before['selector'] or 'the axes'!r}"
            f" (superseded; selected now: {now})")
