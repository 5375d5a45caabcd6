"""The tag policy's pure part (matrix.yaml `tag_policy`): the kinds of tag, the default policy,
the levels a cell must pass and the throughput floor of its lane. The tag step (stages/tagging.py)
decides with it; the test-result attestation (supplychain/attest.py) states it."""

from __future__ import annotations

from typing import Any

from .. import levels as level_table
from .cell import Cell

TESTED = "tested"
STATIC_ONLY = "static-only"
DEFAULT_POLICY = {"require": list(level_table.REQUIRED_LEVELS), "allow_static_only": False}


def throughput_floor(policy: dict[str, Any], cell: Cell) -> float | None:
    """The policy's tokens/s floor per replica for the cell's lane, or None (off)."""
    floors = policy.get("throughput") or {}
    value = floors.get("min_tokens_per_s_per_gpu" if cell.is_gpu else "min_tokens_per_s_cpu")
    return None if value is None else float(value)


def required_levels(policy: dict[str, Any], cell: Cell) -> list[str]:
    """The policy's levels, less those that do not apply to the cell (gpu on the CPU lane),
    plus throughput when the policy sets a floor for the cell's lane."""
    required = list(policy.get("require", DEFAULT_POLICY["require"]))
    if throughput_floor(policy, cell) is not None and "throughput" not in required:
        required.append("throughput")
    return [lv for lv in required if cell.is_gpu or lv not in level_table.GPU_CELLS_ONLY]
