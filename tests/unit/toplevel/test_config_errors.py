"""Bad input a hostile user gives: every problem of a file at once, each with file:line and a
fix, exit 2, and never a traceback (issue 17). Pure logic and subprocesses; no Docker."""

from __future__ import annotations

from tests.paths import REPO, TESTS

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infermatrix.cli import main
from infermatrix.config import load_arches, load_matrix
from infermatrix.errors import ConfigError, ConfigErrors

from tests.support.planning_support import DATA

MINI = (DATA / "mini_matrix.yaml").read_text()
TEST_MATRIX = TESTS / "matrix" / "matrix.yaml"


def write(tmp_path: Path, text: str | bytes, name: str = "matrix.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infermatrix", *args], capture_output=True,
                          text=True, timeout=timeout)


def problems(path: Path) -> list[ConfigError]:
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    return info.value.errors if isinstance(info.value, ConfigErrors) else [info.value]


def test_unknown_arch_is_an_error_with_line_and_known_arches(tmp_path):
    path = write(tmp_path, MINI.replace("arch: [sm_120, sm_121]", "arch: [sm_120, sm_999]"))
    [error] = problems(path)
    assert error.line == 14 and "unknown GPU arch 'sm_999'" in error.message
    assert "sm_120" in error.fix and "arches.yaml" in error.fix


def test_arch_suffix_must_exist_for_that_arch(tmp_path):
    path = write(tmp_path, MINI.replace("arch: [sm_120, sm_121]", "arch: [sm_90f, sm_120f]"))
    [error] = problems(path)  # sm_120f exists (family target), sm_90f does not
    assert error.line == 14 and "'sm_90f'" in error.message and "sm_90a" in error.fix


def test_known_arches_are_data_with_capability():
    arches = load_arches()
    assert arches["sm_120"]["capability"] == "12.0"
    assert arches["sm_121"]["capability"] == "12.1"
    for name, entry in arches.items():  # the capability is what sm_XY spells
        digits = name.split("_")[1]
        assert entry["capability"] == f"{int(digits[:-1])}.{digits[-1]}", name


def test_shipped_and_test_matrices_name_only_known_arches():
    root = REPO
    for path in (root / "matrix.yaml", TEST_MATRIX):
        load_matrix(path)


@pytest.mark.parametrize("text, written, read", [
    ('cuda: ["12.8", "12.9", "13.0"]', "12.10", "12.1"),
    ('torch: ["2.9.1", "2.11.0"]', "2.10", "2.1"),
])
def test_unquoted_number_is_reported_as_written(tmp_path, text, written, read):
    key = text.split(":")[0]
    path = write(tmp_path, MINI.replace(text, f"{key}: [{written}]"))
    [error] = problems(path)
    assert f"{written} is unquoted" in error.message and f"number {read}" in error.message
    assert error.fix == f'quote it: "{written}"'
    assert error.line == (11 if key == "cuda" else 12)


def test_every_error_of_a_file_is_reported_at_once(tmp_path):
    text = (MINI.replace("version: 1\n", "")  # missing version ...
            .replace('cuda: ["12.8", "12.9", "13.0"]', "cuda: [12.10]")  # ... and more faults
            .replace("arch: [sm_120, sm_121]", "arch: [sm_999]")
            .replace("  default: bookworm", "  default: trixie"))
    path = write(tmp_path, text)
    found = problems(path)
    messages = "\n".join(e.message for e in found)
    assert "'version' is required" in messages
    assert "12.10 is unquoted" in messages
    assert "unknown GPU arch 'sm_999'" in messages
    assert len(found) >= 3 and all(e.path == path and e.line for e in found)
    proc = cli("plan", "--matrix", str(path), "--state-dir", str(tmp_path / "state"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{len(found)} problems:" in proc.stderr and f"{path}:10:" in proc.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("encoding, named", [("utf-16", "UTF-16-LE"), ("utf-32", "UTF-32-LE"),
                                             ("utf-16-be", None), ("latin-1", None)])
def test_other_encodings_are_named(tmp_path, encoding, named):
    text = MINI.replace("Qwen/Qwen3.6-27B\n", "Qwen/Qwen3.6-27B-é\n", 1)
    path = write(tmp_path, text.encode(encoding))
    proc = cli("plan", "--matrix", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{path}:" in proc.stderr and "fix: save the file as UTF-8" in proc.stderr
    if named:
        assert f"the file is {named}" in proc.stderr
    else:
        assert "not UTF-8" in proc.stderr or "NUL bytes" in proc.stderr


def test_utf8_bom_is_accepted(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbf" + MINI.encode())
    assert load_matrix(path).data["version"] == 1


def test_binary_file(tmp_path):
    path = write(tmp_path, bytes(range(256)) * 4)
    proc = cli("plan", "--matrix", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}:1:" in proc.stderr


def test_directory_and_unreadable_path(tmp_path):
    proc = cli("plan", "--matrix", str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in proc.stderr
    assert "fix: pass the file itself" in proc.stderr and "Traceback" not in proc.stderr
    path = write(tmp_path, MINI)
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):  # root reads anything: a FIFO-less test via /proc instead
            path.chmod(0o644)
            unreadable = Path("/proc/self/mem")
        else:
            unreadable = path
        proc = cli("plan", "--matrix", str(unreadable))
    finally:
        path.chmod(0o644)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{unreadable}:" in proc.stderr and "cannot be read" in proc.stderr \
        or "permission denied" in proc.stderr


def test_missing_file(tmp_path):
    proc = cli("plan", "--matrix", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "file not found" in proc.stderr



def test_internal_error_has_no_traceback_unless_debug(tmp_path, capsys, monkeypatch):
    import infermatrix.cli.plan as plan_cli

    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(plan_cli, "run", broken)
    monkeypatch.setattr(plan_cli, "register", _register_with(broken, plan_cli.register))
    assert main(["plan", "--matrix", str(TEST_MATRIX)]) == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: a bug" in err and "--debug" in err
    assert "Traceback" not in err
    assert main(["--debug", "plan", "--matrix", str(TEST_MATRIX)]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    assert main(["plan", "--matrix", str(TEST_MATRIX), "--debug"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def _register_with(func, register):
    def wrapped(sub):
        register(sub)
        sub.choices["plan"].set_defaults(func=func)
    return wrapped


# An audit hook of the launcher holds the CLI at one point of its start-up (it says "paused",
# then sleeps): the signal lands there for certain, never after the command finished. With
# SIGINT ignored the sleep ends and the command finishes with 0, which fails the test.
PAUSE_LAUNCHER = """
import runpy, sys, time
point, target = sys.argv[1], sys.argv[2]
held = []
def hold(event, args):
    if held or event != point:
        return
    name = args[0] if isinstance(args[0], str) else ""
    if name == target or (event == "open" and target in name):
        held.append(1)
        sys.stderr.write("paused\\n"); sys.stderr.flush()
        time.sleep(20)
sys.addaudithook(hold)
sys.argv = ["infermatrix"] + sys.argv[3:]
runpy.run_module("infermatrix", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("point,target", [
    ("import", "infermatrix.errors"),  # cli/__init__ loading: the start-up handler's window
    ("open", "/infermatrix/cli/plan."),  # main() building the parser (importlib: no "import")
    ("open", "/matrix.yaml"),  # loading the matrix
    ("open", "/rules.yaml"),  # planning
], ids=["cli-import", "parser", "matrix-load", "plan"])
def test_ctrl_c_during_start_up_exits_130_without_traceback(tmp_path, point, target):
    """SIGINT while the CLI imports its modules, loads and plans the matrix: exit 130 and one
    "interrupted" line, never a traceback, never 0 (issue 48: 0 was accepted, so a SIGINT that
    was ignored passed)."""
    proc = subprocess.Popen([sys.executable, "-c", PAUSE_LAUNCHER, point, target, "plan",
                             "--offline", "--matrix", str(TEST_MATRIX),
                             "--state-dir", str(tmp_path / "s")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr.readline() == "paused\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == 130, err
    assert "interrupted" in err
