"""The newest shipped vLLM and SGLang sm_120 cells, built for real (tests/real/matrix.yaml).

Real engine wheels, real torch 2.14 (CUDA 13.0 runtime), the real CUDA 13.0 toolkit from
NVIDIA's PyPI wheels, the shipped debootstrap base and templates; the compiled kernel is the
fixture tests/fixtures/cudakern (the real flash-attn / FlashInfer compiles are the main job's).
One cell at a time: built, checked (labels, versions inside the image, the audit on its real
objects), then its image removed, so that CI holds one 10-15 GB image at most.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infermatrix.stages import audit, render
from infermatrix.engine import docker as engine
from infermatrix import journal
from infermatrix.stages.build import BuildOptions, build_cells, local_ref
from infermatrix.context import Context
from infermatrix.model.coverage import Coverage
from infermatrix.stages.plan import plan_matrix
from tests.real_audit_checks import CHECKS

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]

REAL_MATRIX = Path(__file__).resolve().parent / "real" / "matrix.yaml"
CELLS = {
    "cu130-torch2.14.0-vllm0.33.0-sm120": ("vllm", "0.33.0", "2.14.0"),
    "cu130-torch2.14.1-sglang0.5.23-sm120": ("sglang", "0.5.23", "2.14.1"),
}


@pytest.fixture(scope="module")
def real_ctx(shared_state_dir: Path) -> Context:
    return Context.load(REAL_MATRIX, shared_state_dir / "real")


@pytest.fixture(scope="module")
def real_base(docker_available, real_ctx) -> str:
    from infermatrix.stages import base

    return base.build_base(real_ctx.matrix, "bookworm", real_ctx.state).ref


@pytest.mark.parametrize("cell_id", sorted(CELLS))
def test_real_cell_builds_from_its_engine_wheels_and_is_audited(real_ctx, real_base, cell_id,
                                                                tmp_path):
    engine_name, version, torch_version = CELLS[cell_id]
    [plan] = plan_matrix(real_ctx, select=[cell_id])
    assert plan.planned, plan.verdicts
    render.render_cells(real_ctx, [plan])
    result = build_cells(real_ctx, [plan], BuildOptions(echo=lambda _: None))[cell_id]
    ref = local_ref(cell_id)
    try:
        assert result.status == "pass", result.summary()
        labels = engine.image_labels(ref)
        assert labels["io.infermatrix.engine.version"] == version
        assert labels["io.infermatrix.kernel.cudakern.consumer"].startswith("fixture")
        record = journal.load(real_ctx.state, cell_id)["stages"]["build"]
        compiled = record["details"]["kernels"]["cudakern"]["compile"]
        assert compiled["exit"] == 0 and compiled["seconds"] >= 0 and compiled["peak_rss_bytes"] > 0
        verdict = audit.audit_cell(real_ctx, plan, result.image_id, ["sm_120"])
        checks = {c.name: c.status for c in verdict.checks}
        # torch 2.14 from PyPI is the CUDA 13.0 build, and the image's CUDA major is 13
        assert checks["torch-cuda"] == audit.PASS, verdict.reason
        assert checks["cuda-major"] == audit.PASS, verdict.reason
        assert verdict.versions[engine_name].startswith(version)
        assert verdict.versions["torch"].startswith(torch_version)
        fixture = next(o for o in verdict.objects if o.package == "cudakern")
        assert [d.coverage for d in fixture.decisions] == [Coverage.EXACT]
        assert any(o.path == "torch/lib/libtorch_cuda.so" for o in verdict.objects)
        CHECKS[engine_name](verdict)  # the loaded set, PTX JIT and Triton verdicts (issue 13)
    finally:
        engine.remove_image(ref, force=True)  # checked: free its 10-15 GB before the next cell
