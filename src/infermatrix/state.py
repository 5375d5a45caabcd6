"""The state directory: journal, logs, caches. One run at a time holds its lock."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from contextlib import contextmanager

from .errors import UsageError

DEFAULT_STATE_DIR = ".state"


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @classmethod
    def at(cls, root: Path | str) -> "StatePaths":
        return cls(Path(root).resolve())

    @property
    def journal(self) -> Path:  # one JSON file per cell
        return self.root / "journal"

    @property
    def logs(self) -> Path:  # logs/<cell-id>/<stage>.log
        return self.root / "logs"

    @property
    def index_cache(self) -> Path:  # package-index metadata
        return self.root / "cache" / "index"

    @property
    def kernels(self) -> Path:  # compiled kernel wheel cache
        return self.root / "cache" / "kernels"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def commands_log(self) -> Path:  # every external command, one per line
        return self.root / "commands.log"

    def cell_log(self, cell_id: str, stage: str) -> Path:
        return self.logs / cell_id / f"{stage}.log"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of either."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_HELD: dict[Path, int] = {}  # state roots this process holds, with nesting depth


@contextmanager
def run_lock(state: StatePaths, wait: bool = False, timeout_s: float = 3600) -> Iterator[None]:
    """Hold the state directory for one run; a second run waits (`wait`) or refuses.

    Re-entrant within a process: the pipeline holds it and the stages it calls take it again.
    """
    if _HELD.get(state.root):
        _HELD[state.root] += 1
        try:
            yield
        finally:
            _HELD[state.root] -= 1
        return
    state.root.mkdir(parents=True, exist_ok=True)
    path = state.root / "run.lock"
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait or time.monotonic() > deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "another run"
                    raise UsageError(
                        f"state directory {state.root} is in use by {holder}; "
                        "wait for it to finish or pass --wait")
                time.sleep(1)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        handle.flush()
        _HELD[state.root] = 1
        try:
            yield
        finally:
            _HELD.pop(state.root, None)
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
