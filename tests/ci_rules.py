"""What a CI run (CI=true) may leave out, in one place: read by tests/conftest.py (per test) and
tests/lanes.py (per run).

- A skipped test fails under CI=true, unless its node id is a key of SKIPS_ALLOWED (value: why
  it cannot run on the CI machine).
- An xfail fails under CI=true, unless its node id is a key of XFAILS_ALLOWED (value: why the
  failure is expected and what would end it).
- A run that collects nothing fails; a whole-suite run (CI's lanes together, or a plain
  `pytest` of tests/) that collects fewer than MIN_COLLECTED tests fails. Raise the floor when
  tests are added; lower it only with the reason in the commit.
"""

from __future__ import annotations

import os

# node id -> why it may skip under CI=true. Allowed by node id, as xfails are (issue 48: an
# allowance by a phrase of the reason let any test whose reason contained it skip). Add one only
# for what cannot exist on the machine .ci/provision sets up (a GPU-less host's behaviour is
# checked with RunOptions(host_gpu=False), on any host), with why.
# tests/unit/harness/test_gpu_ops.py's torch references (the naive GDN recurrence, attention,
# dropout and conv1d references): the CI machine's test venv has no torch (PyPI's Linux torch
# is the CUDA build with ~3 GB of NVIDIA wheels; the CPU build's index is not reachable from
# CI). They ran with torch on the H200 host (docs/h200-gpu-ops.txt) and 26 of 26 passed there.
_NO_TORCH = "no torch in the CI venv (CUDA wheels ~3 GB); ran on the H200 host"
SKIPS_ALLOWED: dict[str, str] = {
    f"tests/unit/harness/test_gpu_ops.py::{name}": _NO_TORCH for name in (
        "test_the_naive_gdn_recurrence_against_a_scalar_oracle_with_grouped_value_heads",
        "test_the_delta_rule_stores_the_value_for_its_key",
        "test_the_l2norm_option_normalises_q_and_k",
        "test_attention_reference_gqa_and_end_aligned_causal_mask",
        "test_attention_reference_applies_the_dropout_mask_and_rescales",
        "test_causal_conv1d_reference_against_a_loop",
        "test_compare_on_cpu_tensors",
    )
}
# the same file's GDN check tests (issue 48): the relative comparison, the negative controls and
# the vLLM decode adapters, with the torch reference / CPU models of the kernels as the op under
# test. No torch in the CI venv (as above); they ran with torch on the GPU host, where every test of
# the file passed (docs/gdn-evidence.md).
_NO_TORCH_GDN = ("no torch in the CI venv (CUDA wheels ~3 GB); the GDN check's CPU tests ran "
                 "on the GPU host (docs/gdn-evidence.md)")
SKIPS_ALLOWED.update({
    f"tests/unit/harness/test_gpu_ops.py::{name}": _NO_TORCH_GDN for name in (
        "test_gdn_tolerances_are_relative_and_cover_every_compared_part",
        "test_gdn_a_bf16_output_passes_with_a_3x_margin",
        *(f"test_gdn_each_negative_control_fails_by_3x[{control}]" for control in (
            "output_x0.8", "no_decay", "no_initial_state", "heads_permuted")),
        "test_gdn_the_old_absolute_tolerance_would_pass_a_scaled_output",
        "test_gdn_compare_relative_edge_cases",
        "test_gdn_a_tolerance_too_loose_to_see_a_control_fails_the_check",
        "test_gdn_compare_relative_reports_the_largest_error_and_its_place",
        "test_gdn_vllm_decode_adapters_pass_what_the_kernels_take",
        "test_gdn_a_sequence_in_the_null_slot_fails_the_check",
        "test_gdn_the_gating_inputs_give_back_g_and_beta",
        "test_gdn_the_state_pool_keeps_slot_0_null_and_the_slots_not_in_order",
        "test_gdn_the_chunk_op_gets_beta_as_float32_as_the_engines_give_it",
    )
})

# node id -> why it is expected to fail. None today.
XFAILS_ALLOWED: dict[str, str] = {}

# The collected count of the whole suite may not fall below this (issue 26: 758 at its filing,
# 836 with the CI rules, kernel-registry, byte-code and hostile-input tests; 896 with the
# signing and SBOM tests of issue 29; 1,043 with the error catalogue, option-table, engine and
# CellSpec tests of issue 28; 1,174 with issue 48's: the lanes' rules, skips by node id, the
# state-file fuzz, the hard edges; 1,378 with the GDN check's decode adapters and the device
# script's summary).
MIN_COLLECTED = 1378


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
