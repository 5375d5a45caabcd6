"""The audit on the images of the shipped matrix's real x86_64 CUDA 13 sm_120 cells.

How a test finds its image: the Docker image labelled `io.infermatrix.cell=<cell id>` (render
puts that label on every cell image; CI's real-cell build job builds them, issue 12), newest
first; INFERMATRIX_REAL_IMAGE_<ENGINE> (e.g. INFERMATRIX_REAL_IMAGE_VLLM=im13-vllm:sm120)
overrides. Without the image the test is skipped on a developer machine and fails under CI=true
(tests/conftest.py): CI must build the cell it claims to test.

What is held: the static verdict passes with the engine's Hopper/MLA-only objects listed as not
loaded (with reasons from data/loaded.yaml), vLLM's FA2 reported as PTX-JIT, torch_memory_saver's
CUDA 12 hooks recognised as never loaded, and the Triton attention kernels fitting sm_120.
"""

from __future__ import annotations

import os

import pytest

from infermatrix.stages import audit
from infermatrix.engine import docker as engine
from infermatrix.stages.audit import PASS
from infermatrix.context import Context

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.network]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLS = {"vllm": "cu130-torch2.14.0-vllm0.33.0-sm120",
         "sglang": "cu130-torch2.14.1-sglang0.5.23-sm120"}


def image_of(engine_name: str) -> str:
    explicit = os.environ.get(f"INFERMATRIX_REAL_IMAGE_{engine_name.upper()}")
    if explicit:
        return explicit
    found = engine.images_with_label(f"io.infermatrix.cell={CELLS[engine_name]}")
    if not found:
        pytest.skip(f"no image labelled io.infermatrix.cell={CELLS[engine_name]} (built by CI's "
                    "real-cell job)")
    return max(found, key=lambda image: image.get("Created", 0))["Id"]


@pytest.fixture(scope="module")
def shipped(docker_available, tmp_path_factory) -> Context:
    return Context.load(os.path.join(ROOT, "matrix.yaml"), tmp_path_factory.mktemp("state"))


def audited(ctx: Context, engine_name: str):
    from infermatrix.stages.plan import plan_matrix

    image = image_of(engine_name)
    (plan,) = plan_matrix(ctx, select=[CELLS[engine_name]])
    return audit.audit_cell(ctx, plan, image, ["sm_120"], record=False)


def not_loaded_entries(result) -> dict[str, str]:
    return {g["object"]: g["entry"] for g in result.groups()["sm_120"]["not-loaded"]}


def test_real_vllm_cell_passes_with_fa2_jit_and_fa3_flashmla_not_loaded(shipped) -> None:
    result = audited(shipped, "vllm")
    assert result.check("kernels").status == PASS, result.check("kernels").detail
    assert result.check("cuda-major").status == PASS, result.check("cuda-major").detail
    groups = result.groups()["sm_120"]
    assert "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" in {g["object"] for g in groups["ptx-jit"]}
    entries = not_loaded_entries(result)
    assert entries["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"] == "vllm-fa3"
    assert entries["vllm/_flashmla_C.abi3.so"] == "vllm-flashmla"
    assert all(g["reason"] and g["source"] for g in groups["not-loaded"])
    assert result.check("triton-smem").status == PASS, result.check("triton-smem").detail
    assert result.passed, result.reason


def test_real_sglang_cell_passes_with_fa3_flashmla_sm90_ops_not_loaded(shipped) -> None:
    result = audited(shipped, "sglang")
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
    assert {k["family"] for k in triton.data["kernels"]} == {"extend", "decode", "prefill"}
    assert result.passed, result.reason
