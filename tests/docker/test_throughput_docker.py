"""`smoke --levels throughput` on the real vllm-cpu cell: two replicas of the server under the
bounded closed-loop load; the figures are recorded in the journal, shown in the report, and
the tag policy's floor judges them. Slow: two vllm-cpu servers on 2 cores."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.journal_shape import as_record
from infermatrix.options import RunOptions
from infermatrix import journal
from infermatrix.context import Context
from infermatrix.engine import docker as engine
from infermatrix.stages import smoke
from infermatrix.stages.plan import plan_matrix
from infermatrix.journal import load_records
from infermatrix.stages.report import build_report, render_html
from infermatrix.stages.tagging import decide_tag
from infermatrix.state import StatePaths
from tests.support.deploy_support import CPU_CELL, CPU_ID, cpu_image
from tests.support.planning_support import recorded_metadata

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]

LOAD = {"replicas": 2, "concurrency": [1, 2], "thinking": [True, False], "requests": 4,
        "max_tokens": 16, "max_s": 120}


@pytest.fixture(scope="module")
def measured(docker_available, test_ctx, tmp_path_factory):
    """The throughput level run once, in a state of its own: (context, journal record)."""
    image_id = cpu_image(test_ctx)
    state = StatePaths.at(tmp_path_factory.mktemp("im18-throughput") / "state")
    journal.record_stage(state, CPU_ID, "build", "pass", image_id=image_id)
    settings = {**test_ctx.matrix.smoke, "throughput": LOAD}
    matrix = dataclasses.replace(test_ctx.matrix, data={**test_ctx.matrix.data,
                                                        "smoke": settings})
    ctx = Context(matrix=matrix, state=state)
    (plan,) = plan_matrix(ctx, select=[CPU_ID], source=recorded_metadata)
    smoke.smoke_cell(ctx, ctx.spec(plan), RunOptions(levels=["throughput"]), docker=DOCKER)
    return ctx, journal.load(state, CPU_ID)


def test_the_level_records_tokens_latencies_and_scaling(measured):
    _, record = measured
    stage = record["stages"]["smoke"]
    level = stage["details"]["levels"]["throughput"]
    assert level["status"] == "pass", level.get("reason") or level.get("engine_log_tail")
    points = level["points"]
    assert [(p["concurrency"], p["thinking"]) for p in points] == [
        (1, True), (2, True), (1, False), (2, False)]
    for point in points:
        assert point["replicas"] == 2 and point["errors"] == 0
        assert point["requests"] == 2 * LOAD["requests"]
        assert point["tokens_per_s"] > 0
        assert all(v > 0 for v in point["tokens_per_s_per_replica"].values()), point  # both
        assert point["ttft_ms"]["p50"] > 0 and point["ttft_ms"]["p95"] >= point["ttft_ms"]["p50"]
        # tokens that reach the client in one read have no gap between them (a loaded host's
        # server flushes several per chunk): the median may be 0, the tail may not
        # gaps were measured (None: no request streamed two chunks); they may round to 0.0 ms
        # when a busy server's chunks reach the client in one read (seen on a loaded 2-core CI)
        assert point["itl_ms"]["p95"] is not None
        assert point["itl_ms"]["p95"] >= point["itl_ms"]["p50"] >= 0
    assert [s["replicas"] for s in level["scaling"]] == [1, 2]
    assert level["scaling_ratio"] == round(level["scaling"][1]["tokens_per_s"]
                                           / level["scaling"][0]["tokens_per_s"], 3)
    assert level["per_replica_tokens_per_s"] == round(
        max(p["tokens_per_s"] for p in points) / 2, 2)
    assert stage["details"]["throughput"]["tokens_per_s"] == level["tokens_per_s"]
    left = DOCKER.sdk().containers.list(all=True, filters={
        "label": f"{smoke.SMOKE_LABEL}={CPU_ID}"})
    assert not [c.name for c in left if c.name.endswith(("-r0", "-r1"))], "a replica was left"


def test_the_report_shows_the_figures_and_the_floor_judges_them(measured):
    ctx, record = measured
    level = record["stages"]["smoke"]["details"]["levels"]["throughput"]
    report = build_report(load_records(ctx.state), None)
    (cell,) = report.cells
    assert cell.throughput["tokens_per_s"] == level["tokens_per_s"]
    html = render_html(report)
    assert "<h3>Throughput</h3>" in html
    assert f"best {level['tokens_per_s']} output tokens/s" in html
    assert html.count('class="bar"') == len(level["points"]) + len(level["scaling"])

    figure = level["per_replica_tokens_per_s"]
    # only the throughput level ran here: the floor makes it the one required level
    for floor, allowed in ((figure * 10, False), (figure / 10, True)):
        decision = decide_tag(as_record(record),
                              {"require": [], "throughput": {"min_tokens_per_s_cpu": floor}},
                              CPU_CELL)
        assert decision.allowed is allowed, decision.reason
        assert ("under the floor" in decision.reason) is not allowed
    assert not decide_tag(as_record(record), {"require": ["static", "model"]}, CPU_CELL).allowed
