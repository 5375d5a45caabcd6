"""The Triton kernel names of the serve path held against each engine version's expected list
(model/tritonlist.py, data/triton_kernels.yaml; issue 48): a kernel missing inside a family
fails and is named, an unexpected one is named, chunk_o's import-time tiles follow the limit.

The real census: tests/fixtures/triton/vllm-0.33.0-harness.json, the harness's result line from
the real vLLM 0.33.0 sm_120 cell's audit (tests/docker/test_build_real_cells.py), trimmed to
what the audit reads."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from infermatrix.model import tritonlist
from infermatrix.stages import audit
from infermatrix.stages.audit import FAIL, PASS
from tests.paths import TESTS

REAL_VLLM = TESTS / "fixtures" / "triton" / "vllm-0.33.0-harness.json"
VLLM = ("vllm", "0.33.0")
SM120 = 101376


@pytest.fixture
def real_vllm() -> dict[str, Any]:
    return json.loads(REAL_VLLM.read_text(encoding="utf-8"))


def family(result: dict[str, Any], arch: str, name: str) -> dict[str, Any]:
    [record] = [f for a in result["archs"] if a["arch"] == arch
                for f in a["families"] if f["family"] == name]
    return record


def test_the_real_vllm_cells_census_holds_against_its_list(real_vllm) -> None:
    check = audit.judge_triton(real_vllm, "default", engine=VLLM)
    assert check.status == PASS, check.detail
    listed = check.data["kernel_list"]
    assert listed["held"] and not listed["missing"] and not listed["unexpected"], listed
    assert not listed["tile_problems"]
    assert "every expected kernel of vllm 0.33.0 compiled, none unexpected" in check.detail


def test_a_kernel_missing_inside_a_family_fails_and_is_named(real_vllm) -> None:
    chunk = family(real_vllm, "sm_120", "gdn-prefill-chunk")
    chunk["kernels"] = [k for k in chunk["kernels"]
                        if k["kernel"] != "merge_16x16_to_64x64_inverse_kernel"]
    check = audit.judge_triton(real_vllm, "default", engine=VLLM)
    # the family is still there: a check by family names passes it
    assert "gdn-prefill-chunk" in {row["family"] for row in check.data["summary"]}
    assert check.status == FAIL
    assert "merge_16x16_to_64x64_inverse_kernel[gdn-prefill-chunk]@sm_120" in check.detail
    assert check.data["kernel_list"]["missing"] == [
        "merge_16x16_to_64x64_inverse_kernel[gdn-prefill-chunk]@sm_120"]


def test_a_family_not_driven_names_each_kernel_it_should_have_compiled(real_vllm) -> None:
    mixed = family(real_vllm, "sm_120", "gdn-decode-mixed")
    mixed.update(driven=False, kernels=[], reason="TypeError: a launcher changed")
    check = audit.judge_triton(real_vllm, "default", engine=VLLM)
    assert check.status == FAIL
    assert "fused_sigmoid_gating_delta_rule_update_kernel[gdn-decode-mixed]@sm_120" in \
        check.detail


def test_an_unexpected_kernel_is_named_and_does_not_fail(real_vllm) -> None:
    chunk = family(real_vllm, "sm_120", "gdn-prefill-chunk")
    chunk["kernels"].append({"kernel": "l2norm_fwd_kernel2", "shared": 0, "num_warps": 8,
                             "num_stages": 3, "constexprs": {}})
    check = audit.judge_triton(real_vllm, "default", engine=VLLM)
    assert check.status == PASS, check.detail
    assert check.data["kernel_list"]["unexpected"] == [
        "l2norm_fwd_kernel2[gdn-prefill-chunk]@sm_120"]
    assert "not in the expected list of vllm 0.33.0: l2norm_fwd_kernel2" in check.detail


def test_a_version_without_a_list_is_said_to_be_not_held(real_vllm) -> None:
    check = audit.judge_triton(real_vllm, "default", engine=("vllm", "0.19.0"))
    assert check.status == PASS
    assert check.data["kernel_list"]["held"] is False
    assert "kernel names not held: no expected list for vllm 0.19.0" in check.detail
    # without an engine the check is the shared-memory verdict alone
    assert "kernel_list" not in audit.judge_triton(real_vllm, "default").data


def test_the_real_chunk_o_chose_its_tiles_from_the_targets_limit(real_vllm) -> None:
    chunk = family(real_vllm, "sm_120", "gdn-prefill-chunk")
    assert chunk["tiles"]["BKV_LIST"] == [32, 64] and chunk["tiles"]["limit_seen"] == [SM120]
    assert tritonlist.compiled_tiles(chunk, "chunk_fwd_kernel_o") == {"BK": {32, 64},
                                                                     "BV": {32, 64}}


@pytest.mark.parametrize("change, named", [
    # the large tiles on a 99 KiB device (the query answered another device's limit)
    (lambda t, k: t.update(BKV_LIST=[64, 128]), "BKV_LIST [64, 128] chosen at import"),
    # the query failed (FLA answers [-1]): the small tiles by default, not by the limit
    (lambda t, k: t.update(limit_seen=[-1]), "the import-time query saw [-1]"),
    # a compiled config off the list
    (lambda t, k: k[0]["constexprs"].update(BK=128), "compiled BK [32, 64, 128]"),
    # not reported at all
    (lambda t, k: t.clear(), "the import-time tile choice was not reported"),
    # imported before the compile-only driver was active (by another import path)
    (lambda t, k: t.update(imported_under_driver=False), "compile-only driver was not active"),
], ids=["large-tiles-on-99k", "query-failed", "compiled-off-the-list", "not-reported",
        "imported-before-the-driver"])
def test_chunk_o_tiles_off_the_rule_fail(real_vllm, change, named) -> None:
    chunk = family(real_vllm, "sm_120", "gdn-prefill-chunk")
    change(chunk["tiles"], [k for k in chunk["kernels"] if k["kernel"] == "chunk_fwd_kernel_o"])
    check = audit.judge_triton(real_vllm, "default", engine=VLLM)
    assert check.status == FAIL and named in check.detail, check.detail


def test_the_tile_rule_gives_the_large_tiles_from_the_threshold_on() -> None:
    rule = tritonlist.expected_kernels(*VLLM).chunk_o
    assert rule is not None and rule.threshold == 102400
    assert rule.tiles_for(SM120) == [32, 64]          # sm_120, sm_121: 99 KiB
    assert rule.tiles_for(232448) == [64, 128]        # sm_90
    assert rule.tiles_for(102400) == [64, 128]        # FLA compares with >=


def sglang_chunk(bv: int) -> dict[str, Any]:
    return {"family": "gdn-prefill-chunk", "driven": True,
            "tiles": {"BKV_LIST": [32, 64], "limit_seen": [SM120]},
            "kernels": [{"kernel": "chunk_fwd_kernel_o", "shared": 34816,
                         "constexprs": {"BK": 128, "BV": bv, "BT": 64}}]}


def test_sglangs_chunk_o_launches_fixed_tiles() -> None:
    rule = tritonlist.expected_kernels("sglang", "0.5.23").chunk_o
    assert rule is not None and rule.compiled == {"BK": 128, "BV": 64}
    assert tritonlist.tile_problems(rule, "sm_120", SM120, sglang_chunk(64)) == []
    [problem] = tritonlist.tile_problems(rule, "sm_120", SM120, sglang_chunk(32))
    assert "compiled BV [32], expected [64]" in problem


def test_missing_and_unexpected_are_per_arch() -> None:
    expected = tritonlist.ExpectedKernels("e", "1", {"f": ("a", "b")}, "src")
    missing, unexpected = tritonlist.compare_census(
        expected, {"sm_120": {("f", "a"), ("f", "b")}, "sm_121": {("f", "a"), ("g", "c")}})
    assert missing == ["b[f]@sm_121"] and unexpected == ["c[g]@sm_121"]


def test_every_listed_version_has_a_source_and_kernels() -> None:
    data = tritonlist.load_data()
    versions = [(engine, version) for engine, spec in data.items() if engine != "version"
                for version in spec]
    assert ("vllm", "0.33.0") in versions and ("sglang", "0.5.23") in versions
    for engine, version in versions:
        expected = tritonlist.expected_kernels(engine, version)
        assert expected is not None and expected.source.strip()
        assert expected.families and all(expected.families.values())
        assert expected.chunk_o is None or expected.chunk_o.kernel in \
            expected.families[expected.chunk_o.family]


def test_a_bad_compiled_entry_is_refused() -> None:
    spec = copy.deepcopy(tritonlist.load_data()["vllm"]["0.33.0"]["chunk_o"])
    spec["compiled"] = "autotune"
    with pytest.raises(ValueError, match="import-time"):
        tritonlist.tile_rule(spec)
