"""State directory: atomic journal writes and the one-run-at-a-time lock."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from infermatrix import journal
from infermatrix.errors import UsageError
from infermatrix.state import StatePaths, run_lock


def test_record_stage_is_atomic_and_leaves_no_temp_files(tmp_path):
    state = StatePaths.at(tmp_path)
    journal.record_stage(state, "cell-a", "build", "pass", duration_s=1.23456, image_id="sha256:x")
    journal.record_stage(state, "cell-a", "audit", "fail", reason="uncovered: libx.so")
    record = json.loads((tmp_path / "journal" / "cell-a.json").read_text())
    assert record["image_id"] == "sha256:x"
    assert record["stages"]["build"]["duration_s"] == 1.235
    assert record["stages"]["audit"]["reason"] == "uncovered: libx.so"
    assert [p.name for p in (tmp_path / "journal").iterdir()] == ["cell-a.json"]
    with pytest.raises(ValueError):
        journal.record_stage(state, "cell-a", "no-such-stage", "pass")


def test_a_typed_record_gives_a_stages_details_and_the_builder_empty_when_absent(tmp_path):
    state = StatePaths.at(tmp_path)
    journal.record_stage(state, "cell-a", "build", "pass", details={"kernels": {"k": {}}},
                         builder={"name": "gb10", "endpoint": "ssh://gb10"})
    record = journal.cell_record(state, "cell-a")
    assert record.details_of("build") == {"kernels": {"k": {}}}
    assert record.details_of("smoke") == {}
    assert record.builder == {"name": "gb10", "endpoint": "ssh://gb10"}
    assert record.builder_name == "gb10"
    assert journal.CellRecord("cell-b").builder == {}


def test_a_second_run_refuses_while_the_first_holds_the_lock(tmp_path):
    state = StatePaths.at(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time; sys.path.insert(0, 'src');"
         "from infermatrix.state import StatePaths, run_lock\n"
         f"with run_lock(StatePaths.at({str(tmp_path)!r})):\n"
         "    print('held', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match="in use by pid"):
            with run_lock(state):
                pass
    finally:
        holder.kill()
        holder.wait()
    with run_lock(state):  # released when the holder died
        with run_lock(state):  # re-entrant in one process
            pass


def test_another_thread_of_the_process_is_another_run_and_the_nesting_survives_its_release(
        tmp_path):
    """Seen in CI: a holder thread's release popped the depth the main thread's nested entry
    still counted (KeyError), because re-entrancy was per process, not per thread."""
    import threading

    state = StatePaths.at(tmp_path)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with run_lock(state):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(UsageError, match="in use by pid"):
            with run_lock(state):  # not re-entrant: the other thread holds it
                pass
    finally:
        release.set()
        holder.join()
    with run_lock(state):
        with run_lock(state):
            pass
        with run_lock(state):  # the depth is still this thread's after the inner exit
            pass


# -- issue 47: read-only commands share the state; records under their own lock ---------------

def holding_run(tmp_path):
    """Another process holding the run lock of the state at tmp_path (a run under way)."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time; sys.path.insert(0, 'src');"
         "from infermatrix.state import StatePaths, run_lock\n"
         f"with run_lock(StatePaths.at({str(tmp_path)!r})):\n"
         "    print('held', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_reader_shares_the_state_with_a_run_that_holds_it(tmp_path):
    from infermatrix.state import state_lock

    state = StatePaths.at(tmp_path)
    holder = holding_run(tmp_path)
    try:
        with state_lock(state, shared=True):  # not refused
            with state_lock(state, shared=True):  # nor beside another reader
                pass
        with pytest.raises(UsageError, match="in use by pid"):
            with state_lock(state):  # a writer still is
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_run_starting_beside_a_reader_leaves_tmp_alone(tmp_path):
    from infermatrix.state import state_lock

    state = StatePaths.at(tmp_path)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "readers-file").write_text("in use")
    with state_lock(state, shared=True):
        with run_lock(state):
            assert (tmp_path / "tmp" / "readers-file").exists()
    with run_lock(state):  # no reader: a dead run's leftovers go
        assert not (tmp_path / "tmp" / "readers-file").exists()


def test_plan_offline_runs_while_a_run_holds_the_state(tmp_path, capsys):
    from infermatrix.cli import main
    from tests.paths import TESTS

    holder = holding_run(tmp_path)
    try:
        code = main(["plan", "--offline", "--matrix", str(TESTS / "matrix" / "matrix.yaml"),
                     "--state-dir", str(tmp_path)])
    finally:
        holder.kill()
        holder.wait()
    assert code == 0, capsys.readouterr().err
    assert "planned" in capsys.readouterr().out


def test_writers_of_one_record_never_lose_each_others_update(tmp_path):
    import threading

    state = StatePaths.at(tmp_path)

    def write(prefix: str) -> None:
        for index in range(60):
            journal.update(state, "cell-a", **{f"{prefix}{index}": index})
    threads = [threading.Thread(target=write, args=(p,)) for p in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    record = journal.load(state, "cell-a")
    assert all(f"{p}{i}" in record for p in "ab" for i in range(60))
