"""The capacity model (model/capacity.py, data/capacity.yaml, issue 46): every figure checked
against arithmetic done by hand here, so that a wrong formula or a wrong figure fails. Pure."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from infermatrix.cli import main
from infermatrix.errors import DamagedStateFile, UsageError
from infermatrix.model import capacity

GIB = 2**30
# Qwen3.6-27B text_config, written out again here (not read from the data under test)
H, FFN, VOCAB, LAYERS, ATTN_LAYERS, GDN_LAYERS = 5120, 17408, 248320, 64, 16, 48
RTX_MEMORY = 97887 * 2**20  # what the card reports, MiB
RTX_BANDWIDTH = 1792e9


@pytest.fixture
def qwen():
    return capacity.model_shape("qwen3.6-27b")


def test_kv_bytes_per_token_are_the_full_attention_layers_only(qwen):
    # 16 layers x 2 (K, V) x 4 KV heads x 256 head dim x 2 B = 65,536 B; FP8: half
    assert capacity.kv_bytes_per_token(qwen, capacity.profile("bf16"))[0] == 16 * 2 * 4 * 256 * 2
    assert capacity.kv_bytes_per_token(qwen, capacity.profile("bf16"))[0] == 65536
    assert capacity.kv_bytes_per_token(qwen, capacity.profile("fp8"))[0] == 32768
    assert capacity.kv_bytes_per_token(qwen, capacity.profile("bf16-kv-fp8"))[0] == 32768


def test_gdn_state_is_fp32_temporal_and_bf16_conv_as_vllm_keeps_it(qwen):
    temporal, conv, steps = capacity.state_bytes_per_sequence(qwen)
    # 48 layers x 48 value heads x 128 x 128 x 4 B (mamba_ssm_dtype float32)
    assert temporal == 48 * 48 * 128 * 128 * 4 == 150_994_944
    # 48 layers x (kernel 4 - 1) x conv_dim (2 x 16 x 128 + 48 x 128 = 10240) x 2 B
    assert conv == 48 * 3 * 10240 * 2 == 2_949_120
    assert [s.value for s in steps] == [temporal, conv]


def test_the_state_dtype_matches_the_attention_block_vllm_chose():
    """vLLM sizes the attention block so that one layer's attention page covers one layer's GDN
    page; with an FP8 KV cache it logged 1568 tokens for this shape (noonghunna/club-3090#1047).
    That is what an fp32 temporal state gives; a bf16 one would give 800."""
    shape = capacity.model_shape("qwen3.6-27b")
    temporal, conv, _ = capacity.state_bytes_per_sequence(shape)
    page = (temporal + conv) // GDN_LAYERS
    fp8_token_page = 2 * 4 * 256 * 1
    assert math.ceil(page / fp8_token_page / 16) * 16 == 1568
    bf16_state_page = 48 * 128 * 128 * 2 + conv // GDN_LAYERS
    assert math.ceil(bf16_state_page / fp8_token_page / 16) * 16 == 800


def test_parameters_counted_from_the_shape(qwen):
    params = capacity.parameter_groups(qwen)
    mlp = 3 * H * FFN
    attn = H * (24 * 256 * 2) + 2 * H * (4 * 256) + 24 * 256 * H  # q (+gate), k, v, o
    gdn = H * (2 * 2048 + 6144) + H * 6144 + 6144 * H  # in_proj_qkv, in_proj_z, out_proj
    assert params.large == LAYERS * mlp + ATTN_LAYERS * attn + GDN_LAYERS * gdn
    assert params.embeddings == 2 * VOCAB * H  # untied lm_head
    assert params.total == 26_895_998_464
    # the checkpoint (55.56 GB BF16 = 27.78 B) also holds the vision tower and the MTP layer,
    # about 0.9 B together: the text decoder is 3-4 % less
    checkpoint = capacity.spec()["models"]["qwen3.6-27b"]["checkpoint_total_bytes"] / 2
    assert 0.96 < params.total / checkpoint < 0.975


def test_weights_bf16_about_54_gb_and_fp8_about_29_gb(qwen):
    params = capacity.parameter_groups(qwen)
    bf16, _ = capacity.weight_bytes(qwen, capacity.profile("bf16"))
    fp8, steps = capacity.weight_bytes(qwen, capacity.profile("fp8"))
    assert bf16 == 2 * params.total == 53_791_996_928  # ~53.8 GB (50.1 GiB)
    # FP8: the large projections at 1 B plus an fp32 scale per 128 x 128 block; embeddings,
    # lm_head, norms and the small GDN tensors stay BF16
    assert fp8 == round(params.large * (1 + 4 / (128 * 128))
                        + (params.embeddings + params.small) * 2)
    assert 29.4e9 < fp8 < 29.5e9
    assert capacity.weight_bytes(qwen, capacity.profile("bf16-kv-fp8"))[0] == bf16
    assert "1/4,096 B of block scales" in steps[0].label


def test_max_sequences_on_one_rtx_pro_6000_at_8k_plus_8k(qwen):
    gpu = capacity.gpu_class("rtx-pro-6000")
    assert gpu.memory_bytes == RTX_MEMORY and gpu.bandwidth_bytes_per_s == RTX_BANDWIDTH
    budget = int(RTX_MEMORY * 0.9)
    state = 150_994_944 + 2_949_120
    # BF16: (92.38 GB - 53.79 GB weights - 4 GiB) / (16,384 x 65,536 + state) = 27
    bf16 = capacity.max_sequences(gpu, qwen, capacity.profile("bf16"), 16384)
    assert bf16.free_bytes == budget - 53_791_996_928 - 4 * GIB
    assert bf16.per_sequence_bytes == 16384 * 65536 + state
    assert bf16.max_sequences == bf16.free_bytes // bf16.per_sequence_bytes == 27
    # FP8 weights and KV: (92.38 - 29.47 - 4.29 GB) / (16,384 x 32,768 + state) = 84
    fp8 = capacity.max_sequences(gpu, qwen, capacity.profile("fp8"), 16384)
    assert fp8.per_sequence_bytes == 16384 * 32768 + state
    assert fp8.max_sequences == 84
    assert capacity.max_sequences(gpu, qwen, capacity.profile("bf16-kv-fp8"),
                                  16384).max_sequences == 49
    # the steps end with the count, each line holding its value
    assert bf16.steps[-1] == capacity.Step("max sequences = floor(left / per sequence)", 27,
                                           "seqs")


def test_decode_ceiling_is_bytes_per_step_over_bandwidth(qwen):
    gpu = capacity.gpu_class("rtx-pro-6000")
    ceiling = capacity.decode_ceiling(gpu, qwen, capacity.profile("bf16"), 27, 12288, 0.6)
    state_traffic = 2 * (150_994_944 + 2_949_120)  # read and written back every step
    expected_bytes = 53_791_996_928 + 27 * (12288 * 65536 + state_traffic)
    assert ceiling.bytes_per_step == expected_bytes
    assert ceiling.step_seconds == pytest.approx(expected_bytes / (1792e9 * 0.6))
    assert ceiling.tokens_per_s == pytest.approx(27 / (expected_bytes / (1792e9 * 0.6)))
    assert 340 < ceiling.tokens_per_s < 350
    # batch 1 reads the weights for one token: the single-stream ceiling
    one = capacity.decode_ceiling(gpu, qwen, capacity.profile("bf16"), 1, 12288, 1.0)
    assert one.tokens_per_s == pytest.approx(
        1792e9 / (53_791_996_928 + 12288 * 65536 + state_traffic))
    # doubling the batch less than doubles the rate (the per-sequence bytes grow)
    double = capacity.decode_ceiling(gpu, qwen, capacity.profile("bf16"), 54, 12288, 0.6)
    assert ceiling.tokens_per_s < double.tokens_per_s < 2 * ceiling.tokens_per_s
    with pytest.raises(UsageError, match="efficiency"):
        capacity.decode_ceiling(gpu, qwen, capacity.profile("bf16"), 1, 1, 1.5)


def test_estimate_puts_the_two_together_at_the_average_decode_context():
    est = capacity.estimate("rtx-pro-6000", "fp8", 8192, 8192)
    assert est.sizing.sequence_tokens == 16384 and est.ceiling.batch == 84
    assert est.ceiling.average_context == 8192 + 4096
    assert 1000 < est.ceiling.tokens_per_s < 1030
    assert est.ceiling.efficiency == 0.60 and est.efficiency_source.startswith("default:")
    assert capacity.estimate("rtx-pro-6000", "fp8", 8192, 8192, batch=32).ceiling.batch == 32
    # a batch above what fits is cut to what fits
    assert capacity.estimate("rtx-pro-6000", "bf16", 8192, 8192, batch=64).ceiling.batch == 27
    data = est.as_dict()
    assert data["max_sequences"] == 84 and data["steps"][-1]["unit"] == "tok/s"


def test_bandwidth_orders_the_gpu_classes():
    rates = {g: capacity.estimate(g, "fp8", 8192, 8192).ceiling.tokens_per_s
             for g in capacity.spec()["gpus"]}
    assert rates["gb10"] < rates["rtx-pro-6000"] < rates["h200"]
    assert rates["gb10"] < 200  # 273 GB/s: the unified pool is the bound


def test_forecast_is_tokens_over_rate_times_replicas():
    plan = capacity.forecast(914_000, 8192, 1000.0, 8)
    assert plan.total_tokens == 914_000 * 8192
    assert plan.hours == pytest.approx(914_000 * 8192 / (1000 * 8) / 3600)  # 260.0 h
    assert round(plan.hours, 1) == 260.0 and round(plan.days, 1) == 10.8
    assert "260.0 h (10.8 days)" in plan.describe() and "8 replicas" in plan.describe()
    stuck = capacity.forecast(10, 10, 0.0, 1)
    assert math.isinf(stuck.hours) and "cannot finish" in stuck.describe()
    assert stuck.as_dict()["hours"] is None
    with pytest.raises(UsageError, match="replicas"):
        capacity.forecast(1, 1, 1.0, 0)


def test_max_num_seqs_for_deploy():
    assert capacity.max_num_seqs("rtx-pro-6000", "bf16", 8192, 8192) == 27
    assert capacity.max_num_seqs("rtx-pro-6000", "fp8", 16384) == 84
    # a lower memory fraction fits fewer
    assert capacity.max_num_seqs("rtx-pro-6000", "fp8", 16384,
                                 gpu_memory_utilization=0.6) < 84
    assert capacity.max_seqs_flag("vllm") == capacity.max_seqs_flag("vllm-cpu") == \
        "--max-num-seqs"
    assert capacity.max_seqs_flag("sglang") == "--max-running-requests"
    assert capacity.max_seqs_flag("trtllm") is None
    with pytest.raises(UsageError, match="not one sequence") as err:
        capacity.max_num_seqs("rtx-pro-6000", "bf16", 1_000_000)
    assert err.value.fix


def test_best_profile_prefers_the_widest_that_reaches_the_target():
    estimates = [capacity.estimate("rtx-pro-6000", p, 8192, 8192)
                 for p in capacity.profile_names()]
    assert capacity.best_profile(estimates, 500).profile.key == "bf16-kv-fp8"
    assert capacity.best_profile(estimates, 800).profile.key == "fp8"
    assert capacity.best_profile(estimates, 300).profile.key == "bf16"
    assert capacity.best_profile(estimates, 5000) is None


def test_unknown_names_name_the_choices():
    with pytest.raises(UsageError, match="rtx-pro-6000, gb10, h100, h200"):
        capacity.gpu_class("rtx-6000")
    with pytest.raises(UsageError, match="bf16, fp8, bf16-kv-fp8"):
        capacity.profile("int4")
    with pytest.raises(UsageError, match="qwen3.6-27b"):
        capacity.model_shape("llama")


def test_learned_efficiency_replaces_the_default(tmp_path):
    path = capacity.ratios_path(tmp_path)
    assert capacity.efficiency_for("rtx-pro-6000", path)[0] == 0.60
    assert capacity.learned_efficiency(400, 500) == 0.8
    capacity.record_ratio(path, "rtx-pro-6000", 400.0, 500.0, 0.6, cell="x")
    value, source = capacity.efficiency_for("rtx-pro-6000", path)
    assert value == pytest.approx(0.48) and "1 measured run" in source
    capacity.record_ratio(path, "rtx-pro-6000", 600.0, 500.0, 0.6)
    capacity.record_ratio(path, "rtx-pro-6000", 500.0, 500.0, 0.6)
    assert capacity.efficiency_for("rtx-pro-6000", path)[0] == pytest.approx(0.6)  # median
    assert capacity.efficiency_for("gb10", path)[0] == 0.60  # other classes: the default
    est = capacity.estimate("rtx-pro-6000", "bf16", 8192, 8192, ratios_path=path)
    assert est.ceiling.efficiency == pytest.approx(0.6)
    assert json.loads(path.read_text())["rtx-pro-6000"][0]["cell"] == "x"
    with pytest.raises(ValueError):
        capacity.learned_efficiency(1, 0)


def test_a_damaged_ratios_file_is_named(tmp_path):
    path = capacity.ratios_path(tmp_path)
    path.write_text('{"rtx-pro-6000": [{"measured": 1}]}')
    with pytest.raises(DamagedStateFile, match="ratio"):
        capacity.efficiency_for("rtx-pro-6000", path)
    path.write_text("")
    with pytest.raises(DamagedStateFile, match="empty"):
        capacity.read_ratios(path)


def test_every_figure_has_a_source():
    data = capacity.spec()
    for name, row in data["gpus"].items():
        for figure in ("memory", "bandwidth", "utilization", "reserve"):
            assert row.get(f"{figure}_source"), f"{name}: {figure} has no source"
        for key, text in row.items():
            if key.endswith("_source") and "estimate" in text:
                assert "because" in text, f"{name}: {key} says estimate without why"
    assert "because" in data["efficiency"]["source"]
    model = data["models"]["qwen3.6-27b"]
    assert model["source"].startswith("https://huggingface.co/Qwen/Qwen3.6-27B")
    assert model["state"]["source"] and model["state"]["traffic_source"]
    assert data["profiles"]["fp8"]["checkpoint_source"]


def test_the_shape_agrees_with_the_other_data_files():
    """matrix.yaml, data/loaded.yaml and data/gpu_ops.yaml carry the same config.json figures."""
    from pathlib import Path

    root = Path(capacity.SPEC_PATH).parent
    shape = capacity.spec()["models"]["qwen3.6-27b"]["shape"]
    loaded = yaml.safe_load((root / "loaded.yaml").read_text())["models"]["Qwen/Qwen3.6-27B"]
    assert (shape["head_dim"], shape["num_attention_heads"], shape["num_key_value_heads"]) == (
        loaded["head_dim"], loaded["num_q_heads"], loaded["num_kv_heads"])
    assert (shape["linear_num_key_heads"], shape["linear_num_value_heads"],
            shape["linear_key_head_dim"], shape["linear_conv_kernel_dim"]) == (
        loaded["gdn_key_heads"], loaded["gdn_value_heads"], loaded["gdn_head_dim"],
        loaded["gdn_conv_width"])
    ops = yaml.safe_load((root / "gpu_ops.yaml").read_text())["model"]["shapes"]
    assert shape["linear_num_value_heads"] == ops["gdn_v_heads"]
    assert shape["full_attention_layers"] + shape["linear_attention_layers"] == 64


def test_capacity_command_prints_the_table_and_the_arithmetic(capsys):
    assert main(["capacity", "--gpu", "rtx-pro-6000", "--context", "8192", "--output-tokens",
                 "8k", "--prompts", "914000", "--replicas", "8", "--target", "500"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines()
             if line.split() and line.split()[0] in capacity.profile_names()}
    assert lines["bf16"][1:3] == ["27", "27"] and lines["fp8"][1:3] == ["84", "84"]
    assert "weights = " in out and "max sequences = floor" in out
    assert "reached by fp8, bf16-kv-fp8; use bf16-kv-fp8" in out
    assert "forecast: 914,000 prompts" in out


def test_capacity_command_json_and_explain(capsys):
    assert main(["capacity", "--gpu", "h200", "--context", "8192", "--output-tokens", "8192",
                 "--profile", "bf16", "--json", "--target", "100000"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [e["profile"] for e in data["estimates"]] == ["bf16"]
    assert data["recommended"] is None and data["reaching_target"] == []
    assert main(["capacity", "--gpu", "gb10", "--context", "8192", "--output-tokens", "8192",
                 "--profile", "fp8", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "KV per token = 16 layers x 2 (K,V) x 4 heads x 256 x 1 B = 32,768 B" in out
    assert "GDN temporal state per sequence" in out and "MBU" in out


@pytest.mark.parametrize("argv,needle", [
    (["--gpu", "rtx-6000"], "rtx-pro-6000, gb10, h100, h200"),
    (["--gpu", "gb10", "--profile", "int4"], "bf16, fp8, bf16-kv-fp8"),
    (["--gpu", "gb10", "--model", "llama"], "qwen3.6-27b"),
])
def test_capacity_command_unknown_names_exit_2(argv, needle, capsys):
    code = main(["capacity", "--context", "8k", "--output-tokens", "8k", *argv])
    assert code == 2 and needle in capsys.readouterr().err


def test_plan_and_report_helpers():
    assert capacity.gpu_for_arch("sm_120") == "rtx-pro-6000"
    assert capacity.gpu_for_arch("sm_121a") == "gb10"
    assert capacity.gpu_for_arch("sm_90") == "h100"
    assert capacity.gpu_for_arch("cpu") == "cpu-lane"  # the CPU lane has its device class
    assert capacity.estimate("rtx-pro-6000", "bf16", 8192, 8192).summary() == \
        "bf16 27 seqs, 346 tok/s"


def test_capacity_command_says_when_not_one_sequence_fits(capsys):
    assert main(["capacity", "--gpu", "gb10", "--context", "1000k", "--output-tokens", "8k",
                 "--prompts", "10"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("bf16 "))
    assert row.split()[1:4] == ["0", "0", "0"] and "not one sequence fits" in row


def test_the_cpu_lane_is_bound_by_its_step_overhead_not_its_bandwidth():
    """The tiny fixture reads 0.77 MB of weights a step, and per sequence its GDN state twice
    (3 layers x 2 heads x 64 x 64 x 4 B read and written): 2.4 MB at batch 8, 0.4 ms at
    10 GB/s x 0.6, so the measured 7.8 ms step overhead sets the ceiling: 8 / 8.2 ms."""
    gpu = capacity.gpu_class("cpu-lane")
    shape = capacity.model_shape("fixture-tiny")
    prof = capacity.profile("bf16")
    weights, _ = capacity.weight_bytes(shape, prof)
    assert weights == 383_052 * 2  # the fixture's own parameter count (make_fixture_model)
    ceiling = capacity.decode_ceiling(gpu, shape, prof, 8, 60, 0.6)
    bytes_s = ceiling.bytes_per_step / (10e9 * 0.6)
    assert ceiling.step_seconds == pytest.approx(0.0078 + bytes_s)
    assert ceiling.tokens_per_s == pytest.approx(8 / (0.0078 + bytes_s))
    assert 960 < ceiling.tokens_per_s < 990


@pytest.mark.parametrize("flag,value,needle", [
    ("--efficiency", "1.5", "give a fraction in (0, 1]"),
    ("--efficiency", "x", "is not a number"),
    ("--target", "0", "give a positive tokens/s"),
    ("--context", "-1", "a token count is not negative"),
])
def test_capacity_command_refuses_numbers_out_of_range(flag, value, needle, capsys):
    argv = ["capacity", "--gpu", "gb10", "--context", "8k", "--output-tokens", "8k"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, flag, value])
    assert exited.value.code == 2 and needle in capsys.readouterr().err
