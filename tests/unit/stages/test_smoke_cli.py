"""`infermatrix smoke` / `infermatrix tag` usage errors: exit 2, nothing run (no Docker)."""

from __future__ import annotations

from infermatrix.cli import main
from tests.conftest import TEST_MATRIX

CPU_ID = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"


def test_unknown_level_is_a_usage_error(tmp_path, capsys):
    code = main(["smoke", "--matrix", str(TEST_MATRIX), "--state-dir", str(tmp_path),
                 "--levels", "static,perf", CPU_ID])
    assert code == 2
    assert "unknown smoke level 'perf'" in capsys.readouterr().err
    assert not (tmp_path / "journal").exists()


def test_missing_model_path_is_a_usage_error(tmp_path, capsys):
    code = main(["smoke", "--matrix", str(TEST_MATRIX), "--state-dir", str(tmp_path),
                 "--model-path", str(tmp_path / "no-weights"), CPU_ID])
    assert code == 2
    assert "--model-path" in (err := capsys.readouterr().err) and "no such directory" in err


def test_tag_with_nothing_smoke_tested_is_a_usage_error(tmp_path, capsys):
    code = main(["tag", "--matrix", str(TEST_MATRIX), "--state-dir", str(tmp_path), "--offline"])
    assert code == 2
    assert "no cell to tag" in capsys.readouterr().err


def test_smoke_of_an_unbuilt_cell_says_to_build_it(tmp_path, capsys):
    cell = "cu130-torch2.13.0-kernel-fixture1.0-sm120"  # planned offline: no engine package
    code = main(["smoke", "--matrix", str(TEST_MATRIX), "--state-dir", str(tmp_path),
                 "--offline", cell])
    assert code == 2
    assert "infermatrix build --select" in capsys.readouterr().err


def test_image_needs_exactly_one_cell(tmp_path, capsys):
    code = main(["smoke", "--matrix", str(TEST_MATRIX), "--state-dir", str(tmp_path),
                 "--offline", "--image", "some:image"])
    assert code == 2
    assert "name exactly one CELL_ID" in capsys.readouterr().err
