"""Benchmark: the fixture CUDA package's compile, peak memory vs the planner's budget, and wall
time at the planned MAX_JOBS vs a small sweep (prints figures, asserts nothing).

    python bench/compile_memory.py [--cell SUFFIX] [--sweep 1x1,1x2,2x1,2x2,4x2]

The compile runs in a container of the cell's `compile-cudakern` stage (built once, tagged
infermatrix-bench/...), from a fresh copy of the source, with MAX_JOBS / NVCC_THREADS set.
Memory comes from the container's cgroup: the v1 `memory.max_usage_in_bytes` (page cache
included) and the largest `total_rss` sampled every 0.2 s (v2: memory.peak / anon from
memory.stat); the engine's stats are the fallback.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from infermatrix.options import RunOptions  # noqa: E402
from infermatrix.stages import base, build, render  # noqa: E402
from infermatrix.model import compileplan  # noqa: E402
from infermatrix.engine import docker as engine  # noqa: E402
from infermatrix.context import Context, setup_command_log  # noqa: E402
from infermatrix.stages.plan import plan_matrix  # noqa: E402

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

GIB = compileplan.GIB
KERNEL = "cudakern"
COMPILE = ("rm -rf /tmp/k /tmp/out && cp -r /src/cudakern /tmp/k && rm -rf /tmp/k/build "
           "&& cd /tmp/k && pip wheel --no-deps --no-build-isolation --no-cache-dir -w /tmp/out . "
           "> /tmp/compile.log 2>&1; status=$?; tail -3 /tmp/compile.log; exit $status")


def cgroup_dir(container_id: str) -> tuple[Path | None, str]:
    for path, kind in ((Path("/sys/fs/cgroup/memory/docker") / container_id, "v1"),
                       (Path("/sys/fs/cgroup/system.slice") / f"docker-{container_id}.scope", "v2"),
                       (Path("/sys/fs/cgroup/docker") / container_id, "v2")):
        if path.is_dir():
            return path, kind
    return None, "stats"


def _stat(path: Path, key: str) -> int:
    for line in (path / "memory.stat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


class PeakSampler(threading.Thread):
    """Largest resident memory of a container, sampled until stopped."""

    def __init__(self, container_id: str) -> None:
        super().__init__(daemon=True)
        self.container_id = container_id
        self.directory, self.kind = cgroup_dir(container_id)
        self.peak_rss = 0
        self.peak_cgroup: int | None = None  # read while running: the cgroup goes at exit
        self.stop = threading.Event()

    def sample(self) -> int:
        if self.kind == "v1":
            return _stat(self.directory, "total_rss")
        if self.kind == "v2":
            return _stat(self.directory, "anon")
        current, _peak = DOCKER.container_memory(self.container_id)
        return current or 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak_rss = max(self.peak_rss, self.sample())
                peak = self.read_cgroup_peak()
                if peak is not None:
                    self.peak_cgroup = max(self.peak_cgroup or 0, peak)
            except (OSError, ValueError):
                pass
            self.stop.wait(0.2)

    def read_cgroup_peak(self) -> int | None:
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            if self.directory is not None and (self.directory / name).is_file():
                return int((self.directory / name).read_text())
        return None


def compile_once(image: str, jobs: int, threads: int, arch_list: str) -> dict:
    env = {"MAX_JOBS": str(jobs), "NVCC_THREADS": str(threads), "TORCH_CUDA_ARCH_LIST": arch_list}
    started = time.monotonic()
    container = DOCKER.run_container(engine.ContainerSpec(
        image, ["sh", "-c", COMPILE], env=env, labels={"io.infermatrix.bench": "compile_memory"}))
    sampler = PeakSampler(container)
    sampler.start()
    try:
        code = DOCKER.wait_container(container, timeout=1800)
        wall = time.monotonic() - started
        sampler.stop.set()
        sampler.join()
        peak = sampler.peak_cgroup
        tail = DOCKER.container_logs(container, tail=3)
    finally:
        DOCKER.remove_container(container)
    return {"jobs": jobs, "threads": threads, "wall_s": wall, "exit": code,
            "peak_rss": sampler.peak_rss, "cgroup_peak": peak, "how": sampler.kind, "tail": tail}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="kernel-fixture1.0-sm120")
    parser.add_argument("--sweep", default="1x1,1x2,2x1,2x2,4x2",
                        help="MAX_JOBSxNVCC_THREADS pairs besides the planned one")
    parser.add_argument("--matrix", default=str(ROOT / "tests" / "matrix" / "matrix.yaml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as state_dir:
        ctx = Context.load(args.matrix, state_dir)
        setup_command_log(ctx.state)
        plan = next(p for p in plan_matrix(ctx) if p.planned and p.id.endswith(args.cell))
        base.build_base(ctx.matrix, ctx.matrix.bases["default"], ctx.state, docker=DOCKER)
        render.render_cells(ctx, [plan])
        spec = ctx.matrix.build["kernels"][KERNEL]
        planned = build.compile_plan_for(ctx, [[KERNEL]], RunOptions())
        print(planned.describe())
        image = f"infermatrix-bench/compile-{KERNEL}:{plan.id}"
        directory = build.cell_dir(ctx, plan.id)
        DOCKER.build_image(engine.BuildRequest(
            directory, target=f"compile-{KERNEL}", tag=image, build_args=planned.build_args(),
            secrets=build.secrets_for(RunOptions())),
            log_path=ctx.state.root / "compile-stage.log", timeout=3600)
        arch_list = render.torch_arch_list(plan.cell)
        pairs = [(planned.max_jobs, planned.nvcc_threads)]
        for pair in args.sweep.split(","):
            jobs, threads = (int(x) for x in pair.split("x"))
            if (jobs, threads) not in pairs:
                pairs.append((jobs, threads))
        rows = []
        try:
            for jobs, threads in pairs:
                rows.append(compile_once(image, jobs, threads, arch_list))
        finally:
            DOCKER.remove_image(image, force=True)
    gb = float(spec["gb_per_nvcc_thread"])
    print(f"\n{KERNEL} for {plan.cell.arch} ({args.cell}); model {gb:g} GB per nvcc thread")
    print(f"{'MAX_JOBS':>8} {'THREADS':>7} {'wall s':>7} {'peak RSS GB':>11} "
          f"{'cgroup peak GB':>14} {'budget GB':>9} {'within':>6}  note")
    for row in rows:
        budget = row["jobs"] * row["threads"] * gb
        peak = row["peak_rss"] / GIB
        cgroup = f"{row['cgroup_peak'] / GIB:14.2f}" if row["cgroup_peak"] else f"{'n/a':>14}"
        note = "planned" if (row["jobs"], row["threads"]) == pairs[0] else ""
        if row["exit"] != 0:
            note += f" FAILED exit {row['exit']}: {row['tail'].strip()[-120:]}"
        print(f"{row['jobs']:>8} {row['threads']:>7} {row['wall_s']:>7.1f} {peak:>11.2f} "
              f"{cgroup} {budget:>9.2f} {'yes' if peak <= budget else 'NO':>6}  {note}")
    print(f"(memory read from: {rows[0]['how'] if rows else '-'}; cgroup peak includes page cache)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
