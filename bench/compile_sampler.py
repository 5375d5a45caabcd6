"""Run a compile and sample the memory of every compiler process and of the whole build.

    python3 bench/compile_sampler.py --out RESULT.json [--interval 0.25] -- COMMAND...

Stdlib only (it runs on hosts where nothing can be installed). Every `interval` seconds it reads
/proc: each process whose command is a compiler (nvcc, cicc, ptxas, cc1plus, ...) is attributed
to its nearest `nvcc` ancestor, one compile job, named by the translation unit (`.cu`) on that
nvcc's command line. A job's memory at a sample is the RSS summed over the nvcc and all its
descendants; its peak is the largest such sum. The whole build's figure is the RSS summed over
every descendant of COMMAND, and the host's used memory (MemTotal - MemAvailable) beside it.
When the host has cgroup v2 and we may create a group, the command runs in its own group and
`memory.peak` is recorded as well (the kernel's own peak, which a sampler cannot miss).

RSS counts shared pages once per process, so the sums lean high: the safe side for a model of
how much memory a compile needs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
COMPILERS = {"nvcc", "cicc", "ptxas", "cc1plus", "cudafe++", "fatbinary", "nvlink", "gcc",
             "g++", "c++", "x86_64-linux-gnu-g++", "as", "ld", "collect2", "nvptxas"}
CGROUP_ROOT = Path("/sys/fs/cgroup")


def read_processes() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, comm, rss bytes) for every live process."""
    procs: dict[int, tuple[int, str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            statm = Path(f"/proc/{pid}/statm").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        procs[pid] = (ppid, comm, int(statm.split()[1]) * PAGE)
    return procs


def translation_unit(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    for arg in argv:
        text = arg.decode(errors="replace")
        if text.endswith((".cu", ".cpp", ".cc")):
            return text.rsplit("/", 1)[-1]
    return "?"


def used_memory() -> int:
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


def make_cgroup(name: str) -> Path | None:
    """A fresh cgroup v2 group for the build, or None where that is not possible."""
    if not (CGROUP_ROOT / "cgroup.controllers").is_file():
        return None
    group = CGROUP_ROOT / name
    try:
        group.mkdir(exist_ok=True)
        return group if (group / "memory.peak").exists() or (group / "memory.current").exists() \
            else None
    except OSError:
        return None


class Sampler:
    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.jobs: dict[int, dict[str, Any]] = {}  # nvcc pid -> record
        self.build_peak = 0
        self.host_peak = 0
        self.samples = 0
        self.host_base = used_memory()

    def descendants(self, procs: dict[int, tuple[int, str, int]]) -> set[int]:
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        seen, todo = set(), [self.root_pid]
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo.extend(children.get(pid, []))
        return seen

    def job_of(self, pid: int, procs: dict[int, tuple[int, str, int]]) -> int | None:
        while pid in procs and pid > 1:
            if procs[pid][1] == "nvcc":
                return pid
            pid = procs[pid][0]
        return None

    def sample(self, now: float) -> None:
        procs = read_processes()
        tree = self.descendants(procs)
        self.build_peak = max(self.build_peak, sum(procs[p][2] for p in tree if p in procs))
        self.host_peak = max(self.host_peak, used_memory())
        per_job: dict[int, dict[str, int]] = {}
        for pid in tree:
            if pid not in procs or procs[pid][1] not in COMPILERS:
                continue
            job = self.job_of(pid, procs)
            if job is None:
                continue
            parts = per_job.setdefault(job, {})
            parts[procs[pid][1]] = parts.get(procs[pid][1], 0) + procs[pid][2]
        for job, parts in per_job.items():
            record = self.jobs.get(job)
            if record is None:
                record = self.jobs[job] = {"tu": translation_unit(job), "start": now,
                                           "peak": 0, "peak_parts": {}, "by_tool": {}}
            total = sum(parts.values())
            record["end"] = now
            if total > record["peak"]:
                record["peak"], record["peak_parts"] = total, dict(parts)
            for tool, rss in parts.items():
                record["by_tool"][tool] = max(record["by_tool"].get(tool, 0), rss)
        self.samples += 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summarise(sampler: Sampler, wall: float, code: int, cgroup_peak: int | None,
              command: list[str], interval: float) -> dict[str, Any]:
    gib = 1024 ** 3
    jobs = sorted(sampler.jobs.values(), key=lambda r: r["peak"], reverse=True)
    peaks = [j["peak"] / gib for j in jobs]
    return {
        "command": command, "exit_code": code, "wall_s": round(wall, 1),
        "interval_s": interval, "samples": sampler.samples, "jobs": len(jobs),
        "job_peak_max_gib": round(max(peaks, default=0), 3),
        "job_peak_p90_gib": round(percentile(peaks, 0.9), 3),
        "job_peak_p50_gib": round(percentile(peaks, 0.5), 3),
        "build_rss_peak_gib": round(sampler.build_peak / gib, 3),
        "host_used_peak_gib": round(sampler.host_peak / gib, 3),
        "host_used_base_gib": round(sampler.host_base / gib, 3),
        "cgroup_peak_gib": round(cgroup_peak / gib, 3) if cgroup_peak else None,
        "top_jobs": [{"tu": j["tu"], "peak_gib": round(j["peak"] / gib, 3),
                      "seconds": round(j["end"] - j["start"], 1),
                      "by_tool_gib": {k: round(v / gib, 3) for k, v in j["by_tool"].items()}}
                     for j in jobs[:12]],
        "all_jobs": [{"tu": j["tu"], "peak_gib": round(j["peak"] / gib, 3),
                      "seconds": round(j["end"] - j["start"], 1)} for j in jobs],
    }


def run(command: list[str], interval: float, cgroup_name: str) -> tuple[Sampler, float, int,
                                                                        int | None]:
    group = make_cgroup(cgroup_name)
    def enter_group() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
    started = time.monotonic()
    child = subprocess.Popen(command, preexec_fn=enter_group)
    sampler = Sampler(child.pid)
    try:
        while child.poll() is None:
            sampler.sample(time.monotonic() - started)
            time.sleep(interval)
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        child.wait()
    wall = time.monotonic() - started
    peak = None
    if group is not None:
        text = (group / "memory.peak").read_text().strip() if (group / "memory.peak").exists() \
            else ""
        peak = int(text) if text.isdigit() else None
    return sampler, wall, child.returncode, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--cgroup", default=f"im16-build-{os.getpid()}")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    sampler, wall, code, peak = run(command, args.interval, args.cgroup)
    result = summarise(sampler, wall, code, peak, command, args.interval)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("all_jobs", "top_jobs")}),
          flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
