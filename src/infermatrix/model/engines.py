"""The serving-engine table (data/engines.yaml; issue 49: one home per building block): what the
code knows of each engine beyond matrix.yaml's `engines.<e>` (how it is installed and served).
Not engine/, the Docker adapter."""

from __future__ import annotations

from typing import Any

from ..datafiles import DATA_DIR, read_data

DATA = DATA_DIR / "engines.yaml"


def rows() -> dict[str, dict[str, Any]]:
    return dict(read_data(DATA)["engines"])


def row(engine: str) -> dict[str, Any]:
    """The engine's row ({} for an engine the table does not name)."""
    return rows().get(engine) or {}


def harness_name(engine: str) -> str:
    """The engine's name to the in-image harness; "none" for one it has no checks of."""
    return str(row(engine).get("harness") or "none")
