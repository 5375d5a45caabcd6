"""Sweep MAX_JOBS x NVCC_THREADS over a ninja build that has already run once.

    python3 bench/compile_sweep.py --build-dir DIR --results DIR --deadline EPOCH \
        --points 16x1,24x1,8x1,12x1,16x2 [--subset-of-full FULL.json]

It reads the build's `build.ninja` and `.ninja_log` (the durations of the first, full build),
picks a representative subset of the compile targets (the heaviest one always, then every k-th
in order of duration, so the subset keeps the full build's mix), and for each point deletes
those objects and rebuilds them with `ninja -j MAX_JOBS` under compile_sampler.py. NVCC_THREADS
is changed by rewriting `--threads N` in a copy of build.ninja. k is chosen so that the points
fit before the deadline, from the full build's wall time; a point that would not fit is skipped
and recorded as such. The heaviest target is also what sets the per-job peak.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def compile_targets(ninja_file: Path) -> list[str]:
    targets = []
    for line in ninja_file.read_text().splitlines():
        match = re.match(r"build (\S+\.o): cuda_compile ", line)
        if match:
            targets.append(match.group(1).replace("$:", ":"))
    return targets


def durations(ninja_log: Path) -> dict[str, float]:
    result = {}
    for line in ninja_log.read_text().splitlines():
        if line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) >= 4:
            result[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return result


def pick_subset(targets: list[str], seconds: dict[str, float], step: int) -> list[str]:
    ordered = sorted(targets, key=lambda t: seconds.get(t, 0.0), reverse=True)
    return ordered[::step]


def point_factor(jobs: int, cpus: int) -> float:
    return cpus / min(jobs, cpus)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--deadline", type=float, required=True, help="epoch seconds")
    parser.add_argument("--points", default="16x1,24x1,8x1,12x1,16x2")
    parser.add_argument("--full-wall", type=float, required=True)
    parser.add_argument("--cpus", type=int, default=16)
    parser.add_argument("--threads-now", type=int, default=1)
    parser.add_argument("--subset", default="",
                        help="comma-separated object names to rebuild (default: picked by step)")
    args = parser.parse_args(argv)

    ninja_file = args.build_dir / "build.ninja"
    targets = compile_targets(ninja_file)
    seconds = durations(args.build_dir / ".ninja_log")
    points = [tuple(int(x) for x in p.split("x")) for p in args.points.split(",")]
    budget = args.deadline - time.time()
    cost_full = args.full_wall * sum(point_factor(j, args.cpus) for j, _ in points)
    step = max(1, math.ceil(cost_full / max(budget, 1)))
    subset = pick_subset(targets, seconds, step)
    if args.subset:  # a fixed subset, so points of separate sessions compare side by side
        wanted = set(args.subset.split(","))
        subset = [t for t in targets if Path(t).name in wanted]
        step = max(1, round(len(targets) / max(len(subset), 1)))
    meta = {"targets": len(targets), "subset_step": step, "subset": [Path(t).name for t in subset],
            "subset_cpu_s_in_full_build": round(sum(seconds.get(t, 0) for t in subset), 1),
            "full_cpu_s": round(sum(seconds.get(t, 0) for t in targets), 1),
            "budget_s": round(budget), "points": []}
    for jobs, threads in points:
        name = f"sub-j{jobs}-t{threads}"
        estimate = args.full_wall / step * point_factor(jobs, args.cpus) * 1.2
        if time.time() + estimate > args.deadline:
            meta["points"].append({"point": name, "skipped": f"would not fit ({estimate:.0f} s)"})
            continue
        variant = args.build_dir / f"build-t{threads}.ninja"
        variant.write_text(ninja_file.read_text().replace(f"--threads {args.threads_now}",
                                                          f"--threads {threads}"))
        for target in subset:
            Path(target).unlink(missing_ok=True)
        command = [sys.executable, str(HERE / "compile_sampler.py"), "--out",
                   str(args.results / f"{name}.json"), "--cgroup", f"im16-{name}", "--",
                   "ninja", "-C", str(args.build_dir), "-f", variant.name, "-j", str(jobs),
                   *subset]
        with (args.results / f"{name}.log").open("w") as log:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
        meta["points"].append({"point": name, "exit_code": code})
        (args.results / "sweep-meta.json").write_text(json.dumps(meta, indent=1))
    (args.results / "sweep-meta.json").write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
