"""Compile a cell's flash-attn natively (no Docker, no main job) with the cell's own pins and flags.

    python3 bench/flash_attn_native.py --cell cu130-torch2.14.0-vllm0.33.0-sm120 \
        --work /work/runs/fa-native --jobs 2 [--job-seconds 5403]

The figure issue 47 compares the main job's flash-attn compile against ("at most 1.1x the
native two-job figure"). Everything the compile depends on is read from the cell's rendered
files under images/, so the native build is the same build as the job's `compile-flash-attn`
stage: the sdist pin and hash and the CUDA toolkit wheels from its Dockerfile, torch from its
torch.lock.txt, and its `measure` script for wall time and peak RSS. Set-up (venv, toolkit,
torch, sdist) is timed apart from the compile. While the compile runs, the host's load
average and the CPU time of processes outside the compile are sampled every 30 s, so the
figure says how quiet the machine was. Prints one JSON line; --job-seconds adds the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from hostload import warn_if_nice_is_weak

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str], *, env: dict[str, str] | None = None, log: Path | None = None) -> None:
    print("+", shlex.join(cmd), flush=True)
    if log is None:
        subprocess.run(cmd, check=True, env=env)
        return
    with log.open("a") as out:
        subprocess.run(cmd, check=True, env=env, stdout=out, stderr=subprocess.STDOUT)


def dockerfile_pins(dockerfile: Path) -> tuple[str, str]:
    """(flash-attn requirement line with its hash, the CUDA toolkit requirement) from the stage."""
    text = dockerfile.read_text()
    sdist = re.search(r'echo "(flash-attn==\S+ --hash=sha256:[0-9a-f]+)"', text)
    toolkit = re.search(r'"(cuda-toolkit\[[^\]]+\]==[\d.]+)"', text)
    if not sdist or not toolkit:
        sys.exit(f"{dockerfile}: no flash-attn compile stage with a hashed sdist and a toolkit pin")
    return sdist.group(1), toolkit.group(1)


def set_up(cell_dir: Path, work: Path, log: Path) -> dict[str, str]:
    """The venv, toolkit, torch and unpacked source; returns the compile's environment."""
    sdist_line, toolkit = dockerfile_pins(cell_dir / "Dockerfile")
    venv, toolkit_dir, src = work / "venv", work / "cuda-toolkit", work / "src"
    uv_env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(venv)}
    run(["uv", "venv", "--python", "3.11", str(venv)], env=uv_env, log=log)
    run(["uv", "pip", "install", "--target", str(toolkit_dir), toolkit], env=uv_env, log=log)
    cuda_home = toolkit_dir / "nvidia" / "cu13"
    for link, target in ((cuda_home / "lib64", "lib"), (cuda_home / "lib" / "libcudart.so", "libcudart.so.13")):
        if not link.is_symlink():
            link.symlink_to(target)
    run(["uv", "pip", "install", "--require-hashes", "--no-deps", "-r", str(cell_dir / "torch.lock.txt")],
        env=uv_env, log=log)
    tools = ["pip==26.3", "setuptools==80.9.0", "wheel==0.45.1", "ninja==1.13.0", "packaging==25.0",
             "psutil==7.0.0", "einops==0.8.1"]
    run(["uv", "pip", "install", *tools], env=uv_env, log=log)
    (work / "sdist.txt").write_text(sdist_line + "\n")
    run([str(venv / "bin" / "pip"), "download", "--no-deps", "--no-build-isolation", "--no-binary",
         "flash-attn", "--require-hashes", "-d", str(work / "sdist"), "-r", str(work / "sdist.txt")], log=log)
    src.mkdir(exist_ok=True)
    tarball = next((work / "sdist").glob("*.tar.gz"))
    run(["tar", "-xzf", str(tarball), "--strip-components=1", "-C", str(src)], log=log)
    setup_py = src / "setup.py"
    setup_py.write_text(setup_py.read_text().replace("-std=c++17", "-std=c++20"))
    site = next((venv / "lib").glob("python3.*/site-packages"))
    return {**os.environ, "VIRTUAL_ENV": str(venv), "CUDA_HOME": str(cuda_home),
            "PATH": f"{venv / 'bin'}:{os.environ['PATH']}:{cuda_home / 'bin'}",
            "CPATH": str(site / "nvidia" / "cu13" / "include"), "TORCH_CUDA_ARCH_LIST": "12.0",
            "FLASH_ATTN_CUDA_ARCHS": "120", "FLASH_ATTENTION_FORCE_BUILD": "TRUE"}


def cpu_seconds_outside(pgid: int) -> float:
    """CPU seconds (user+system) of every process not in the compile's process group."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) != pgid:  # fields[2] is pgrp (field 5 of stat)
            total += int(fields[11]) + int(fields[12])
    return total / tick


def sample_load(pgid: int, stop: threading.Event, samples: list[dict[str, float]]) -> None:
    last_t, last_cpu = time.monotonic(), cpu_seconds_outside(pgid)
    while not stop.wait(30):
        now, cpu = time.monotonic(), cpu_seconds_outside(pgid)
        samples.append({"load1": os.getloadavg()[0], "other_cpus": max(0.0, (cpu - last_cpu) / (now - last_t))})
        last_t, last_cpu = now, cpu


def compile_natively(cell_dir: Path, work: Path, env: dict[str, str], jobs: int, threads: int,
                     log: Path) -> tuple[dict[str, object], list[dict[str, float]]]:
    env = {**env, "MAX_JOBS": str(jobs), "NVCC_THREADS": str(threads)}
    cmd = ["bash", str(cell_dir / "measure"), "flash-attn", str(work / "wheels"), "--",
           "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-cache-dir",
           "--wheel-dir", str(work / "wheels"), str(work / "src")]
    print("+", " ".join(f"{k}={shlex.quote(env[k])}" for k in ("MAX_JOBS", "NVCC_THREADS", "CUDA_HOME")),
          shlex.join(cmd), flush=True)
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = threading.Thread(target=sample_load, args=(proc.pid, stop, samples), daemon=True)
        sampler.start()
        code = proc.wait()
    stop.set()
    stats = json.loads((work / "wheels" / "flash-attn.build-stats.json").read_text())
    if code != 0:
        sys.exit(f"compile failed (exit {code}); log: {log}")
    return stats, samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", required=True, help="a rendered cell under images/")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--nvcc-threads", type=int, default=1)
    parser.add_argument("--job-seconds", type=float, help="the main job's figure, for the ratio")
    args = parser.parse_args(argv)
    cell_dir = ROOT / "images" / args.cell
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "native.log"
    autogroup = warn_if_nice_is_weak()
    started = time.monotonic()
    env = set_up(cell_dir, args.work, log)
    setup_s = time.monotonic() - started
    stats, samples = compile_natively(cell_dir, args.work, env, args.jobs, args.nvcc_threads, log)
    mean = (lambda key: round(sum(s[key] for s in samples) / len(samples), 2)) if samples else (lambda key: None)
    result = {"cell": args.cell, "setup_s": round(setup_s, 1), "compile_s": stats["seconds"],
              "peak_rss_gib": round(stats["peak_rss_bytes"] / 2**30, 1), "max_jobs": args.jobs,
              "nvcc_threads": args.nvcc_threads, "cpus": os.cpu_count(),
              "mean_load1": mean("load1"), "mean_other_cpus": mean("other_cpus"),
              "max_other_cpus": max((s["other_cpus"] for s in samples), default=None),
              "sched_autogroup": autogroup}
    if args.job_seconds:
        result["job_over_native"] = round(args.job_seconds / stats["seconds"], 3)
    (args.work / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
