"""The one-line JSON result every harness program ends with (stdlib only)."""

from __future__ import annotations

import json
import sys
from typing import Any

RESULT_MARKER = "INFERMATRIX-RESULT "


def emit(result: dict[str, Any]) -> int:
    """Print the result line and return the exit code: 1 for fail, 0 for pass or skip."""
    sys.stdout.flush()
    print(RESULT_MARKER + json.dumps(result, sort_keys=True, default=str), flush=True)
    return 1 if result.get("status") == "fail" else 0


def parse(output: str) -> dict[str, Any] | None:
    """The last result line in a program's output, or None when it printed none."""
    for line in reversed(output.splitlines()):
        start = line.find(RESULT_MARKER)
        if start >= 0:
            try:
                return json.loads(line[start + len(RESULT_MARKER):])
            except json.JSONDecodeError:
                return None
    return None


def overall(checks: list[dict[str, Any]]) -> str:
    """fail if any check failed, else pass if any passed, else skip."""
    statuses = {c.get("status") for c in checks}
    if "fail" in statuses:
        return "fail"
    return "pass" if "pass" in statuses else "skip"
