"""The packaged data files (src/infermatrix/data/*.yaml): where they are, and one reader."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"


@cache
def read_data(path: Path) -> dict[str, Any]:
    """A YAML data file, parsed once per path ({} when empty). Every caller shares the result:
    read it, never change it."""
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
