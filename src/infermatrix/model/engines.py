"""The serving-engine table (data/engines.yaml; issue 49: one home per building block): what the
code knows of each engine beyond matrix.yaml's `engines.<e>` (how it is installed and served).
Not engine/, the Docker adapter."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parents[1] / "data" / "engines.yaml"


@cache
def rows() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load(DATA.read_text(encoding="utf-8"))["engines"])


def row(engine: str) -> dict[str, Any]:
    """The engine's row ({} for an engine the table does not name)."""
    return rows().get(engine) or {}


def harness_name(engine: str) -> str:
    """The engine's name to the in-image harness; "none" for one it has no checks of."""
    return str(row(engine).get("harness") or "none")
