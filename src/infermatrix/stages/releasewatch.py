"""Release watch (#45): the engine releases the committed plan does not have yet, and the ones
it uses that were yanked, each with its age against a settle delay.

Peers open a version-bump change when an engine releases, once the release has settled (the
newest release at least N days old), and CI proves the bump. `infermatrix watch` lists what
such a bump would take: a release newer than the committed plan's (locks/plan.json) whose
first Linux wheel was uploaded at least `settle_days` ago is "settled"; a younger one is
"waiting" with the day it settles; a planned release whose every file is yanked is "yanked".
The upload times and yank marks come from the index's PEP 691 JSON (cached; offline from the
cache). Pure functions over those answers; the I/O is `fetch_releases`.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from packaging.version import Version

from ..model.index import SIMPLE_JSON, IndexUnavailable, _http_get, linux_wheels

DEFAULT_SETTLE_DAYS = 7


@dataclass(frozen=True)
class Release:
    """One release of a project on the index: its first Linux wheel's upload, its yank."""

    name: str
    version: str
    uploaded: str | None  # ISO 8601 UTC of its earliest Linux wheel
    yanked: bool  # every Linux wheel of it is yanked
    yanked_reason: str = ""


@dataclass(frozen=True)
class WatchLine:
    engine: str
    version: str
    kind: str  # "settled" (bump due), "blocked" (settled, a pin missing), "waiting", "yanked"
    age_days: float | None
    detail: str

    def text(self) -> str:
        age = f"{self.age_days:.1f} days old" if self.age_days is not None else "age unknown"
        return f"{self.kind}: {self.engine} {self.version} ({age}): {self.detail}"


def releases_of(name: str, files: Iterable[dict[str, Any]]) -> list[Release]:
    """The releases with a Linux (or pure-Python) wheel, oldest first, from PEP 691 `files`."""
    seen: dict[Version, dict[str, Any]] = {}
    for entry, version in linux_wheels(files):
        row = seen.setdefault(version, {"uploaded": None, "yanked": True, "reason": ""})
        uploaded = entry.get("upload-time")
        if uploaded and (row["uploaded"] is None or uploaded < row["uploaded"]):
            row["uploaded"] = uploaded
        yanked = entry.get("yanked") or False
        row["yanked"] = row["yanked"] and bool(yanked)
        if isinstance(yanked, str):
            row["reason"] = yanked
    return [Release(name, str(v), row["uploaded"], row["yanked"], row["reason"] if row["yanked"]
                    else "") for v, row in sorted(seen.items())]


def _age_days(uploaded: str | None, now: datetime.datetime) -> float | None:
    if not uploaded:
        return None
    when = datetime.datetime.fromisoformat(uploaded.replace("Z", "+00:00"))
    return (now - when).total_seconds() / 86400


def watch(planned: dict[str, set[str]], releases: dict[str, list[Release]],
          now: datetime.datetime, settle_days: float = DEFAULT_SETTLE_DAYS,
          why_not: Callable[[str, str], str | None] | None = None) -> list[WatchLine]:
    """What a bump of the committed plan would take. `planned`: engine -> the releases its
    cells use; `releases`: engine -> the index's releases; `why_not(engine, version)`: why a
    release cannot be installed from the index yet (a pin it lacks), else None."""
    lines: list[WatchLine] = []
    for engine, versions in sorted(planned.items()):
        known = releases.get(engine, [])
        if not versions:
            continue
        newest = max(Version(v) for v in versions)
        for release in known:
            version = Version(release.version)
            age = _age_days(release.uploaded, now)
            if release.version in versions and release.yanked:
                lines.append(WatchLine(engine, release.version, "yanked", age,
                                       "the plan uses it and the index marks every wheel "
                                       "yanked" + (f": {release.yanked_reason}"
                                                   if release.yanked_reason else "")))
            if version <= newest or version.is_prerelease or release.yanked:
                continue
            blocked = why_not(engine, release.version) if why_not else None
            if age is not None and age >= settle_days:
                detail = f"newer than the plan's {newest}, past the {settle_days:g}-day " \
                         "settle delay: bump"
                kind = "settled"
            else:
                settles = (datetime.datetime.fromisoformat(release.uploaded.replace("Z", "+00:00"))
                           + datetime.timedelta(days=settle_days)).date().isoformat() \
                    if release.uploaded else "unknown"
                detail = f"newer than the plan's {newest}; settles on {settles}"
                kind = "waiting"
            if blocked:  # a bump would not install: it waits for the pinned release
                kind = "blocked" if kind == "settled" else kind
                detail = detail.removesuffix(": bump") + \
                    f"; not installable from the index yet: {blocked}"
            lines.append(WatchLine(engine, release.version, kind, age, detail))
    return lines


def planned_versions(snapshot: dict[str, Any]) -> dict[str, set[str]]:
    """engine -> the releases of the committed plan's cells that are not pruned."""
    out: dict[str, set[str]] = {}
    for cell in snapshot.get("cells", {}).values():
        if cell.get("status") != "pruned" and cell.get("version"):
            out.setdefault(cell["engine"], set()).add(cell["version"])
    return out


def fetch_releases(cache: Path, name: str, index: str, offline: bool = False) -> list[Release]:
    """The releases of `name` with upload times and yank marks (PEP 691 JSON), cached under
    `cache`; offline (or the index unreachable) from the cache, else IndexUnavailable."""
    path = cache / f"{name}.json"
    if not offline:
        try:
            data = json.loads(_http_get(index.rstrip("/") + f"/{name}/", {"Accept": SIMPLE_JSON}))
            files = [{k: f.get(k) for k in ("filename", "upload-time", "yanked")}
                     for f in data.get("files", [])]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(files), encoding="utf-8")
            return releases_of(name, files)
        except IndexUnavailable:
            pass
    if path.is_file():
        return releases_of(name, json.loads(path.read_text(encoding="utf-8")))
    raise IndexUnavailable(f"no cached release list of {name} for the watch (run once online)")


def as_json(lines: list[WatchLine]) -> list[dict[str, Any]]:
    return [asdict(line) for line in lines]


__all__ = ["DEFAULT_SETTLE_DAYS", "Release", "WatchLine", "as_json", "fetch_releases",
           "planned_versions", "releases_of", "watch"]
