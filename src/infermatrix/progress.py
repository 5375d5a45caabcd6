"""Live progress of cells through the stages, for `infermatrix build` and the pipeline.

On a terminal it is a rich Live table (one row per cell: current stage, status, elapsed time in
the stage, total time, last detail), redrawn a few times a second, with a line printed above
the table for every finished stage so the scrollback keeps the history. When stdout is not a
terminal (CI, a pipe) or NO_COLOR is set, it prints one plain line per event instead:

    [+   12.3s] cu130-torch2.11.0-sglang0.5.11-sm120 build: start
    [+ 1905.7s] cu130-torch2.11.0-sglang0.5.11-sm120 build: pass in 1893.4s (1/12 cells done)

API (every method is thread-safe: builds of several cells may report from several threads):

    from infermatrix.progress import Progress

    with Progress([plan.id for plan in plans]) as progress:   # ids, Cells or CellPlans
        progress.start(cell_id, "build")                        # a stage begins
        progress.note(cell_id, "flash-attn: cache hit")         # optional free-form detail
        progress.finish(cell_id, "build", "pass", detail="15.9 GB")  # pass | fail | skip
        with progress.stage(cell_id, "audit"):                  # start + finish in one:
            ...                                                 #   pass, or fail and re-raise

    Progress(cells, plain=True)          # force plain lines (plain=False forces the live table)
    Progress(cells, console=Console())   # where to draw (default: stdout)
    progress.counts()                    # {"waiting": n, "running": n, "pass": n, ...}

    Progress(cells, stages=["lock", "render", "build"])  # the run's stages: lines then say
                                                         # "(3/12 cells done)"

A cell is done when a stage finished `fail`, or when it finished the last of `stages`. `finish`
of a stage that was never started is accepted (recorded with no duration), and a cell id not
given to the constructor is added on first use.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

STATUS_STYLES = {"waiting": "dim", "running": "bold cyan", "pass": "green", "fail": "bold red",
                 "skip": "yellow"}
FINISHED = ("pass", "fail", "skip")


@dataclass
class CellProgress:
    """Where one cell is: its current (or last) stage, that stage's state, and times."""

    id: str
    stage: str | None = None
    state: str = "waiting"  # waiting | running | pass | fail | skip
    detail: str = ""
    stage_started: float | None = None
    first_started: float | None = None
    last_finished: float | None = None
    failed: bool = False
    durations: dict[str, float] = field(default_factory=dict)

    def elapsed(self, now: float) -> float | None:
        """Seconds in the running stage, or the duration of the last finished one."""
        if self.state == "running" and self.stage_started is not None:
            return now - self.stage_started
        return self.durations.get(self.stage or "")

    def total(self, now: float) -> float | None:
        if self.first_started is None:
            return None
        end = now if self.state == "running" else (self.last_finished or now)
        return end - self.first_started


def _cell_id(cell: Any) -> str:
    return str(getattr(cell, "id", cell))


def wants_plain(console: Console) -> bool:
    """Plain lines when NO_COLOR is set (no-color.org: any non-empty value) or the output is
    not an interactive terminal."""
    if os.environ.get("NO_COLOR"):
        return True
    return not console.is_terminal or console.is_dumb_terminal


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    if value < 60:
        return f"{value:.1f}s"
    minutes, seconds = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """Live progress of cells through stages; see the module docstring for the API."""

    def __init__(self, cells: Iterable[Any] = (), *, console: Console | None = None,
                 plain: bool | None = None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 refresh_per_second: float = 4, title: str = "infermatrix",
                 stages: Sequence[str] | None = None) -> None:
        self.console = console if console is not None else Console(file=stream)
        self.plain = wants_plain(self.console) if plain is None else plain
        self.title = title
        self.last_stage = stages[-1] if stages else None
        self._clock = clock
        self._begun = clock()
        self._lock = threading.RLock()
        self._cells: dict[str, CellProgress] = {}
        for cell in cells:
            self._ensure(_cell_id(cell))
        self._live: Live | None = None
        self._refresh_per_second = refresh_per_second

    # -- context --------------------------------------------------------------------------
    def __enter__(self) -> "Progress":
        if not self.plain:
            self._live = Live(console=self.console, get_renderable=self._render,
                              refresh_per_second=self._refresh_per_second, transient=False,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()  # draws the final table once more
            self._live = None
        elif self.plain:
            self._emit(self._summary_line())

    # -- events ---------------------------------------------------------------------------
    def start(self, cell_id: Any, stage: str, detail: str = "") -> None:
        with self._lock:
            now = self._clock()
            cell = self._ensure(_cell_id(cell_id))
            cell.stage, cell.state, cell.detail = stage, "running", detail
            cell.stage_started = now
            if cell.first_started is None:
                cell.first_started = now
            if self.plain:
                self._emit(self._line(cell, f"{stage}: start" + (f" — {detail}" if detail else "")))

    def finish(self, cell_id: Any, stage: str, status: str, detail: str = "",
               duration_s: float | None = None) -> None:
        """A stage ended with `status` (pass, fail, skip). `duration_s` overrides the measured
        time (e.g. a stage resumed from the journal)."""
        with self._lock:
            now = self._clock()
            cell = self._ensure(_cell_id(cell_id))
            started = cell.stage_started if cell.stage == stage else None
            if duration_s is None and started is not None:
                duration_s = now - started
            if duration_s is not None:
                cell.durations[stage] = duration_s
            cell.stage, cell.state, cell.detail = stage, status, detail
            cell.stage_started, cell.last_finished = None, now
            cell.failed = cell.failed or status == "fail"
            text = f"{stage}: {status}"
            if duration_s is not None:
                text += f" in {_seconds(duration_s)}"
            if detail:
                text += f" — {detail}"
            if self.last_stage:
                text += f" ({self._done_count()}/{len(self._cells)} cells done)"
            if self.plain:
                self._emit(self._line(cell, text))
            live = self._live
        if live is not None:
            # Outside our lock: Live's refresh thread holds its own lock while it calls
            # _render, which takes ours; printing under ours could deadlock.
            live.console.print(Text.assemble((f"{_cell_id(cell_id)} ", "bold"),
                                             (text, STATUS_STYLES.get(status, ""))))

    def note(self, cell_id: Any, message: str) -> None:
        """A free-form detail for the cell's current stage (shown in the table, or a line)."""
        with self._lock:
            cell = self._ensure(_cell_id(cell_id))
            cell.detail = message
            if self.plain:
                self._emit(self._line(cell, f"{cell.stage or '-'}: {message}"))

    @contextmanager
    def stage(self, cell_id: Any, stage: str, detail: str = "") -> Iterator[None]:
        """start + finish around a block: pass when it returns, fail (and re-raise) when it
        raises."""
        self.start(cell_id, stage, detail)
        try:
            yield
        except BaseException as exc:
            message = str(exc).strip().splitlines()
            self.finish(cell_id, stage, "fail", message[0][:200] if message else type(exc).__name__)
            raise
        self.finish(cell_id, stage, "pass")

    # -- views ----------------------------------------------------------------------------
    def snapshot(self) -> list[CellProgress]:
        with self._lock:
            return [CellProgress(**{**c.__dict__, "durations": dict(c.durations)})
                    for c in self._cells.values()]

    def counts(self) -> dict[str, int]:
        with self._lock:
            found = {state: 0 for state in ("waiting", "running", "pass", "fail", "skip")}
            for cell in self._cells.values():
                key = "fail" if cell.failed and cell.state != "running" else cell.state
                found[key] = found.get(key, 0) + 1
            return found

    # -- internals ------------------------------------------------------------------------
    def _ensure(self, cell_id: str) -> CellProgress:
        if cell_id not in self._cells:
            self._cells[cell_id] = CellProgress(cell_id)
        return self._cells[cell_id]

    def _is_done(self, cell: CellProgress) -> bool:
        """Failed, or finished the last stage of the run (`stages`)."""
        if cell.state == "running":
            return False
        return cell.failed or (cell.stage == self.last_stage and cell.state in FINISHED)

    def _done_count(self) -> int:
        return sum(1 for c in self._cells.values() if self._is_done(c))

    def _line(self, cell: CellProgress, text: str) -> str:
        return f"[+{self._clock() - self._begun:8.1f}s] {cell.id} {text}"

    def _emit(self, line: str) -> None:
        # One write per line, under the lock: lines from several threads never interleave.
        with self._lock:
            self.console.file.write(line + "\n")
            self.console.file.flush()

    def _summary_line(self) -> str:
        counts = self.counts()
        parts = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        return f"[+{self._clock() - self._begun:8.1f}s] {self.title}: {len(self._cells)} cells: " \
            f"{parts or 'none'}"

    def _render(self) -> RenderableType:
        with self._lock:
            now = self._clock()
            cells = list(self._cells.values())
            counts = self.counts()
        header = Text(f"{self.title}: {len(cells)} cells — " + ", ".join(
            f"{n} {state}" for state, n in counts.items() if n) +
            f" — {_seconds(now - self._begun)}")
        table = Table(show_edge=False, pad_edge=False, expand=False)
        table.add_column("cell", no_wrap=True)
        table.add_column("stage", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("elapsed", justify="right", no_wrap=True)
        table.add_column("total", justify="right", no_wrap=True)
        table.add_column("detail", overflow="ellipsis", no_wrap=True)
        shown, hidden = self._rows_that_fit(cells)
        for cell in shown:
            state = "fail" if cell.failed and cell.state != "running" else cell.state
            table.add_row(Text(cell.id), cell.stage or "", Text(cell.state,
                          style=STATUS_STYLES.get(state, "")),
                          _seconds(cell.elapsed(now)), _seconds(cell.total(now)),
                          Text(cell.detail))
        if hidden:
            table.add_row(Text(f"… {hidden} more cells", style="dim"), "", "", "", "", "")
        return Group(header, table)

    def _rows_that_fit(self, cells: list[CellProgress]) -> tuple[list[CellProgress], int]:
        """All cells when they fit the terminal; else running and failed ones first."""
        limit = max(5, self.console.size.height - 6)
        if len(cells) <= limit:
            return cells, 0
        rank = {"running": 0, "fail": 1}
        ordered = sorted(cells, key=lambda c: rank.get("fail" if c.failed else c.state, 2))
        return ordered[:limit - 1], len(cells) - (limit - 1)
