"""Issue 28: the single-stage commands run the main job's own step (stages.STEPS) with the
options of the one table; no command calls a stage function of its own. The step functions
are swapped for a recorder here (a recording fake: what the real steps do is tested in
tests/docker/, through these same commands)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from infermatrix import journal
from infermatrix.cli import main
from infermatrix.stages import StepRecord, StepStatus
from infermatrix.state import StatePaths
from tests.paths import TESTS

TEST_MATRIX = TESTS / "matrix" / "matrix.yaml"
CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm120"  # planned offline: no engine package


def recording_step(module: str, monkeypatch: pytest.MonkeyPatch, outcome: str = "passed"
                   ) -> list[tuple[object, list[str]]]:
    """Replace `infermatrix.stages.<module>.step` by one that records (run, cell ids)."""
    calls: list[tuple[object, list[str]]] = []
    name = {"tagging": "tag"}.get(module, module)

    def recorded(run, cells):
        calls.append((run, [c.id for c in cells]))
        ids = [c.id for c in cells]
        return StepRecord(name, StepStatus.RAN, ids if outcome == "passed" else [],
                          ids if outcome == "failed" else [],
                          ids if outcome == "dropped" else [])
    monkeypatch.setattr(importlib.import_module(f"infermatrix.stages.{module}"), "step",
                        recorded)
    return calls


def common(tmp_path: Path) -> list[str]:
    return ["--matrix", str(TEST_MATRIX), "--state-dir", str(tmp_path), "--offline"]


def test_publish_runs_the_publish_step_with_its_table_options(tmp_path, monkeypatch):
    calls = recording_step("publish", monkeypatch)
    lock = tmp_path / "elsewhere.lock"
    code = main(["publish", *common(tmp_path), "--select", CELL, "--registry",
                 "127.0.0.1:5999/team", "--lock", str(lock), "--allow-retag"])
    [(run, ids)] = calls
    assert code == 0 and ids == [CELL]
    assert run.options.registry == "127.0.0.1:5999/team" and run.options.allow_retag
    assert run.options.images_lock == lock and run.options.sources["images_lock"] == "--lock"


def test_publish_without_a_registry_is_a_config_error_before_any_step(tmp_path, monkeypatch,
                                                                     capsys):
    calls = recording_step("publish", monkeypatch)
    assert main(["publish", *common(tmp_path), "--select", CELL]) == 2
    assert "publish.registry is not set" in capsys.readouterr().err and not calls


@pytest.mark.parametrize("outcome, code", [("passed", 0), ("dropped", 1), ("failed", 1)])
def test_tag_runs_the_tag_step_and_a_refusal_is_exit_1(tmp_path, monkeypatch, outcome, code):
    calls = recording_step("tagging", monkeypatch, outcome)
    assert main(["tag", *common(tmp_path), CELL, "--repository", "local/x"]) == code
    [(run, ids)] = calls
    assert ids == [CELL] and run.options.tag_repository == "local/x"


def test_audit_runs_the_audit_step_on_the_named_image_with_its_targets(tmp_path, monkeypatch):
    calls = recording_step("audit", monkeypatch, "failed")
    journal.record_stage(StatePaths.at(tmp_path), CELL, "build", journal.Status.PASS,
                         image_id="sha256:" + "a" * 64)
    code = main(["audit", CELL, *common(tmp_path), "--target", "sm_121", "--target", "12.0",
                 "--no-record"])
    [(run, ids)] = calls
    assert code == 1 and ids == [CELL]
    assert run.images == {CELL: "sha256:" + "a" * 64}
    assert run.options.audit_targets == ["sm_121", "12.0"] and run.options.record_audit is False


def test_an_unknown_audit_target_is_a_usage_error_before_the_step(tmp_path, monkeypatch, capsys):
    calls = recording_step("audit", monkeypatch)
    assert main(["audit", CELL, *common(tmp_path), "--target", "sm_7x"]) == 2
    assert "--target 'sm_7x'" in capsys.readouterr().err and not calls


def test_two_images_of_one_cell_are_a_usage_error_before_the_step(tmp_path, monkeypatch,
                                                                  capsys):
    calls = recording_step("audit", monkeypatch)
    journal.record_stage(StatePaths.at(tmp_path), CELL, "build", journal.Status.PASS,
                         image_id="sha256:" + "a" * 64)
    assert main(["audit", CELL, CELL, *common(tmp_path)]) == 2
    assert f"more than one image of {CELL}" in capsys.readouterr().err and not calls


@pytest.mark.parametrize("selection, prunes", [([], True), (["--select", CELL], False)])
def test_render_runs_the_render_step_and_prunes_only_over_the_whole_matrix(
        tmp_path, monkeypatch, selection, prunes):
    calls = recording_step("render", monkeypatch)
    main(["render", *common(tmp_path), *selection])
    [(run, ids)] = calls
    assert CELL in ids and run.options.prune_images is prunes
