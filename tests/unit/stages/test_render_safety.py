"""render never loses committed files (issue 17): missing knowledge (offline without a cache,
an unreachable index) keeps a cell's directory and says why; only cells the matrix no longer
lists are deleted; every write is atomic per file and per cell directory (checked with real
SIGKILLs); render and plan hold the state lock. No Docker."""

from __future__ import annotations

from tests.paths import REPO, TESTS

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infermatrix.stages import render
from infermatrix.context import Context
from infermatrix.model.cell import CellPlan, Verdict
from infermatrix.stages.plan import plan_matrix

ROOT = REPO
FIXTURE_CELLS = "*kernel-fixture1.0*"


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under `directory`: sha256 and mode."""
    return {p.relative_to(directory).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                                  p.stat().st_mode & 0o777)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infermatrix", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """A copy of the project's matrix.yaml with its committed images/ and locks/."""
    for name in ("images", "locks"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "matrix.yaml", tmp_path / "matrix.yaml")
    return tmp_path


@pytest.fixture
def fixture_matrix(tmp_path: Path) -> Path:
    """A copy of tests/matrix/ (its fixture cells plan without any index)."""
    root = tmp_path / "project"
    (root / "matrix").mkdir(parents=True)
    (root / "fixtures").symlink_to(TESTS / "fixtures")
    shutil.copy(TESTS / "matrix" / "matrix.yaml", root / "matrix" / "matrix.yaml")
    shutil.copytree(TESTS / "matrix" / "locks", root / "matrix" / "locks")
    return root / "matrix" / "matrix.yaml"


@pytest.mark.parametrize("how", ["offline, empty cache", "index unreachable"])
def test_no_metadata_keeps_every_committed_file(shipped: Path, tmp_path: Path, how: str) -> None:
    before = snapshot(shipped / "images")
    assert len(before) >= 10  # the committed cells (53 files when this was written)
    args = ["render", "--matrix", str(shipped / "matrix.yaml"), "--state-dir",
            str(tmp_path / "empty-state")]
    env = {}
    if how.startswith("offline"):
        args.append("--offline")
    else:
        env["INFERMATRIX_INDEX_URL"] = "http://127.0.0.1:9/simple"  # nothing listens there
    proc = cli(*args, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "could not be rendered; their committed files under images/ are kept" in proc.stderr
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(shipped / "images") == before
    check = cli(*[a if a != "render" else "render" for a in args], "--check", env=env)
    assert check.returncode == 1
    assert "(not checked, committed files kept:" in check.stderr
    assert "fix: run `infermatrix render`" not in check.stderr  # that would not help
    assert snapshot(shipped / "images") == before


def _fixture_ctx(matrix: Path, tmp_path: Path) -> tuple[Context, list[CellPlan]]:
    ctx = Context.load(matrix, tmp_path / "state", offline=True)
    return ctx, plan_matrix(ctx, [FIXTURE_CELLS])


def test_prune_deletes_only_cells_the_matrix_no_longer_lists(fixture_matrix, tmp_path) -> None:
    ctx, plans = _fixture_ctx(fixture_matrix, tmp_path)
    planned, unresolved = plans[0], plans[1]
    assert planned.planned and unresolved.planned
    unresolved = CellPlan(unresolved.cell, "unresolved",
                          [Verdict("index-unreachable", "index unreachable: test", "network")])
    kept = ctx.images_dir / unresolved.id
    kept.mkdir(parents=True)
    (kept / "Dockerfile").write_text("# committed earlier\n")
    gone = ctx.images_dir / "cu130-torch0.0.0-gone1.0-sm120"
    gone.mkdir()
    (gone / "Dockerfile").write_text("# a cell the matrix dropped\n")
    render.render_cells(ctx, [planned, unresolved], prune=True)
    assert not gone.exists()
    assert (kept / "Dockerfile").read_text() == "# committed earlier\n"
    assert (ctx.images_dir / planned.id / "Dockerfile").is_file()
    assert render.unrendered([planned, unresolved]) == [(unresolved.id, "index unreachable: test")]
    assert sorted(p.name for p in ctx.images_dir.iterdir()) == sorted([planned.id, unresolved.id])


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from infermatrix.stages.render import RenderedCell, write_cell
    target = Path(sys.argv[1])
    versions = []
    for tag, files in (("A", 40), ("B", 25)):
        cell = RenderedCell("cell")
        for i in range(files):
            cell.add_text(f"f{i}.txt", f"{tag} {i}\\n" * 2000, executable=i % 3 == 0)
        cell.add_text(f"only-{tag}/x", tag)
        versions.append(cell)
    print("ready", flush=True)
    while True:
        for cell in versions:
            write_cell(target, cell)
""")


def _version_of(directory: Path) -> str | None:
    """"A" or "B" when the directory holds exactly one complete version, else None."""
    files = {p.relative_to(directory).as_posix(): p for p in directory.rglob("*") if p.is_file()}
    for tag, count in (("A", 40), ("B", 25)):
        wanted = {f"f{i}.txt" for i in range(count)} | {f"only-{tag}/x"}
        if set(files) == wanted and all(
                files[f"f{i}.txt"].read_text() == f"{tag} {i}\n" * 2000
                and bool(files[f"f{i}.txt"].stat().st_mode & 0o100) == (i % 3 == 0)
                for i in range(count)):
            return tag
    return None


def test_sigkill_during_writes_leaves_one_whole_version(tmp_path: Path) -> None:
    """20 real SIGKILLs of a process rewriting a cell directory: after recovery it is always
    exactly the old or the new version, never a mixture or a half-written file."""
    images = tmp_path / "images"
    target = images / "cell"
    rng = random.Random(17)
    seen = set()
    subprocess.run([sys.executable, "-c", WRITER.replace("while True:", "for _ in [0]:"),
                    str(target)], check=True, capture_output=True)  # committed before
    assert _version_of(target) == "B"
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        render.recover_interrupted(images)
        version = _version_of(target)
        assert version in ("A", "B"), sorted(p.name for p in target.rglob("*"))
        seen.add(version)
        assert [p.name for p in images.iterdir()] == ["cell"]  # no staging leftovers
    assert seen  # (both usually; which one is up to the timing)


def test_write_cell_leaves_an_unchanged_directory_alone(tmp_path: Path) -> None:
    cell = render.RenderedCell("c")
    cell.add_text("Dockerfile", "FROM scratch\n")
    cell.add_text("serve", "#!/bin/sh\n", executable=True)
    assert render.write_cell(tmp_path / "c", cell)
    inode = (tmp_path / "c").stat().st_ino
    assert not render.write_cell(tmp_path / "c", cell)
    assert (tmp_path / "c").stat().st_ino == inode
    assert snapshot(tmp_path / "c") == {
        "Dockerfile": (hashlib.sha256(b"FROM scratch\n").hexdigest(), 0o644),
        "serve": (hashlib.sha256(b"#!/bin/sh\n").hexdigest(), 0o755)}


HOLDER = textwrap.dedent("""
    import sys
    from infermatrix.state import StatePaths, run_lock
    with run_lock(StatePaths.at(sys.argv[1])):
        print("held", flush=True)
        sys.stdin.readline()  # until the test lets go (a fixed time raced a loaded machine)
""")


# `plan --offline` only reads: it shares the state with a run (issue 47,
# tests/unit/toplevel/test_state.py); online `plan` writes the metadata cache and takes the lock.
@pytest.mark.parametrize("command", ["render"])
def test_writers_take_the_state_lock(fixture_matrix: Path, tmp_path: Path, command: str) -> None:
    state = tmp_path / "state"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(state)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    waiter = None
    try:
        assert holder.stdout and holder.stdout.readline().strip() == "held"
        args = [command, "--offline", "--matrix", str(fixture_matrix), "--state-dir", str(state),
                "--select", FIXTURE_CELLS]
        refused = cli(*args)
        assert refused.returncode == 2, refused.stderr
        assert "is in use by pid" in refused.stderr and "--wait" in refused.stderr
        assert not (fixture_matrix.parent / "images").exists()
        waiter = subprocess.Popen([sys.executable, "-m", "infermatrix", *args, "--wait"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        assert waiter.poll() is None  # it waits for the holder
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
        _, err = waiter.communicate(timeout=300)
        assert waiter.returncode == 0, err
    finally:
        for process in (holder, waiter):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    if command == "render":
        assert sorted(p.name for p in (fixture_matrix.parent / "images").iterdir()) == [
            "cu130-torch2.13.0-kernel-fixture1.0-sm120", "cu130-torch2.13.0-kernel-fixture1.0-sm121",
            "cu130-torch2.13.0-kernel-fixture1.0-sm90"]


def test_recovery_leaves_the_staging_of_a_render_still_running_elsewhere(tmp_path: Path) -> None:
    """Two renders into one images/ (two CI lanes, two users): recovery drops what a dead
    process left and never the work in progress of a live one (its pid is in the name)."""
    images = tmp_path / "images"
    (images / "cell").mkdir(parents=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        (images / f".cell{render.STAGING}{live.pid}-abc").mkdir()
        (images / f".cell{render.STAGING}{dead.pid}-def").mkdir()
        (images / f".cell{render.STAGING}old-style").mkdir()  # before names carried a pid
        render.recover_interrupted(images)
        assert sorted(p.name for p in images.iterdir()) == [
            f".cell{render.STAGING}{live.pid}-abc", "cell"]
    finally:
        live.kill()
        live.wait()
    render.recover_interrupted(images)
    assert [p.name for p in images.iterdir()] == ["cell"]


def test_render_with_every_cell_excluded_deletes_nothing_and_says_so(fixture_matrix: Path,
                                                                     tmp_path: Path) -> None:
    """Issue 48: `exclude: ["*"]` (or any exclusion that leaves no cell planned) made render
    delete every committed cell directory without a word. It is refused (exit 2), naming why
    and the fix; images/ is untouched."""
    common = ["--matrix", str(fixture_matrix), "--state-dir", str(tmp_path / "state")]
    first = cli("render", *common)
    assert first.returncode == 0, first.stderr
    images = fixture_matrix.parent / "images"
    before = snapshot(images)
    assert len({p.split("/")[0] for p in before}) >= 2
    text = fixture_matrix.read_text()
    assert "\nexclude: []\n" in text
    fixture_matrix.write_text(text.replace("\nexclude: []\n", '\nexclude: ["*"]\n'))
    refused = cli("render", *common)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    assert "no cell is planned" in refused.stderr and "every committed cell directory" in \
        refused.stderr and "fix:" in refused.stderr, refused.stderr
    assert snapshot(images) == before
    # the check says the same without writing
    checked = cli("render", "--check", *common)
    assert checked.returncode == 2 and "no cell is planned" in checked.stderr, checked.stderr
