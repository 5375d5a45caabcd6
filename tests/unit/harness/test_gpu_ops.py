"""The GPU level's real-op checks: their pure logic, on a CPU (harness/gpu_ops.py).

Tolerances and facts against data/gpu_ops.yaml, the flash-attn dropout-backward rule and its
verdict, the triton-missing verdict in an engine image, the GDN implementation choice; and, where
torch is installed, the torch references themselves (the naive gated-delta recurrence against a
scalar oracle written here, attention, causal conv1d). No GPU, no Docker.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import yaml

from infermatrix.harness import gpu_check, gpu_ops

DATA = Path(gpu_ops.__file__).resolve().parents[1] / "data" / "gpu_ops.yaml"


@pytest.fixture(scope="module")
def facts():
    return yaml.safe_load(DATA.read_text())


def test_the_harness_constants_are_the_data_file(facts):
    assert gpu_ops.MODEL_SHAPES == facts["model"]["shapes"]
    assert gpu_ops.TOLERANCES == {k: tuple(v) for k, v in facts["tolerances"].items()}
    assert gpu_ops.GDN_TOLERANCES == {k: tuple(v) for k, v in facts["gdn_tolerances"].items()}
    assert gpu_ops.GDN_CONTROL_MARGIN == facts["gdn_control_margin"]
    assert not [name for name in gpu_ops.TOLERANCES if name.startswith("gdn.")]
    rule = facts["flash_attn_bwd_dropout"]
    assert gpu_ops.FLASH_ATTN_BWD_DROPOUT == {k: rule[k] for k in gpu_ops.FLASH_ATTN_BWD_DROPOUT}
    assert rule["sources"], "a fact without its source"
    assert [i["name"] for i in gpu_ops.GDN_IMPLEMENTATIONS] == facts["gdn_implementations"]["order"]


def test_every_compared_tensor_has_a_tolerance_and_an_unknown_name_is_an_error():
    for name, (atol, rtol) in gpu_ops.TOLERANCES.items():
        assert 0 < atol <= 0.1 and 0 < rtol <= 0.1, name  # bf16: loose, never meaningless
    with pytest.raises(KeyError, match="no tolerance is known"):
        gpu_ops.tolerance("some.new.op")


def test_verdict_reports_the_error_and_the_tolerance():
    ok = gpu_ops.verdict("conv1d", 0.004, finite=True, within=True)
    assert ok == {"status": "pass", "max_abs_error": 0.004, "atol": 0.02, "rtol": 0.02}
    off = gpu_ops.verdict("conv1d", 0.5, finite=True, within=False)
    assert off["status"] == "fail" and "max abs error 0.5" in off["reason"] and off["atol"] == 0.02
    nan = gpu_ops.verdict("conv1d", float("inf"), finite=False, within=False)
    assert nan["status"] == "fail" and "non-finite" in nan["reason"]


def test_combine_fails_on_any_part_and_keeps_the_largest_error():
    parts = {"a": {"status": "pass", "max_abs_error": 0.01},
             "b": {"status": "fail", "max_abs_error": 0.3, "reason": "b: differs"}}
    result = gpu_ops.combine(parts, implementation="x")
    assert result["status"] == "fail" and result["reason"] == "b: differs"
    assert result["max_abs_error"] == 0.3 and result["implementation"] == "x"
    assert gpu_ops.combine({"a": parts["a"]})["status"] == "pass"


@pytest.mark.parametrize("head_dim,smem,expected", [
    (256, 101376, "refused"),   # sm_120 / sm_121 / sm86 / sm89: 99 KiB
    (256, 232448, "runs"),      # sm_90: 227 KiB
    (256, 166912, "runs"),      # A100: 163 KiB, the 144 KiB tiles
    (193, 101376, "refused"),   # rounded up to the hdim-256 kernels
    (192, 101376, "runs"),      # the hdim-192 kernels: not this rule
    (128, 101376, "runs"),
])
def test_the_flash_attn_dropout_backward_rule(head_dim, smem, expected, facts):
    assert gpu_ops.dropout_bwd_expected(head_dim, smem) == expected
    devices = facts["flash_attn_bwd_dropout"]["devices"]
    assert gpu_ops.dropout_bwd_expected(256, devices["sm_120"]) == "refused"
    assert gpu_ops.dropout_bwd_expected(256, devices["sm_121"]) == "refused"
    assert gpu_ops.dropout_bwd_expected(256, devices["sm_90"]) == "runs"


def test_dropout_backward_on_a_99_kb_arch_must_be_refused_not_silently_pass():
    refused = gpu_ops.judge_dropout_bwd("refused", RuntimeError("no kernel for dropout"), None)
    assert refused["status"] == "pass" and "refused as known" in refused["note"]
    wrong = {"status": "fail", "reason": "dq: GPU result differs"}
    silent = gpu_ops.judge_dropout_bwd("refused", None, wrong)
    assert silent["status"] == "fail" and "silently wrong" in silent["reason"]
    assert "dq: GPU result differs" in silent["reason"]
    uncompared = gpu_ops.judge_dropout_bwd("refused", None, None)
    assert uncompared["status"] == "fail"
    stale = gpu_ops.judge_dropout_bwd("refused", None, {"status": "pass"})
    assert stale["status"] == "pass" and "out of date" in stale["note"]


def test_dropout_backward_where_it_should_run_is_compared():
    assert gpu_ops.judge_dropout_bwd("runs", None, {"status": "pass", "max_abs_error": 0.01}) \
        == {"status": "pass", "max_abs_error": 0.01, "expected": "runs"}
    assert gpu_ops.judge_dropout_bwd("runs", None, {"status": "fail", "reason": "x"})["status"] \
        == "fail"
    crashed = gpu_ops.judge_dropout_bwd("runs", RuntimeError("CUDA error"), None)
    assert crashed["status"] == "fail" and "CUDA error" in crashed["reason"]


def test_triton_missing_is_a_failure_in_an_engine_image_and_a_skip_elsewhere():
    assert gpu_ops.triton_missing("vllm")["status"] == "fail"
    assert "vllm" in gpu_ops.triton_missing("vllm")["reason"]
    assert gpu_ops.triton_missing(None)["status"] == "skip"


def test_check_triton_without_triton(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "triton", None)  # import triton -> ImportError
    assert gpu_check.check_triton("sglang")["status"] == "fail"
    assert gpu_check.check_triton(None)["status"] == "skip"


def test_the_engine_claim_is_the_callers_word_else_an_importable_engine():
    nothing = lambda name: None  # noqa: E731
    only_sglang = lambda name: object() if name == "sglang" else None  # noqa: E731
    assert gpu_ops.engine_claim("vllm", find_spec=nothing) == "vllm"
    assert gpu_ops.engine_claim("none", find_spec=only_sglang) is None
    assert gpu_ops.engine_claim(None, find_spec=only_sglang) == "sglang"
    assert gpu_ops.engine_claim(None, find_spec=nothing) is None


def test_gdn_without_an_implementation_skips_only_outside_an_engine_image(monkeypatch):
    missing = ["fla: ModuleNotFoundError: No module named 'fla'"]
    monkeypatch.setattr(gpu_ops, "gdn_implementation", lambda preferred=None: (None, missing))
    skipped = gpu_ops.check_gdn(required=False)
    assert skipped["status"] == "skip" and "not part of this image" in skipped["reason"]
    failed = gpu_ops.check_gdn(required=True)
    assert failed["status"] == "fail" and "No module named 'fla'" in failed["reason"]
    # gpu_check: an engine image requires it; so does naming an implementation
    seen = []
    monkeypatch.setattr(gpu_ops, "check_gdn",
                        lambda preferred=None, required=False: seen.append((preferred, required)))
    gpu_check.check_gdn("vllm", "auto")
    gpu_check.check_gdn(None, "auto")
    gpu_check.check_gdn(None, "fla")
    assert seen == [(None, True), (None, False), ("fla", True)]


def test_run_checks_passes_the_engine_to_the_triton_check_and_adds_gdn(monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_check, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(gpu_check, "check_device", lambda arch: {"status": "pass"})
    monkeypatch.setattr(gpu_check, "check_torch_matmul", lambda: {"status": "pass"})
    monkeypatch.setattr(gpu_check, "check_triton",
                        lambda engine=None: calls.append(("triton", engine)) or
                        gpu_ops.triton_missing(engine))
    monkeypatch.setattr(gpu_check, "check_gdn",
                        lambda engine, gdn: calls.append(("gdn", engine, gdn))
                        or {"status": "pass"})
    result = gpu_check.run_checks("sm_120", [], engine="vllm")
    assert calls == [("triton", "vllm"), ("gdn", "vllm", "auto")]
    assert result["status"] == "fail" and result["engine"] == "vllm"
    assert result["reason"].startswith("triton: triton is not installed, but the image claims")
    assert [c["check"] for c in result["checks"]] == ["device", "torch", "triton", "gdn"]
    assert all("duration_s" in c for c in result["checks"])
    off = gpu_check.run_checks("sm_120", [], engine=None, gdn="off")
    assert [c["check"] for c in off["checks"]] == ["device", "torch", "triton"]
    assert off["status"] == "pass"  # triton's skip outside an engine image fails nothing


# --------------------------------------------------------------------------------------------
# The torch references (CPU)
# --------------------------------------------------------------------------------------------

def scalar_gated_delta_rule(q, k, v, g, beta, scale, state):
    """The recurrence with plain floats, one head: q/k [T][K], v [T][V], g/beta [T],
    state [K][V]. The oracle the torch reference is checked against."""
    kd, vd = len(state), len(state[0])
    out = []
    for t in range(len(q)):
        decay = math.exp(g[t])
        state = [[state[i][j] * decay for j in range(vd)] for i in range(kd)]
        predicted = [sum(k[t][i] * state[i][j] for i in range(kd)) for j in range(vd)]
        delta = [beta[t] * (v[t][j] - predicted[j]) for j in range(vd)]
        state = [[state[i][j] + k[t][i] * delta[j] for j in range(vd)] for i in range(kd)]
        out.append([sum(scale * q[t][i] * state[i][j] for i in range(kd)) for j in range(vd)])
    return out, state


def test_the_naive_gdn_recurrence_against_a_scalar_oracle_with_grouped_value_heads():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    b, t, h, hv, kd, vd = 2, 5, 2, 6, 3, 4
    q, k = torch.randn(b, t, h, kd, generator=gen), torch.randn(b, t, h, kd, generator=gen)
    v = torch.randn(b, t, hv, vd, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(b, t, hv, generator=gen))
    beta = torch.rand(b, t, hv, generator=gen)
    state = torch.randn(b, hv, kd, vd, generator=gen)
    out, final = gpu_ops.gdn_recurrence_reference(q, k, v, g, beta, 0.7, state, qk_l2norm=False)
    assert out.shape == (b, t, hv, vd) and final.shape == (b, hv, kd, vd)
    for n in range(b):
        for i in range(hv):
            key_head = i // (hv // h)  # value head i reads key head i // 3
            want_o, want_s = scalar_gated_delta_rule(
                q[n, :, key_head].tolist(), k[n, :, key_head].tolist(), v[n, :, i].tolist(),
                g[n, :, i].tolist(), beta[n, :, i].tolist(), 0.7, state[n, i].tolist())
            assert torch.allclose(out[n, :, i].double(), torch.tensor(want_o, dtype=torch.float64),
                                  atol=1e-5)
            assert torch.allclose(final[n, i].double(), torch.tensor(want_s, dtype=torch.float64),
                                  atol=1e-5)


def test_the_delta_rule_stores_the_value_for_its_key():
    """With no decay and beta 1, reading a just-written unit key returns its value exactly."""
    torch = pytest.importorskip("torch")
    kd = 4
    keys = torch.eye(kd)[None, :, None, :]           # orthonormal keys, one per step
    values = torch.arange(kd * 3, dtype=torch.float32).reshape(1, kd, 1, 3)
    zeros, ones = torch.zeros(1, kd, 1), torch.ones(1, kd, 1)
    out, state = gpu_ops.gdn_recurrence_reference(keys, keys, values, zeros, ones, 1.0,
                                                  qk_l2norm=True)
    assert torch.allclose(out, values, atol=1e-5)
    assert torch.allclose(state[0, 0], values[0, :, 0], atol=1e-5)


def test_the_l2norm_option_normalises_q_and_k():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 3, 1, 4, generator=gen), torch.randn(1, 3, 1, 4, generator=gen)
    v, g, beta = torch.randn(1, 3, 1, 2, generator=gen), torch.zeros(1, 3, 1), torch.ones(1, 3, 1)
    a, _ = gpu_ops.gdn_recurrence_reference(q, k, v, g, beta, 1.0, qk_l2norm=True)
    b, _ = gpu_ops.gdn_recurrence_reference(q * 5, k * 3, v, g, beta, 1.0, qk_l2norm=True)
    assert torch.allclose(a, b, atol=1e-5)


def test_attention_reference_gqa_and_end_aligned_causal_mask():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 3, 6, 8, generator=gen)
    k, v = torch.randn(1, 5, 2, 8, generator=gen), torch.randn(1, 5, 2, 8, generator=gen)
    out = gpu_ops.attention_reference(q, k, v, causal=True)
    for t in range(3):
        for head in range(6):
            kv = head // 3
            visible = 5 - 3 + t + 1  # the last query sees every key
            scores = torch.tensor([float(q[0, t, head] @ k[0, s, kv]) / math.sqrt(8)
                                   for s in range(visible)])
            want = torch.softmax(scores, 0) @ v[0, :visible, kv]
            assert torch.allclose(out[0, t, head], want, atol=1e-5)


def test_attention_reference_applies_the_dropout_mask_and_rescales():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 1, 1, 4)
    k = torch.zeros(1, 2, 1, 4)
    v = torch.tensor([[[[1.0, 0, 0, 0]], [[0, 1.0, 0, 0]]]])
    keep = torch.tensor([[[[True, False]]]])
    out = gpu_ops.attention_reference(q, k, v, causal=False, dropout_mask=keep, dropout_p=0.5)
    assert torch.allclose(out[0, 0, 0], torch.tensor([1.0, 0, 0, 0]))  # 0.5 / (1 - 0.5)


def test_causal_conv1d_reference_against_a_loop():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(3)
    b, t, d, w = 2, 6, 3, 4
    x, weight = torch.randn(b, t, d, generator=gen), torch.randn(d, w, generator=gen)
    bias, prefix = torch.randn(d, generator=gen), torch.randn(b, d, w - 1, generator=gen)
    got = gpu_ops.causal_conv1d_reference(x, weight, bias, prefix, silu=False)
    padded = torch.cat([prefix, x.transpose(1, 2)], dim=-1)   # [B, D, W-1+T]
    for n in range(b):
        for c in range(d):
            for i in range(t):
                want = sum(weight[c, j] * padded[n, c, i + j] for j in range(w)) + bias[c]
                assert abs(float(got[n, i, c]) - float(want)) < 1e-5
    silu = gpu_ops.causal_conv1d_reference(x, weight, bias, prefix, silu=True)
    assert torch.allclose(silu, torch.nn.functional.silu(got))


def test_compare_on_cpu_tensors():
    torch = pytest.importorskip("torch")
    want = torch.ones(4, 4)
    assert gpu_ops.compare("conv1d", want + 0.001, want)["status"] == "pass"
    bad = gpu_ops.compare("conv1d", want + random.choice([0.5, -0.5]), want)
    assert bad["status"] == "fail" and bad["max_abs_error"] == pytest.approx(0.5)
    nan = want.clone()
    nan[0, 0] = float("nan")
    assert "non-finite" in gpu_ops.compare("conv1d", nan, want)["reason"]
    assert "shape" in gpu_ops.compare("conv1d", want[:2], want)["reason"]


# --------------------------------------------------------------------------------------------
# harness.triton_warm: what can be checked without triton
# --------------------------------------------------------------------------------------------

def test_triton_warm_devices_report_the_shared_memory_of_the_data(facts):
    from infermatrix.harness import triton_warm

    devices = facts["flash_attn_bwd_dropout"]["devices"]
    for arch, smem in devices.items():
        assert triton_warm.DEVICES[arch]["smem"] == smem
        assert triton_warm.FakeUtils(arch).get_device_properties(0)["max_shared_mem"] == smem
        props = triton_warm.FakeProps(arch)
        assert (props.major, props.minor) == triton_warm.parse_arch(arch)
        assert props.shared_memory_per_block_optin == smem


def test_triton_warm_compile_only_needs_an_arch(tmp_path, capsys):
    from infermatrix.harness import triton_warm

    with pytest.raises(SystemExit) as stop:
        triton_warm.main(["--compile-only", "--cache", str(tmp_path)])
    assert stop.value.code == 2 and "--compile-only needs --arch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        triton_warm.main(["--compile-only", "--launch", "--cache", str(tmp_path)])


# --------------------------------------------------------------------------------------------
# The GDN check's comparison relative to the signal and its negative controls (CPU stand-in:
# the torch reference as the op under test; the device run, docs/h100-gdn-engine-kernels.txt,
# runs the engines' kernels at the model's shapes: docs/gdn-evidence.md)
# --------------------------------------------------------------------------------------------

SMALL_GDN = {**gpu_ops.MODEL_SHAPES, "gdn_k_heads": 2, "gdn_v_heads": 6, "gdn_head_dim": 32}
# the check's cases with a 64-token long prefill (CPU time; the initial state is as forgotten)
SMALL_CASES = [(n, op, b, min(t, 64)) for n, op, b, t in gpu_ops.GDN_CASES]


def gdn_run(ops, shapes=SMALL_GDN, controls=tuple(gpu_ops.GDN_CONTROLS), seed=2):
    torch = pytest.importorskip("torch")
    return gpu_ops.run_gdn_check(ops, shapes, torch.Generator().manual_seed(seed), "cpu",
                                 controls=controls, cases=SMALL_CASES)


def test_gdn_tolerances_are_relative_and_cover_every_compared_part():
    result = gdn_run(gpu_ops.reference_gdn_ops())
    assert set(result["parts"]) == {f"{c}.{p}" for c, _op, _b, _t in gpu_ops.GDN_CASES
                                    for p in ("out", "state")}
    assert ("chunk_short", "chunk", 2, 16) in gpu_ops.GDN_CASES  # the initial state matters
    for part in result["parts"].values():
        assert part["status"] == "pass" and part["ratio"] == 0.0 and part["ref_rms"] > 0
    with pytest.raises(KeyError, match="GDN_TOLERANCES"):
        gpu_ops.compare_relative("gdn.new", None, None)


def test_gdn_a_bf16_output_passes_with_a_3x_margin():
    """The kernels return bf16: rounding the exact output must stay under a third of the
    tolerance (else the check would flag a correct kernel at the noise of its dtype)."""
    torch = pytest.importorskip("torch")
    result = gdn_run(gpu_ops.reference_gdn_ops(round_output_to=torch.bfloat16), controls=())
    ratios = {p: r["ratio"] for p, r in result["parts"].items()}
    assert all(r <= 1 / 3 for r in ratios.values()), ratios
    assert any(r > 0 for r in ratios.values())


@pytest.mark.parametrize("control", list(gpu_ops.GDN_CONTROLS))
def test_gdn_each_negative_control_fails_by_3x(control):
    result = gdn_run(gpu_ops.reference_gdn_ops(), controls=(control,))
    judged = result["controls"][control]
    assert judged["status"] == "pass" and judged["margin"] >= 3, judged
    if control == "no_initial_state":
        # the long prefill forgets its initial state: the short one is what catches it
        assert judged["ratios"]["chunk.state"] < 1 <= judged["ratios"]["chunk_short.out"]
    if control == "output_x0.8":
        assert judged["margin"] == pytest.approx(0.2 / gpu_ops.GDN_TOLERANCES["gdn.chunk.out"][0])


def test_gdn_a_control_that_passes_fails_the_check():
    """A check too loose to see a control is itself a failure (judge_controls)."""
    weak = gpu_ops.judge_controls({"no_decay": {"a.out": {"ratio": 2.0},
                                                "a.state": {"ratio": 0.1}}})
    assert weak["no_decay"]["status"] == "fail" and weak["no_decay"]["margin"] == 2.0
    assert "only 2 x" in weak["no_decay"]["reason"]
    clear = gpu_ops.judge_controls({"no_decay": {"a.out": {"ratio": 5.0}}})
    assert clear["no_decay"]["status"] == "pass" and clear["no_decay"]["worst"] == "a.out"


def test_gdn_the_old_absolute_tolerance_would_pass_a_scaled_output():
    """What issue 48 found: at these inputs |o| is ~0.01, so atol 0.03 + rtol 0.03 passes a
    0.8x output; the relative comparison fails it."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(2)
    q, k, v, g, beta, state = gpu_ops.gdn_inputs(2, 16, gpu_ops.MODEL_SHAPES, gen, "cpu")
    ref, _ = gpu_ops.gdn_recurrence_reference(q, k, v, g, beta, 128 ** -0.5, state)
    assert torch.allclose(ref * 0.8, ref, atol=0.03, rtol=0.03)  # the old gdn.chunk.out row
    assert gpu_ops.compare_relative("gdn.chunk.out", ref * 0.8, ref)["status"] == "fail"
    assert gpu_ops.compare_relative("gdn.chunk.out", ref.bfloat16(), ref)["status"] == "pass"


def test_gdn_compare_relative_edge_cases():
    torch = pytest.importorskip("torch")
    want = torch.ones(3, 4)
    nan = want.clone()
    nan[0, 0] = float("nan")
    assert "non-finite" in gpu_ops.compare_relative("gdn.chunk.out", nan, want)["reason"]
    assert "shape" in gpu_ops.compare_relative("gdn.chunk.out", want[:2], want)["reason"]
    assert "all zeros" in gpu_ops.compare_relative("gdn.chunk.out", want, want * 0)["reason"]
    big = torch.ones(100, 100)
    spike = big.clone()
    spike[1, 1] += 0.6  # one element: RMS 0.006 (< 0.02), caught by the max (0.6 > 0.5)
    result = gpu_ops.compare_relative("gdn.chunk.out", spike, big)
    assert result["status"] == "fail" and result["rel_rms"] < 0.02 < 0.5 < result["rel_max"]
    spike[1, 1] = 1.4   # within both
    assert gpu_ops.compare_relative("gdn.chunk.out", spike, big)["status"] == "pass"


def test_gdn_a_tolerance_too_loose_to_see_a_control_fails_the_check(monkeypatch):
    """run_gdn_check runs the controls through the op under test and judges them: with a
    tolerance loose enough to pass a 0.8x output, the correct op still passes, but that
    control fails (the check would fail, not pass quietly)."""
    for name in gpu_ops.GDN_TOLERANCES:
        monkeypatch.setitem(gpu_ops.GDN_TOLERANCES, name, (0.3, 10.0))
    result = gdn_run(gpu_ops.reference_gdn_ops(), controls=("output_x0.8", "heads_permuted"))
    assert all(p["status"] == "pass" for p in result["parts"].values())
    assert result["controls"]["output_x0.8"]["status"] == "fail"
    assert result["controls"]["output_x0.8"]["margin"] == pytest.approx(0.2 / 0.3)
    assert result["controls"]["heads_permuted"]["status"] == "pass"


def test_gdn_spec_alternatives_and_the_state_layout(monkeypatch):
    assert gpu_ops.resolve("math:sqrt|nowhere.at.all:x") is math.sqrt
    assert gpu_ops.resolve("nowhere.at.all:x|math:sqrt") is math.sqrt
    with pytest.raises(ImportError, match="nowhere.at.all:x: .*; also.nowhere:y"):
        gpu_ops.resolve("nowhere.at.all:x|also.nowhere:y")
    for impl in gpu_ops.GDN_IMPLEMENTATIONS[:2]:
        assert impl["chunk"].split("|")[0].split(":")[0].startswith(
            ("vllm.third_party.flash_linear_attention.ops", "sglang.kernels.ops.attention.fla"))

    def op_in(module):
        def op():
            pass
        op.__module__ = module
        return op

    assert gpu_ops.state_layout(op_in("vllm.third_party.flash_linear_attention.ops.chunk")) == "vk"
    assert gpu_ops.state_layout(op_in("sglang.kernels.ops.attention.fla.fused_recurrent")) == "vk"
    assert gpu_ops.state_layout(op_in("fla.ops.gated_delta_rule.chunk")) == "kv"
    assert gpu_ops.state_layout(op_in("vllm.third_party.flash_linear_attention.opsX")) == "kv"


def test_gdn_largest_error_says_where_it_is():
    assert gpu_ops._unravel(0, (2, 3, 4)) == [0, 0, 0]
    assert gpu_ops._unravel(23, (2, 3, 4)) == [1, 2, 3]
    assert gpu_ops._unravel(13, (2, 3, 4)) == [1, 0, 1]


def test_gdn_compare_relative_reports_the_largest_error_and_its_place():
    torch = pytest.importorskip("torch")
    want = torch.ones(4, 5, 6)
    want[2, 3, 4] = 9.0
    got = want.clone()
    got[2, 3, 4] += 0.5            # the largest error, at a large element
    got[0, 0, 0] += 0.1
    result = gpu_ops.compare_relative("gdn.chunk.out", got, want)
    rms = want.double().pow(2).mean().sqrt().item()
    assert result["worst_index"] == [2, 3, 4] and result["worst_ref"] == 9.0
    assert result["worst_error"] == pytest.approx(0.5)
    assert result["rel_elem"] == pytest.approx(max(0.5 / (rms + 9.0), 0.1 / (rms + 1.0)))


# Models of vLLM 0.33.0's two fused-gating decode ops, in torch on the CPU, written from their
# Triton kernels (third_party/flash_linear_attention/ops/fused_sigmoid_gating.py and
# fused_recurrent.py: fused_recurrent_gated_delta_rule_packed_decode): the gating computed from
# a/b, the state [HV, V, K] in a slot of the cache, a slot <= 0 (NULL_BLOCK_ID) skipped. They
# check the adapters' plumbing on a CPU; the kernels themselves ran on the GPU host
# (docs/gdn-evidence.md).
VLLM_OPS = "vllm.third_party.flash_linear_attention.ops"


def engine_gating(a, b, A_log, dt_bias, beta=1.0, threshold=20.0):
    torch = pytest.importorskip("torch")
    x = a.float() + dt_bias.float()
    softplus = torch.where(beta * x <= threshold, torch.log1p(torch.exp(beta * x)) / beta, x)
    return -A_log.float().exp() * softplus, torch.sigmoid(b.float())


def model_sigmoid_gating(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None,
                         initial_state=None, inplace_final_state=True, cu_seqlens=None,
                         ssm_state_indices=None, num_accepted_tokens=None,
                         use_qk_l2norm_in_kernel=False, is_kda=False):
    torch = pytest.importorskip("torch")
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    o = torch.full_like(v, float("nan"))          # new_empty: a skipped sequence's is garbage
    for i in range(len(cu_seqlens) - 1):
        bos, eos = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        slot = int(ssm_state_indices[i])
        if slot <= 0:
            continue
        g, bt = engine_gating(a[bos:eos], b[bos:eos], A_log, dt_bias, beta, threshold)
        out, final = gpu_ops.gdn_recurrence_reference(
            q[:, bos:eos], k[:, bos:eos], v[:, bos:eos], g[None], bt[None], scale,
            initial_state[slot].transpose(-1, -2)[None], qk_l2norm=use_qk_l2norm_in_kernel)
        o[:, bos:eos] = out.to(o.dtype)
        initial_state[slot] = final[0].transpose(-1, -2)
    return o, initial_state


def model_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                        ssm_state_indices, use_qk_l2norm_in_kernel=False):
    hv, vd, kd = initial_state.shape[-3:]
    h = (mixed_qkv.shape[1] - hv * vd) // 2 // kd
    for i in range(mixed_qkv.shape[0]):
        slot = int(ssm_state_indices[i])
        if slot <= 0:
            out[i] = 0
            continue
        row = mixed_qkv[i]
        q = row[:h * kd].reshape(1, 1, h, kd)
        k = row[h * kd:2 * h * kd].reshape(1, 1, h, kd)
        v = row[2 * h * kd:].reshape(1, 1, hv, vd)
        g, bt = engine_gating(a[i:i + 1], b[i:i + 1], A_log, dt_bias)
        o, final = gpu_ops.gdn_recurrence_reference(
            q, k, v, g[None], bt[None], scale, initial_state[slot].transpose(-1, -2)[None],
            qk_l2norm=use_qk_l2norm_in_kernel)
        out[i] = o[0].to(out.dtype)
        initial_state[slot] = final[0].transpose(-1, -2)
    return out, initial_state


model_sigmoid_gating.__module__ = VLLM_OPS + ".fused_sigmoid_gating"
model_packed_decode.__module__ = VLLM_OPS + ".fused_recurrent"
DECODE_CASES = list(gpu_ops.GDN_DECODE_CASES.values())


def decode_run(seed=2):
    torch = pytest.importorskip("torch")
    ops = gpu_ops.engine_gdn_ops(None, None, gated_decode=model_sigmoid_gating,
                                 packed_decode=model_packed_decode)
    return gpu_ops.run_gdn_check(ops, SMALL_GDN, torch.Generator().manual_seed(seed), "cpu",
                                 cases=DECODE_CASES)


def test_gdn_vllm_decode_adapters_pass_what_the_kernels_take():
    """The adapters feed vLLM's fused-gating decode ops as the engine does (gating inputs, the
    state cache and its slots, [V, K]): against models of the kernels they pass with a 3x
    margin and every control fails by 3x."""
    result = decode_run()
    assert set(result["parts"]) == {f"{op}.{p}" for op in gpu_ops.GDN_DECODE_CASES
                                    for p in ("out", "state")}
    for name, part in result["parts"].items():
        assert part["status"] == "pass" and part["ratio"] <= 1 / 3, (name, part)
    for name, control in result["controls"].items():
        assert control["status"] == "pass" and control["margin"] >= 3, (name, control)


def test_gdn_a_sequence_in_the_null_slot_fails_the_check(monkeypatch):
    """What the first adapter did (slots 0..B-1): vLLM's decode kernels skip slot 0
    (NULL_BLOCK_ID), so sequence 0 gets no output and no state update: the check fails."""
    torch = pytest.importorskip("torch")

    def identity_slots(states):
        pool = states.clone()
        return pool, torch.arange(states.shape[0], dtype=torch.int32)

    monkeypatch.setattr(gpu_ops, "state_pool", identity_slots)
    parts = decode_run()["parts"]
    assert "non-finite" in parts["gated_decode.out"]["reason"]
    assert parts["packed_decode.out"]["status"] == "fail"
    assert parts["packed_decode.state"]["status"] == "fail"


def test_gdn_the_gating_inputs_give_back_g_and_beta():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(5)
    _q, _k, _v, g, beta, _s = gpu_ops.gdn_inputs(3, 7, SMALL_GDN, gen, "cpu")
    A_log, dt_bias = gpu_ops.gating_params(SMALL_GDN["gdn_v_heads"], "cpu")
    a, b = gpu_ops.gating_inputs(g, beta, A_log, dt_bias)
    assert a.shape == b.shape == (21, SMALL_GDN["gdn_v_heads"]) and a.dtype == torch.float32
    g_back, beta_back = engine_gating(a, b, A_log, dt_bias)
    assert torch.allclose(g_back, g.reshape(21, -1), rtol=1e-4, atol=1e-6)
    assert torch.allclose(beta_back, beta.float().reshape(21, -1), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(A_log, torch.zeros_like(A_log))      # the gating is exercised
    assert not torch.allclose(dt_bias, torch.zeros_like(dt_bias))


def test_gdn_the_state_pool_keeps_slot_0_null_and_the_slots_not_in_order():
    torch = pytest.importorskip("torch")
    states = torch.randn(4, 2, 3, 3)
    pool, slots = gpu_ops.state_pool(states)
    assert pool.shape == (6, 2, 3, 3) and slots.dtype == torch.int32
    assert slots.tolist() == [4, 3, 2, 1]
    assert torch.equal(pool[slots.long()], states)
    assert pool[0].isnan().all() and pool[5].isnan().all()


def test_gdn_the_chunk_op_gets_beta_as_float32_as_the_engines_give_it():
    """vLLM 0.33.0 (fused_post_conv_prep) and SGLang 0.5.23 (fused_gdn_gating) hand the chunk op
    a float32 beta; vLLM's chunk_scaled_dot_kkt runs another dot for it than for bf16."""
    torch = pytest.importorskip("torch")
    seen = {}

    def chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None, use_qk_l2norm_in_kernel=False):
        seen.update(beta=beta.dtype, g=g.dtype, q=q.shape, cu=cu_seqlens.tolist())
        return torch.zeros_like(v), initial_state

    q, k, v, g, beta, state = gpu_ops.gdn_inputs(2, 5, SMALL_GDN, torch.Generator(), "cpu")
    assert beta.dtype == torch.bfloat16
    o, final = gpu_ops.engine_gdn_ops(chunk, None)["chunk"](q, k, v, g, beta, 0.1, state)
    assert seen == {"beta": torch.float32, "g": torch.float32, "q": (1, 10, 2, 32),
                    "cu": [0, 5, 10]}
    assert o.shape == v.shape and torch.equal(final, state)


def test_triton_warm_is_a_stand_alone_tool_as_its_docstring_says():
    """Issue 48: no image holds a Triton cache. The module says it is no build step; this fails
    the day a template, stage or other module calls it, so that the docstring, README and the
    audit's first-start line are rewritten with the wiring (and its proof of a cache hit)."""
    from infermatrix.harness import triton_warm
    from tests.paths import REPO

    module = Path(triton_warm.__file__).resolve()
    users = [str(path.relative_to(REPO))
             for root in (REPO / "src", REPO / "templates") for path in root.rglob("*")
             if path.is_file() and path.suffix in (".py", ".j2", ".yaml", ".sh", ".toml")
             and path.resolve() != module
             and "triton_warm" in path.read_text(encoding="utf-8", errors="replace")]
    assert users == []
    assert "Not a build step" in (triton_warm.__doc__ or "")


def test_the_audits_first_start_line_says_the_image_holds_no_triton_cache():
    from infermatrix.harness import triton_smem

    rows = [{"kernel": "k", "family": "f", "configs": 2, "autotuned": True, "compile_s": 1.0}]
    [item] = triton_smem.first_start([{"family": "f", "summary": rows}], {})
    assert "the image holds no Triton cache" in item["note"]
    assert "unless" not in item["note"]
