"""Benchmark: the forecast a fresh clone prints (issue 47) against what a run really took
(prints figures, asserts nothing).

    python bench/forecast_error.py --state-dir .state [--matrix matrix.yaml] [--select PATTERN]

For every selected cell whose last build passed (and was not a reuse), the fresh forecast of its
build (the compile model, estimate_minutes, the default image time: what `plan --forecast` says
before anything was built) beside the journal's build time, and for each kernel the run
compiled, the forecast compile beside the recorded one; then the error of each and of the sum.
Nothing is built: run it on the state directory of a finished main job.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from infermatrix import journal  # noqa: E402
from infermatrix.context import Context  # noqa: E402
from infermatrix.model.compileprogress import clock  # noqa: E402
from infermatrix.options import RunOptions  # noqa: E402
from infermatrix.stages import plan_cells  # noqa: E402
from infermatrix.stages.forecast import run_forecast  # noqa: E402


def error(forecast: float, actual: float) -> str:
    return f"{(forecast - actual) / actual * 100:+.0f}%" if actual else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", default=str(ROOT / "matrix.yaml"))
    parser.add_argument("--state-dir", default=str(ROOT / ".state"))
    parser.add_argument("--select", action="append", default=[], metavar="PATTERN")
    args = parser.parse_args()
    ctx = Context.load(args.matrix, args.state_dir, offline=True)
    cells = ctx.specs(plan_cells(ctx, args.select, []))
    result = run_forecast(ctx, cells, RunOptions(), fresh=True)
    forecast = {c.cell_id: c for c in result.cells}
    total_f = total_a = 0.0
    print(f"{'cell / kernel':<48} {'forecast':>9} {'actual':>9} {'error':>7}")
    for cell in cells:
        build = journal.cell_record(ctx.state, cell.id).stage("build")
        if build is None or build.status != journal.Status.PASS or not build.duration_s:
            continue
        predicted = forecast[cell.id].seconds
        total_f, total_a = total_f + predicted, total_a + build.duration_s
        print(f"{cell.id:<48} {clock(predicted):>9} {clock(build.duration_s):>9} "
              f"{error(predicted, build.duration_s):>7}")
        for name, kernel in (build.details.get("kernels") or {}).items():
            if kernel.get("cache") != "miss":
                continue
            part = next((p for p in forecast[cell.id].kernels.split(", ")
                         if p.startswith(f"{name} ")), "")
            print(f"  kernel {name:<39} {part.split(' ')[1] if part else '?':>9} "
                  f"{clock(kernel.get('duration_s')):>9}  (MAX_JOBS={kernel.get('max_jobs')})")
    print(f"{'sum of the cells built':<48} {clock(total_f):>9} {clock(total_a):>9} "
          f"{error(total_f, total_a):>7}")
    print(f"forecast total of the run (slots, compiles at full width): {clock(result.total_s)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
