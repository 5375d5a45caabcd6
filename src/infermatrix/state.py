"""The state directory: journal, logs, caches. One run at a time holds its lock."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from contextlib import contextmanager

from .errors import DamagedStateFile, UsageError
from .names import inside

log = logging.getLogger(__name__)

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
    def triton_cache(self) -> Path:  # the audit's Triton census outputs, by what they depend on
        return self.root / "cache" / "triton"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def commands_log(self) -> Path:  # every external command, one per line
        return self.root / "commands.log"

    def cell_log(self, cell_id: str, stage: str) -> Path:
        return inside(self.logs, cell_id, f"{stage}.log")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of either."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """`text` to `path` whole or not at all: written and flushed beside it, then renamed over it."""
    os.replace(write_text_beside(path, text), path)


def write_text_beside(path: Path, text: str) -> Path:
    """`text` in a temp file beside `path`, flushed to disk; the caller renames it over `path`
    (os.replace) when every file of a set is written. A failed write (a full disk) leaves no
    temp file; its OSError carries `path` as its filename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def read_state_text(path: Path, kind: str, fix: str) -> str:
    """The UTF-8 text of a state file; DamagedStateFile naming it (binary, unreadable)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DamagedStateFile(f"{kind} cannot be read: {exc.strerror or exc}", path,
                               fix=fix) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DamagedStateFile(f"damaged {kind}: not UTF-8 text (binary?)", path, line,
                               fix) from None


def read_state_json(path: Path, kind: str, fix: str, shape: type = dict) -> Any:
    """The one reader of a JSON state file: its data, of type `shape`, or DamagedStateFile
    naming the file, the line and the fix (empty, truncated, binary, not an object)."""
    text = read_state_text(path, kind, fix)
    if not text.strip():
        raise DamagedStateFile(f"damaged {kind}: the file is empty", path, 1, fix)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DamagedStateFile(f"damaged {kind}: {exc.msg} (truncated?)", path, exc.lineno,
                               fix) from None
    except RecursionError:  # issue 48's fuzz: `[[[[...` deeper than the decoder goes
        raise DamagedStateFile(f"damaged {kind}: nested too deep to be one", path, 1,
                               fix) from None
    if not isinstance(data, shape):
        raise DamagedStateFile(f"damaged {kind}: expected a JSON {shape.__name__}, found "
                               f"{type(data).__name__}", path, 1, fix)
    return data


def notice(text: str) -> None:
    """Tell the user what the tool did on its own (a damaged file rebuilt), on stderr."""
    print(f"infermatrix: {text}", file=sys.stderr)


# State roots this thread holds, with nesting depth. Per thread, not per process: another
# thread of the process (a test's holder, a server's worker) is another run and must wait on
# the flock like another process would (two open() of one file are two flock holders).
_HELD_HERE = threading.local()


def _held() -> dict[Path, int]:
    if not hasattr(_HELD_HERE, "roots"):
        _HELD_HERE.roots = {}
    return _HELD_HERE.roots


def clear_stale_tmp(tmp: Path) -> list[str]:
    """Remove what a killed run left in the state's tmp/ (build contexts, kernel outputs): only
    the holder of the run lock writes there, so at its start anything there is a dead run's."""
    if not tmp.is_dir():
        return []
    left = sorted(entry.name for entry in tmp.iterdir())
    for name in left:
        target = tmp / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    if left:
        log.info("removed %d entries a killed run left in %s: %s", len(left), tmp,
                 ", ".join(left[:5]))
    return left


@contextmanager
def run_lock(state: StatePaths, wait: bool = False, timeout_s: float = 3600) -> Iterator[None]:
    """Hold the state directory for one run; a second run waits (`wait`) or refuses.

    Re-entrant within a thread: the pipeline holds it and the stages it calls take it again.
    """
    held = _held()
    if held.get(state.root):
        held[state.root] += 1
        try:
            yield
        finally:
            held[state.root] -= 1
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
        if no_readers(state):  # a reader (`audit`, `plan --offline`) may be using tmp/
            clear_stale_tmp(state.root / "tmp")
        held[state.root] = 1
        try:
            yield
        finally:
            held.pop(state.root, None)
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


READERS_LOCK = "readers.lock"


def no_readers(state: StatePaths) -> bool:
    """True when no read-only command holds the state (its shared lock)."""
    path = state.root / READERS_LOCK
    if not path.exists():
        return True
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


@contextmanager
def state_lock(state: StatePaths, *, shared: bool = False, wait: bool = False
               ) -> Iterator[None]:
    """The state lock in its two modes (issue 47). Exclusive (`run_lock`): a run that writes
    the state; a second one waits or is refused. Shared: a read-only command (`plan --offline`,
    `audit`, `report`) runs beside a run and beside other readers, never refused: the run's
    files are written atomically (journal records under their own per-cell lock), and a run
    that starts meanwhile leaves tmp/ alone while a reader holds the readers' lock."""
    if not shared:
        with run_lock(state, wait=wait):
            yield
        return
    state.root.mkdir(parents=True, exist_ok=True)
    # only an exclusive reader check (no_readers) holds it exclusively, briefly
    with flocked(state.root / READERS_LOCK, fcntl.LOCK_SH):
        yield


@contextmanager
def record_lock(state: StatePaths, name: str) -> Iterator[None]:
    """One writer at a time of the state file `name` (a journal record's read-modify-write),
    across processes: a run and a reader's own records never lose each other's update. The
    lock files live in <state>/record-locks/, beside nothing they would be mistaken for."""
    lock = inside(state.root / "record-locks", f"{name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with flocked(lock):
        yield


@contextmanager
def flocked(path: Path, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
    """The block runs holding an flock of `path` (created when missing) in `mode`; other
    processes asking for it wait."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
