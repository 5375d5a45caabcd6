"""Plan time for the shipped matrix and for synthetic matrices up to 10,000 cells.

Prints seconds and microseconds per cell; linear growth shows as a flat per-cell figure.
The synthetic runs answer index look-ups from memory so that only the planner is timed; the
shipped matrix is timed against the on-disk metadata cache (filled on first use).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from infermatrix.context import Context  # noqa: E402
from infermatrix.model.index import ReleaseMetadata  # noqa: E402
from infermatrix.stages.plan import plan_matrix  # noqa: E402


def synthetic_source(name: str, version: str, machine: str = "x86_64") -> ReleaseMetadata:
    if name == "torch":
        req = 'cuda-toolkit[cudart]==13.0.2; platform_system == "Linux"'
    else:  # each engine release pins one of the torch releases
        minor = int(version.split(".")[-1]) % 4
        req = f"torch==2.{10 + minor}.0"
    return ReleaseMetadata(name, version, "synthetic.whl", "memory://", (req,))


def synthetic_matrix(n_engines: int) -> dict:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["axes"] = {
        "cuda": ["12.6", "12.8", "12.9", "13.0", "13.2"],
        "torch": ["2.10.0", "2.11.0", "2.12.0", "2.13.0", "2.9.1"],
        "engine": [f"{'sglang' if i % 2 else 'vllm'}==0.{i // 10 + 10}.{i % 10}"
                   for i in range(n_engines)],
        "arch": ["sm_120", "sm_121", "sm_100", "sm_90"],
    }
    data["include"] = []
    return data


def time_plan(ctx: Context, source=None, repeat: int = 3) -> tuple[float, int]:
    """Best of `repeat` runs (the least disturbed by other work on the machine)."""
    best, cells = float("inf"), 0
    for _ in range(repeat):
        started = time.perf_counter()
        cells = len(plan_matrix(ctx, source=source))
        best = min(best, time.perf_counter() - started)
    return best, cells


def main() -> None:
    shipped = Context.load(ROOT / "matrix.yaml")
    plan_matrix(shipped)  # fill the metadata cache
    seconds, cells = time_plan(shipped)
    print(f"shipped matrix: {cells} cells in {seconds * 1000:.1f} ms "
          f"({seconds / cells * 1e6:.0f} us/cell, warm disk cache)")
    print(f"{'cells':>8} {'seconds':>9} {'us/cell':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n_engines in (13, 25, 50, 100):
            path = Path(tmp) / f"m{n_engines}.yaml"
            path.write_text(yaml.safe_dump(synthetic_matrix(n_engines)))
            ctx = Context.load(path, Path(tmp) / "state")
            seconds, cells = time_plan(ctx, synthetic_source)
            print(f"{cells:>8} {seconds:>9.3f} {seconds / cells * 1e6:>9.1f}")


if __name__ == "__main__":
    main()
