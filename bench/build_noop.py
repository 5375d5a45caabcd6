"""Benchmark: cold build of the test matrix vs a no-op rerun (prints figures, asserts nothing).

    python bench/build_noop.py [--no-cache] [--select PATTERN ...]

"Cold" is a fresh state directory: empty journal and kernel cache; BuildKit's layer cache is
as found unless --no-cache (then every layer is rebuilt; uv's cache mount still holds the
downloads). The rerun uses the same state directory and should do no build at all.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from infermatrix.stages import base, render  # noqa: E402
from infermatrix.options import RunOptions  # noqa: E402
from infermatrix.stages.build import build_cells  # noqa: E402
from infermatrix.engine.docker import Engine  # noqa: E402
from infermatrix.context import Context, setup_command_log  # noqa: E402
from infermatrix.stages.plan import plan_matrix  # noqa: E402

DEFAULT_SELECT = ["cpu-*", "cu130-*-kernel-fixture*"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cache", action="store_true", help="cold BuildKit layers too")
    parser.add_argument("--select", action="append", default=None, metavar="PATTERN")
    parser.add_argument("--matrix", default=str(ROOT / "tests" / "matrix" / "matrix.yaml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-build-noop-") as state_dir:
        ctx = Context.load(args.matrix, state_dir)
        setup_command_log(ctx.state)
        docker = Engine()  # DOCKER_HOST / the current context
        plans = [p for p in plan_matrix(ctx, select=args.select or DEFAULT_SELECT) if p.planned]
        base.build_base(ctx.matrix, ctx.matrix.bases["default"], ctx.state, docker=docker)
        render.render_cells(ctx, plans)
        quiet = RunOptions(no_cache=args.no_cache)
        started = time.monotonic()
        cold = build_cells(ctx, ctx.specs(plans), quiet, echo=lambda _line: None, docker=docker)
        cold_s = time.monotonic() - started
        started = time.monotonic()
        rerun = build_cells(ctx, ctx.specs(plans), RunOptions(), echo=lambda _line: None,
                            docker=docker)
        rerun_s = time.monotonic() - started
        builds = sum(1 for ln in ctx.state.commands_log.read_text().splitlines()
                     if "--progress=plain" in ln)
    print(f"cells: {len(plans)}  (BuildKit cache: {'off' if args.no_cache else 'as found'})")
    print(f"{'cell':<55} {'cold s':>8} {'cold':>6} {'rerun':>8}")
    for plan in plans:
        first, second = cold[plan.id], rerun[plan.id]
        print(f"{plan.id:<55} {first.duration_s:>8.1f} {first.status:>6} "
              f"{'no-op' if second.reused else second.status:>8}")
    print(f"cold build total:  {cold_s:8.1f} s")
    print(f"no-op rerun total: {rerun_s:8.2f} s  ({rerun_s / max(cold_s, 1e-9) * 100:.2f} % of cold)")
    print(f"docker build commands run: {builds} (all during the cold build)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
