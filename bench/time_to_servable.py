"""Benchmark: time to a servable image of each selected cell (issue 47), and the forecast's
error against it (prints figures, asserts nothing).

    python bench/time_to_servable.py --select CELL [--select CELL ...] --state-dir DIR
        [--levels static] [--no-publish] [--until servable|train] [--cold]
        [--matrix matrix.yaml] [--out FILE.json]

Runs the real main job (`infermatrix pipeline`) for the cells, in one run, with a fresh state directory
(it must be absent or empty: nothing recorded, nothing in its kernel cache) and watches the
journal as the job writes it:
  - serving image built: the build stage passes (the image is usable for serving from then);
  - serving verdict: the tag stage is recorded (tagged, or "built, not verified" on a host
    without a GPU, where the CUDA cell stops there by the tag policy);
  - training image: the train stage is recorded (only with --until train).
With --until servable (the default) the job is interrupted (SIGINT to its process group, as a
Ctrl-C: its builds stop, the engine stays) as soon as the serving verdict is recorded, before
the training-only compiles. With --until train, each training kernel's compile inside the job
is printed with the width it ran at (its record in the train stage). --cold runs the job with
INFERMATRIX_NO_CACHE=1 (BuildKit --no-cache: no layer, kernel compile included, comes from an
earlier build). Beside each figure: the forecast a fresh clone prints for it
(`run_forecast(fresh=True)`, the same table as `plan --forecast`) and its error. Docker images
and BuildKit's cache are not cleared: the lines say what was already there (warm).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from infermatrix import journal  # noqa: E402
from infermatrix.context import Context  # noqa: E402
from infermatrix.engine.docker import Engine  # noqa: E402
from infermatrix.model.compileprogress import clock  # noqa: E402
from infermatrix.options import RunOptions  # noqa: E402
from infermatrix.stages import plan_cells  # noqa: E402
from infermatrix.stages.build import base_refs, cell_dir  # noqa: E402
from infermatrix.stages.forecast import run_forecast  # noqa: E402
from infermatrix.state import StatePaths  # noqa: E402

from hostload import autogroup_enabled, warn_if_nice_is_weak  # noqa: E402

POLL_S = 5.0


@dataclass
class Marks:
    """Seconds from the job's start to each event (None: not reached)."""

    serving_built: float | None = None
    serving_verdict: float | None = None
    verdict: str | None = None  # the tag stage's status and reason
    train_done: float | None = None
    train_status: str | None = None
    # the train stage's record of each training kernel: seconds, MAX_JOBS, cache
    train_kernels: dict[str, dict] | None = None


@dataclass
class Job:
    marks: dict[str, Marks]
    exit_code: int | None = None
    interrupted: bool = False


def error(forecast: float | None, actual: float | None) -> str:
    if not forecast or not actual:
        return "-"
    return f"{(forecast - actual) / actual * 100:+.0f}%"


def fresh_state(path: Path) -> None:
    if path.exists() and any(path.iterdir()):
        raise SystemExit(f"{path} is not empty: the figure is for a fresh state directory "
                         "(remove it, or name another)")
    path.mkdir(parents=True, exist_ok=True)


def warm_lines(ctx: Context, cell_id: str) -> list[str]:
    """What the engine already holds that the cell builds from (its FROM images)."""
    dockerfile = cell_dir(ctx, cell_id) / "Dockerfile"
    if not dockerfile.is_file():
        return ["not rendered yet: bases unknown"]
    docker = Engine()
    lines = []
    for ref in base_refs(dockerfile.read_text(encoding="utf-8")):
        info = docker.inspect_image(ref)
        lines.append(f"base {ref}: {'present' if info else 'absent (built or pulled by the run)'}")
    lines.append("BuildKit's cache: not cleared (shared engine); layers other runs built are "
                 "reused where their inputs match")
    return lines


def no_prune_matrix(matrix: Path, min_free_gib: float | None) -> Path:
    """A copy of `matrix` beside it (so images/ and locks/ resolve the same) whose build never
    prunes BuildKit's cache when short of disk (build.disk.prune_when_low: false): on an
    engine other jobs share, their cache is theirs. Removed by the caller."""
    import yaml

    data = yaml.safe_load(matrix.read_text(encoding="utf-8"))
    disk = data.setdefault("build", {}).setdefault("disk", {})
    disk["prune_when_low"] = False
    if min_free_gib is not None:
        disk["min_free_gib"] = min_free_gib
    copy = matrix.parent / f".bench-{os.getpid()}.{matrix.name}"
    copy.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return copy


def pipeline_argv(args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "infermatrix", "pipeline", "--matrix", args.matrix,
            "--state-dir", str(args.state_dir)]
    for cell_id in args.select:
        argv += ["--select", cell_id]
    if args.levels:
        argv += ["--levels", args.levels]
    if args.no_publish:
        argv.append("--no-publish")
    return argv


def note_cell(state: StatePaths, cell_id: str, marks: Marks, now: float) -> None:
    """Record the cell's events the journal shows by now (each once)."""
    record = journal.cell_record(state, cell_id)
    build = record.stage("build")
    if marks.serving_built is None and build and build.status == journal.Status.PASS:
        marks.serving_built = now
        print(f"[{clock(now)}] {cell_id}: serving image built", flush=True)
    tag = record.stage("tag")
    if marks.serving_verdict is None and tag and tag.status != journal.Status.RUNNING:
        marks.serving_verdict = now
        marks.verdict = f"{tag.status}" + (f": {tag.reason}" if tag.reason else "")
        print(f"[{clock(now)}] {cell_id}: serving verdict: {marks.verdict}", flush=True)
    if marks.serving_verdict is None and build and build.status == journal.Status.FAIL:
        marks.serving_verdict, marks.verdict = now, f"build failed: {build.reason}"
        print(f"[{clock(now)}] {cell_id}: {marks.verdict}", flush=True)
    trained = record.stage("train")
    if marks.train_done is None and trained and trained.status != journal.Status.RUNNING:
        marks.train_done, marks.train_status = now, str(trained.status)
        marks.train_kernels = {
            name: {k: entry.get(k) for k in ("duration_s", "max_jobs", "cache")}
            for name, entry in (trained.details.get("kernels") or {}).items()}
        print(f"[{clock(now)}] {cell_id}: training image: {trained.status}"
              f"{(': ' + trained.reason) if trained.reason else ''}", flush=True)


def watch(job: subprocess.Popen, state: StatePaths, cell_ids: list[str], until: str,
          started: float) -> Job:
    outcome = Job({cell_id: Marks() for cell_id in cell_ids})
    while True:
        now = time.monotonic() - started
        for cell_id, marks in outcome.marks.items():
            note_cell(state, cell_id, marks, now)
        if job.poll() is not None:
            outcome.exit_code = job.returncode
            return outcome
        if until == "servable" and all(m.serving_verdict is not None
                                       for m in outcome.marks.values()):
            print(f"[{clock(now)}] stopping the job before its training images (SIGINT)",
                  flush=True)
            os.killpg(job.pid, signal.SIGINT)
            outcome.interrupted = True
            outcome.exit_code = job.wait()
            return outcome
        time.sleep(POLL_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--select", required=True, metavar="CELL", action="append",
                        help="a cell of the run (repeat for several: one job builds them all)")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--matrix", default=str(ROOT / "matrix.yaml"))
    parser.add_argument("--levels", default="static")
    parser.add_argument("--no-publish", action="store_true")
    parser.add_argument("--until", choices=("servable", "train"), default="servable")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON")
    parser.add_argument("--cold", action="store_true",
                        help="INFERMATRIX_NO_CACHE=1: BuildKit reuses no layer (kernels too)")
    parser.add_argument("--no-prune", action="store_true",
                        help="run from a copy of the matrix with build.disk.prune_when_low: "
                        "false (a shared engine: never prune others' build cache)")
    parser.add_argument("--min-free-gib", type=float,
                        help="with --no-prune: build.disk.min_free_gib of that copy")
    args = parser.parse_args()
    warn_if_nice_is_weak()
    fresh_state(args.state_dir)
    copy = no_prune_matrix(Path(args.matrix), args.min_free_gib) if args.no_prune else None
    if copy is not None:
        args.matrix = str(copy)
    try:
        return run(args)
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    ctx = Context.load(args.matrix, args.state_dir)
    cells = ctx.specs(plan_cells(ctx, args.select, []))
    if sorted(c.id for c in cells) != sorted(args.select):
        raise SystemExit(f"--select {args.select} are not planned cells: "
                         f"{[c.id for c in cells]}")
    forecast = {c.cell_id: c for c in run_forecast(ctx, cells, RunOptions(), fresh=True).cells}
    print(f"host: {os.cpu_count()} CPU(s), "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB; "
          f"BuildKit cache: {'off (--cold)' if args.cold else 'as found'}")
    for cell_id in args.select:
        predicted = forecast[cell_id]
        for line in warm_lines(ctx, cell_id):
            print(f"warm ({cell_id}): {line}")
        print(f"forecast (fresh clone) {cell_id}: serving image {clock(predicted.servable_s)}, "
              f"training image "
              f"{clock(predicted.train_done_s) if predicted.train_done_s else '-'} "
              f"({predicted.kernels}; train: {predicted.train_kernels or '-'})")
    argv = pipeline_argv(args)
    env = dict(os.environ, **({"INFERMATRIX_NO_CACHE": "1"} if args.cold else {}))
    log_path = args.state_dir.parent / f"{args.state_dir.name}.pipeline.log"
    print(f"$ {'INFERMATRIX_NO_CACHE=1 ' if args.cold else ''}{shlex.join(argv)}  "
          f"(cwd {ROOT}; output: {log_path})", flush=True)
    started = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        job = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, env=env)
        try:
            outcome = watch(job, StatePaths(args.state_dir), args.select, args.until, started)
        except KeyboardInterrupt:
            os.killpg(job.pid, signal.SIGINT)
            job.wait()
            raise
    total = time.monotonic() - started
    print(f"{'cell':<40} {'figure':<24} {'forecast':>9} {'measured':>9} {'error':>7}")
    for cell_id, marks in outcome.marks.items():
        predicted = forecast[cell_id]
        for name, forecast_s, measured in (
                ("serving image built", predicted.servable_s, marks.serving_built),
                ("training image", predicted.train_done_s, marks.train_done)):
            print(f"{cell_id:<40} {name:<24} {clock(forecast_s) if forecast_s else '-':>9} "
                  f"{clock(measured) if measured else '-':>9} {error(forecast_s, measured):>7}")
        print(f"{cell_id}: serving verdict (audit + smoke {args.levels} + tag) at "
              f"{clock(marks.serving_verdict) if marks.serving_verdict else '-'}: "
              f"{marks.verdict}")
        for kernel, entry in (marks.train_kernels or {}).items():
            seconds = entry.get("duration_s")
            print(f"{cell_id}: training kernel {kernel}: "
                  f"{clock(seconds) if seconds else '-'} at MAX_JOBS={entry.get('max_jobs')} "
                  f"(cache: {entry.get('cache')})")
    print(f"job: exit {outcome.exit_code}"
          f"{' (interrupted by this bench)' if outcome.interrupted else ''} after {clock(total)}")
    if args.out:
        args.out.write_text(json.dumps({
            "cells": args.select, "command": argv, "cold": args.cold,
            "host_cpus": os.cpu_count(), "sched_autogroup": autogroup_enabled(),
            "forecast": {cell_id: {"serving_built_s": forecast[cell_id].servable_s,
                                   "train_done_s": forecast[cell_id].train_done_s}
                         for cell_id in args.select},
            "measured": {cell_id: asdict(m) for cell_id, m in outcome.marks.items()},
            "exit_code": outcome.exit_code, "interrupted": outcome.interrupted,
            "total_s": total,
            "warm": {cell_id: warm_lines(ctx, cell_id) for cell_id in args.select}},
            indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
