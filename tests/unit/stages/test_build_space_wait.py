"""A cell short of disk waits for the run's own builds under way (they hold the space it lacks;
their cache is pruned after them) and fails only when none is left (issue 47). The waiting is
real threads on the real RunningBuilds; the disk figure is a FAKE (free_gib scripted)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from infermatrix.context import Context
from infermatrix.stages import build
from infermatrix.stages.build import RunningBuilds, space_decision
from tests.paths import TESTS
from tests.support.recording_engine import RecordingEngine

CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm120"


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    shutil.copytree(TESTS / "matrix", tmp_path / "matrix",
                    ignore=shutil.ignore_patterns("images"))
    context = Context.load(tmp_path / "matrix" / "matrix.yaml", tmp_path / "state")
    context.matrix.build["disk"] = {"min_free_gib": 40, "prune_when_low": True}
    return context


@pytest.mark.parametrize(("free", "need", "holders", "decision"), [
    (50.0, 40.0, [], "go"),
    (50.0, 40.0, ["other"], "go"),
    (33.5, 40.0, ["other"], "wait"),  # issue 47: 33.5 GiB free while another build held space
    (33.5, 40.0, [], "fail"),
])
def test_the_space_decision(free, need, holders, decision):
    assert space_decision(free, need, holders) == decision


def test_a_short_cell_waits_for_the_runs_own_build_then_starts(ctx, tmp_path, monkeypatch):
    fake = RecordingEngine(data_root=tmp_path)
    free = {"gib": 33.5}
    monkeypatch.setattr(build, "free_gib", lambda root: free["gib"])  # FAKE disk figure
    running = RunningBuilds()
    running.start(tmp_path, "holder")
    lines: list[str] = []
    log = tmp_path / "build.log"
    log.write_text("")

    def holder_ends() -> None:
        assert running.others(tmp_path, CELL) == ["holder"]
        free["gib"] = 60.0  # its build ended, its cache pruned
        running.end(tmp_path, "holder")

    waiter = threading.Thread(target=lambda: lines.append(
        str(build.disk_refusal(ctx, CELL, log, lines.append, fake, running))))
    waiter.start()
    for _ in range(200):  # the waiter said it waits
        if any("waiting for the run's own build" in line for line in lines):
            break
        threading.Event().wait(0.01)
    holder_ends()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert lines[-1] == "None"  # no refusal: the cell starts
    assert any("(holder)" in line for line in lines)
    assert "waiting for holder to end" in log.read_text()


def test_a_short_cell_with_no_build_of_the_run_under_way_fails_at_once(ctx, tmp_path,
                                                                         monkeypatch):
    fake = RecordingEngine(data_root=tmp_path)
    monkeypatch.setattr(build, "free_gib", lambda root: 33.5)  # FAKE disk figure
    log = tmp_path / "build.log"
    log.write_text("")
    reason = build.disk_refusal(ctx, CELL, log, lambda _: None, fake, RunningBuilds())
    assert reason is not None and reason.startswith("not started: 33.5 GiB free")
    assert "no other build of this run holds space" in reason
    assert len(fake.named("prune_build_cache")) >= 1  # pruned before giving up


def test_a_building_cell_holds_its_place_until_it_ends(tmp_path):
    running = RunningBuilds()
    with running.holding(tmp_path, "a"):
        assert running.others(tmp_path, "b") == ["a"]
        assert running.others(tmp_path / "elsewhere", "b") == []  # another engine's disk
        assert running.wait_for_one_of(tmp_path, ["a"], timeout=0.05) is False
    assert running.others(tmp_path, "b") == []
    assert running.wait_for_one_of(tmp_path, ["a"], timeout=0.05) is True


def test_a_waiting_cell_gives_up_when_the_run_is_interrupted(ctx, tmp_path, monkeypatch):
    from infermatrix import proc

    fake = RecordingEngine(data_root=tmp_path)
    monkeypatch.setattr(build, "free_gib", lambda root: 33.5)  # FAKE disk figure
    running = RunningBuilds()
    running.start(tmp_path, "holder")  # never ends: only the interrupt frees the waiter
    log = tmp_path / "build.log"
    log.write_text("")
    monkeypatch.setattr(proc, "STOPPING", __import__("threading").Event())
    proc.STOPPING.set()
    reason = build.disk_refusal(ctx, CELL, log, lambda _: None, fake, running)
    assert reason == "the run was interrupted while this cell waited for its turn"
