"""Long work you can watch (issue 31): a kernel compile's files done / total with an ETA, and a
heartbeat for the other long steps.

On a terminal each compiling cell gets a live bar (rich; one display shared by the cells that
compile at once); without one (CI, nohup, a pipe) a plain line every `every` seconds. The figures
come from model/compileprogress.py, fed with the build's output lines as they arrive.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .model.compileprogress import CompileProgress, Prior, clock

PLAIN_EVERY_S = 60.0

_LIVE_LOCK = threading.Lock()
_LIVE: dict[str, Any] = {"progress": None, "users": 0}


def is_terminal() -> bool:
    return sys.stderr.isatty()


def to_stderr(text: str) -> None:
    """The default echo of a heartbeat: a line on stderr (stdout stays the command's result)."""
    print(text, file=sys.stderr, flush=True)


def _shared_bar() -> Any:
    """The one rich Progress display of this process (started by its first user)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, \
        TimeElapsedColumn

    with _LIVE_LOCK:
        if _LIVE["progress"] is None:
            bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("files"), TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                      console=Console(stderr=True), refresh_per_second=2)
            bar.start()
            _LIVE["progress"] = bar
        _LIVE["users"] += 1
        return _LIVE["progress"]


def _release_bar() -> None:
    with _LIVE_LOCK:
        _LIVE["users"] -= 1
        if _LIVE["users"] == 0 and _LIVE["progress"] is not None:
            _LIVE["progress"].stop()
            _LIVE["progress"] = None


class CompileWatch:
    """Feeds one compile's output lines to a CompileProgress and shows it; a context manager."""

    def __init__(self, label: str, prior: Prior, echo: Callable[[str], None],
                 terminal: bool | None = None, every: float = PLAIN_EVERY_S,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.label, self.echo, self.every, self.now = label, echo, every, now
        self.terminal = is_terminal() if terminal is None else terminal
        self.progress = CompileProgress(prior=prior, started=now())
        self._lock = threading.Lock()
        self._said = self.progress.started
        self._stop = threading.Event()
        self._bar: Any = None
        self._task: Any = None
        self._ticker: threading.Thread | None = None
        self.lines: list[str] = []  # the plain lines it printed (the journal keeps the last)

    def __enter__(self) -> CompileWatch:
        if self.terminal:
            self._bar = _shared_bar()
            self._task = self._bar.add_task(self.label, total=None, eta=self._eta_text())
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        if self._bar is not None:
            self._bar.remove_task(self._task)
            _release_bar()

    def on_line(self, line: str) -> None:
        with self._lock:
            if not self.progress.feed(line, self.now()):
                return
            if self._bar is not None:
                self._bar.update(self._task, completed=self.progress.done,
                                 total=self.progress.total or None, eta=self._eta_text())

    def _eta_text(self) -> str:
        eta = self.progress.eta_s(self.now())
        return f"ETA {clock(eta)} ({self.progress.prior.origin})" if eta is not None else ""

    def _tick(self) -> None:
        """The bar's ETA counts down between files; without a bar, a line every `every` s."""
        while not self._stop.wait(1.0 if self._bar is not None else min(self.every, 5.0)):
            if self._bar is not None:
                with self._lock:
                    self._bar.update(self._task, eta=self._eta_text())
            elif self.now() - self._said >= self.every:
                self.say()

    def say(self) -> None:
        """One plain progress line now."""
        with self._lock:
            self._said = self.now()
            text = f"{self.label}: {self.progress.line(self._said)}"
        self.lines.append(text)
        self.echo(text)


class Heartbeat:
    """A line every `every` seconds while a long step runs without a bar of its own (base build,
    image build, push, pull, the audit's probe, the smoke's server start): what runs, for how
    long, and its last output line."""

    def __init__(self, label: str, echo: Callable[[str], None] = to_stderr,
                 every: float = PLAIN_EVERY_S, now: Callable[[], float] = time.monotonic) -> None:
        self.label, self.echo, self.every, self.now = label, echo, every, now
        self.started = now()
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def on_line(self, line: str) -> None:
        if line.strip():
            self.last = line.strip()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            last = self.last if len(self.last) <= 100 else self.last[:99] + "…"
            self.echo(f"{self.label}: still running, {clock(self.now() - self.started)} "
                      f"elapsed" + (f"; last: {last}" if last else ""))
