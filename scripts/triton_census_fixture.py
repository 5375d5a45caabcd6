"""triton_census_fixture AUDIT_LOG ARCH [ARCH...] > FIXTURE.json

The harness.triton_smem result of a real audit (the cell's audit.log in the state directory,
the line after `# harness.triton_smem ...`), kept to the archs given and trimmed to what the
audit reads (per family: its kernels' names, bytes, warps, stages, constexprs, autotune group,
its summary rows, and the chunk family's import-time tiles). How
tests/fixtures/triton/*-harness.json is made (from the real lane's vLLM 0.33.0 sm_120 cell, run
with --basetemp so that its state directory stays).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from infermatrix.harness._result import parse  # noqa: E402

KERNEL_KEYS = ("kernel", "shared", "num_warps", "num_stages", "constexprs", "autotune",
               "configs", "compile_error")
FAMILY_KEYS = ("family", "driven", "reason", "note", "tiles", "summary")
ARCH_KEYS = ("arch", "limit", "status", "reason", "notes")


def harness_output(log: str) -> str:
    """The output logged after the last `# harness.triton_smem` header."""
    start = log.rfind("# harness.triton_smem ")
    if start < 0:
        raise SystemExit("no `# harness.triton_smem` section in the log")
    return log[start:]


def trim(result: dict[str, Any], archs: list[str]) -> dict[str, Any]:
    kept = [a for a in result.get("archs", []) if a.get("arch") in archs]
    return {"status": result.get("status"), "engine": result.get("engine"),
            "archs": [{**{k: a.get(k) for k in ARCH_KEYS},
                       "families": [{**{k: f[k] for k in FAMILY_KEYS if k in f},
                                     "kernels": [{k: r[k] for k in KERNEL_KEYS if k in r}
                                                 for r in f.get("kernels", [])]}
                                    for f in a.get("families", [])]}
                      for a in kept]}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    result = parse(harness_output(Path(argv[0]).read_text(encoding="utf-8")))
    if result is None:
        raise SystemExit("no result line after the harness header")
    json.dump(trim(result, argv[1:]), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
