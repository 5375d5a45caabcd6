"""A cell's CellSpec as the planner gives it with no index facts (offline), for tests that
need what publish records of a cell (images.lock's `run`) without planning the whole matrix."""

from __future__ import annotations

from pathlib import Path

from infermatrix.config import Matrix
from infermatrix.context import Context
from infermatrix.model.cell import Cell, CellPlan
from infermatrix.model.rules import choose_attention_backend
from infermatrix.model.spec import CellSpec
from infermatrix.stages import publish
from infermatrix.stages.plan import settings_for
from infermatrix.state import StatePaths


def spec_of(matrix: Matrix, cell: Cell, state: Path | None = None) -> CellSpec:
    """The cell planned from `matrix` alone (its lock read from the matrix's locks/)."""
    ctx = Context(matrix=matrix, state=StatePaths.at(state or matrix.root / ".state"))
    backend, _ = choose_attention_backend(cell, matrix)
    return ctx.spec(CellPlan(cell, "planned",
                             settings=settings_for(cell, matrix, None, backend)))


def run_of(matrix: Matrix, cell: Cell) -> dict:
    """images.lock's `run` of the cell, as publish writes it."""
    return publish.run_spec(matrix, spec_of(matrix, cell))
