"""What the audit must say about the real images of the newest shipped vLLM and SGLang sm_120
cells (issue 13), on their real objects. tests/docker/test_build_real_cells.py builds each image and
calls these before it removes it (CI holds one 10-15 GB image at a time)."""

from __future__ import annotations

from infermatrix.stages.audit import PASS


def not_loaded_entries(result) -> dict[str, str]:
    return {g["object"]: g["entry"] for g in result.groups()["sm_120"]["not-loaded"]}


def check_kernel_list(triton, engine: str, version: str, arch: str = "sm_120") -> None:
    """Every kernel name of the engine version's expected list compiled for `arch`, none
    unexpected (data/triton_kernels.yaml), and the real FLA chunk_o's import-time tiles those
    of a 99 KiB device: BKV_LIST [32, 64], chosen from the limit its query saw (101,376 B, not
    the -1 of a failed query, which would also give [32, 64]): chunk_o was first imported while
    its op was driven under the target's compile-only driver, whose answer that is."""
    listed = triton.data["kernel_list"]
    assert (listed["engine"], listed["version"], listed["held"]) == (engine, version, True)
    assert listed["missing"] == [] and listed["unexpected"] == [], listed
    assert listed["tile_problems"] == [], listed
    tiles = listed["tiles"][arch]
    assert tiles["BKV_LIST"] == [32, 64] and tiles["limit_seen"] == [101376], tiles
    assert tiles["large_smem"] is False and tiles["threshold"] == 102400, tiles
    assert tiles["imported_under_driver"] is True, tiles  # the limit seen is its import's


def check_real_vllm(result) -> None:
    """vLLM sm_120: FA2 by PTX JIT, FA3 and FlashMLA not loaded (with reasons), Triton fits."""
    assert result.check("kernels").status == PASS, result.check("kernels").detail
    assert result.check("cuda-major").status == PASS, result.check("cuda-major").detail
    groups = result.groups()["sm_120"]
    assert "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" in {g["object"] for g in groups["ptx-jit"]}
    entries = not_loaded_entries(result)
    assert entries["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"] == "vllm-fa3"
    assert entries["vllm/_flashmla_C.abi3.so"] == "vllm-flashmla"
    assert all(g["reason"] and g["source"] for g in groups["not-loaded"])
    triton = result.check("triton-smem")
    assert triton.status == PASS, triton.detail
    # the Gated DeltaNet ops of Qwen3.6's serve path, with autotune configs per kernel
    families = {row["family"] for row in triton.data["summary"]}
    assert {"unified-prefill", "unified-decode", "gdn-prefill-chunk", "gdn-decode",
            "gdn-decode-mixed", "conv1d-prefill", "conv1d-decode", "gated-rmsnorm"} <= families
    check_kernel_list(triton, "vllm", "0.33.0")
    chunk_h = next(r for r in triton.data["summary"]
                   if r["kernel"] == "chunk_gated_delta_rule_fwd_kernel_h_blockdim64")
    assert chunk_h["autotuned"] and chunk_h["configs"] > 1 and chunk_h["fits"]
    # the path taken: vLLM 0.33 chooses FlashInfer's GDN prefill (head dim 128, CUDA 13), and
    # its sm_120 kernel imports in the image (the cuda-python>=13 constraint); it is compiled
    # at first start, and the verdict says so
    gdn = triton.data["paths"]["sm_120"]["gdn_prefill"]
    assert (gdn["chosen"], gdn["importable"]) == ("flashinfer", True), gdn
    assert "chunk_gated_delta_rule_sm120" in triton.detail and "first start" in triton.detail
    assert result.passed, result.reason


def check_real_sglang(result) -> None:
    """SGLang sm_120: FA3, FlashMLA and the sm90 ops not loaded; torch_memory_saver's CUDA 12
    hook chosen at run time, not a second CUDA major; the triton backend's kernels fit."""
    assert result.check("kernels").status == PASS, result.check("kernels").detail
    cuda = result.check("cuda-major")
    assert cuda.status == PASS and "torch_memory_saver_hook_mode_preload_cu12.abi3.so" in \
        cuda.data["chosen_at_run_time"]
    entries = not_loaded_entries(result)
    assert entries["sgl_kernel/flash_ops.abi3.so"] == "sgl-kernel-fa3"
    assert entries["sgl_kernel/flashmla_ops.abi3.so"] == "sgl-kernel-flashmla"
    assert entries["sgl_kernel/sm90/common_ops.abi3.so"] == "sgl-kernel-sm90-ops"
    triton = result.check("triton-smem")
    assert triton.status == PASS, triton.detail
    # attention (extend, decode, the vision encoder's prefill) and every Triton op of SGLang's
    # GDN backend for Qwen3.6's 48 linear-attention layers
    assert {k["family"] for k in triton.data["kernels"]} == {
        "extend", "decode", "prefill", "conv1d-prefill", "gdn-prefill-split",
        "gdn-prefill-gating", "gdn-prefill-chunk", "gated-rmsnorm", "conv1d-decode",
        "gdn-decode"}
    check_kernel_list(triton, "sglang", "0.5.23")
    kkt = next(r for r in triton.data["summary"]
               if r["kernel"] == "chunk_gated_delta_rule_fwd_kkt_solve_kernel")
    assert kkt["autotuned"] and kkt["configs"] > 1 and kkt["fits"]
    # the path taken: SGLang 0.5.23 defaults GDN prefill to FlashInfer on SM90/SM100 only, so
    # on sm_120 both phases run the Triton kernels audited above
    paths = triton.data["paths"]["sm_120"]
    assert (paths["gdn_prefill"]["chosen"], paths["gdn_decode"]["chosen"]) == \
        ("triton", "triton"), paths
    assert "flashinfer_gdn_prefill_default" in paths["gdn_prefill"]["source"]
    assert result.passed, result.reason


CHECKS = {"vllm": check_real_vllm, "sglang": check_real_sglang}
