"""Bad input in matrix.yaml: one clear message with file and line, exit code 2, nothing written."""

from __future__ import annotations

from tests.paths import REPO

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infermatrix.cli import main
from infermatrix.config import SCHEMA_PATH, DATA_DIR, load_matrix
from infermatrix.errors import ConfigError

from tests.support.planning_support import DATA

MINI = (DATA / "mini_matrix.yaml").read_text()
ROOT = REPO


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("old, new, line, message", [
    ("  cuda: [", "  cuda: [[", 12, "malformed YAML"),
    ("python: \"3.11\"", "python: \"3.11\"\npyton: \"3.12\"", 10, "unknown key 'pyton'"),
    ("  arch: [sm_120, sm_121]", "  arch: [sm_120, sm_12x]", 14, "'sm_12x' is not a valid value"),
    ("sglang==0.5.11,", "sgl==0.5.11,", 13, "unknown engine 'sgl'"),
    ("floors: {sglang: \">=0.5.10\"", "floors: {sglang: \">=0.5.10.x\"", 5, "bad version specifier"),
    ("  torch: [\"2.9.1\", \"2.11.0\"]", "  torch: [\"2.9.1\", \"2.11.0\"]\n  torch: [\"2.10.0\"]", 13,
     "duplicate key 'torch'"),
    ("    platform: cpu", "    platform: tpu", 36, "'tpu' is not one of"),
    ("  default: bookworm", "  default: trixie", 39, "default base 'trixie' is not defined"),
])
def test_bad_input_is_located(tmp_path, old, new, line, message):
    assert old in MINI
    path = write(tmp_path, MINI.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert message in str(info.value)
    assert info.value.path == path and info.value.line == line, str(info.value)


def test_cli_exits_2_and_writes_nothing(tmp_path, capsys):
    path = write(tmp_path, MINI.replace("python: \"3.11\"", "python: \"3.11\"\nextra: 1"))
    state = tmp_path / "state"
    code = main(["plan", "--matrix", str(path), "--state-dir", str(state)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}:10: extra: unknown key 'extra'" in err, err
    assert not state.exists()


def test_usage_error_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "infermatrix", "plan", "--no-such-flag"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_every_command_has_help(capsys):
    """In this process (a subprocess per command cost ~85 s of CPU on a loaded CI machine);
    the entry point itself is run as a process once, for `plan`."""
    from infermatrix.cli import build_parser, main
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert "plan" in commands
    for name in commands:
        with pytest.raises(SystemExit) as exited:
            main([name, "--help"])
        assert exited.value.code in (0, None), name
        assert "usage:" in capsys.readouterr().out, name
    proc = subprocess.run([sys.executable, "-m", "infermatrix", "plan", "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "usage:" in proc.stdout


def test_shipped_matrix_is_valid_and_schema_copy_is_current():
    load_matrix(ROOT / "matrix.yaml")
    assert json.loads(SCHEMA_PATH.read_text()) == json.loads(
        (DATA_DIR / "matrix.schema.json").read_text())
