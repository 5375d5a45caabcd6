"""MAX_JOBS and NVCC_THREADS from the memory and CPUs really available.

Inside Docker or LXC, `free` can lie: the limit that kills a build is the cgroup's. So the
memory figure is the smallest of the cgroup v2 `memory.max` (minus what the group uses), the
cgroup v1 `memory.limit_in_bytes` (likewise) and /proc/meminfo MemAvailable; the CPUs are the
smaller of the affinity mask and the cgroup CPU quota. Each kernel package declares its memory
per nvcc thread (matrix.yaml `build.kernels.<name>.gb_per_nvcc_thread`; flash-attn ~5 GB), and
`build.safety_margin_gb` is kept free. One nvcc job with T threads needs T x gb; MAX_JOBS jobs
need MAX_JOBS x T x gb; cells compiling at once share the memory, so their count is capped
until their budgets sum under the limit.

The planning functions are pure (readings in, plan out); `read_host()` takes the readings.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

GIB = 1024 ** 3
# cgroup v1 reports "no limit" as a huge page-rounded number (9223372036854771712).
UNLIMITED_THRESHOLD = 1 << 60


# --------------------------------------------------------------------------------------------
# Readings
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostReading:
    """Raw figures about the host, in bytes and CPUs; None when not available."""

    mem_available: int | None = None  # /proc/meminfo MemAvailable
    cgroup_v2_max: int | None = None  # memory.max (None: "max" or no v2)
    cgroup_v2_current: int | None = None  # memory.current
    cgroup_v1_limit: int | None = None  # memory.limit_in_bytes (None: unlimited or no v1)
    cgroup_v1_usage: int | None = None  # memory.usage_in_bytes
    cpus_affinity: int = 1  # len(sched_getaffinity)
    cpu_quota: float | None = None  # quota / period (None: no quota)


def effective_memory(reading: HostReading) -> tuple[int, str]:
    """(bytes, where the figure comes from): the smallest of the readings wins."""
    candidates: list[tuple[int, str]] = []
    if reading.mem_available is not None:
        candidates.append((reading.mem_available, "MemAvailable"))
    if reading.cgroup_v2_max is not None and reading.cgroup_v2_max < UNLIMITED_THRESHOLD:
        free = reading.cgroup_v2_max - (reading.cgroup_v2_current or 0)
        candidates.append((max(free, 0), "cgroup v2 memory.max"))
    if reading.cgroup_v1_limit is not None and reading.cgroup_v1_limit < UNLIMITED_THRESHOLD:
        free = reading.cgroup_v1_limit - (reading.cgroup_v1_usage or 0)
        candidates.append((max(free, 0), "cgroup v1 memory.limit_in_bytes"))
    if not candidates:
        return 0, "unknown"
    return min(candidates, key=lambda c: c[0])


def effective_cpus(reading: HostReading) -> int:
    cpus = max(reading.cpus_affinity, 1)
    if reading.cpu_quota is not None and reading.cpu_quota > 0:
        cpus = min(cpus, max(1, math.ceil(reading.cpu_quota)))
    return cpus


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------

@dataclass
class CompilePlan:
    max_jobs: int
    nvcc_threads: int
    parallel_cells: int  # cells that may compile at once
    memory_gb: float  # memory really available
    memory_source: str
    cpus: int
    gb_per_nvcc_thread: float
    safety_margin_gb: float
    overrides: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def cell_budget_gb(self) -> float:
        """Peak memory one compiling cell may use under this plan."""
        return self.max_jobs * self.nvcc_threads * self.gb_per_nvcc_thread

    @property
    def total_budget_gb(self) -> float:
        return self.cell_budget_gb * self.parallel_cells

    def build_args(self) -> dict[str, str]:
        return {"MAX_JOBS": str(self.max_jobs), "NVCC_THREADS": str(self.nvcc_threads)}

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(cell_budget_gb=round(self.cell_budget_gb, 2),
                    total_budget_gb=round(self.total_budget_gb, 2),
                    memory_gb=round(self.memory_gb, 2))
        return data

    def describe(self) -> str:
        text = (f"compile plan: MAX_JOBS={self.max_jobs} NVCC_THREADS={self.nvcc_threads}, "
                f"{self.parallel_cells} cell(s) compiling at once; "
                f"{self.memory_gb:.1f} GB available ({self.memory_source}), {self.cpus} CPU(s), "
                f"{self.gb_per_nvcc_thread:g} GB per nvcc thread, margin "
                f"{self.safety_margin_gb:g} GB -> {self.cell_budget_gb:.1f} GB per cell")
        if self.overrides:
            text += f" (overridden: {', '.join(self.overrides)})"
        for warning in self.warnings:
            text += f"\n  warning: {warning}"
        return text


def plan_compile(memory_bytes: int, cpus: int, gb_per_nvcc_thread: float, *,
                 safety_margin_gb: float = 2.0, default_nvcc_threads: int = 4,
                 max_parallel_cells: int = 1, cells_to_compile: int = 1,
                 max_jobs: int | None = None, nvcc_threads: int | None = None,
                 memory_source: str = "given") -> CompilePlan:
    """Size the compile so that every compiling cell's budget sums under the memory left.

    `max_jobs` / `nvcc_threads` override the computed figures (recorded as overrides, with a
    warning when the result no longer fits).
    """
    if gb_per_nvcc_thread <= 0:
        raise ValueError("gb_per_nvcc_thread must be positive")
    cpus = max(cpus, 1)
    memory_gb = memory_bytes / GIB
    usable_gb = max(memory_gb - safety_margin_gb, 0.0)
    warnings: list[str] = []
    overrides = [f"{name}={value}" for name, value in
                 (("MAX_JOBS", max_jobs), ("NVCC_THREADS", nvcc_threads)) if value is not None]

    one_thread_fits = max(int(usable_gb // gb_per_nvcc_thread), 0)
    parallel = max(1, min(max_parallel_cells, max(cells_to_compile, 1), one_thread_fits or 1,
                          cpus))
    per_cell_gb = usable_gb / parallel
    per_cell_cpus = max(1, cpus // parallel)

    threads = nvcc_threads or max(1, min(default_nvcc_threads, per_cell_cpus,
                                         int(per_cell_gb // gb_per_nvcc_thread) or 1))
    jobs = max_jobs or max(1, min(per_cell_cpus,
                                  int(per_cell_gb // (threads * gb_per_nvcc_thread)) or 1))
    plan = CompilePlan(max_jobs=jobs, nvcc_threads=threads, parallel_cells=parallel,
                       memory_gb=memory_gb, memory_source=memory_source, cpus=cpus,
                       gb_per_nvcc_thread=gb_per_nvcc_thread, safety_margin_gb=safety_margin_gb,
                       overrides=overrides, warnings=warnings)
    if plan.total_budget_gb > usable_gb:
        warnings.append(f"the budget ({plan.total_budget_gb:.1f} GB) exceeds the memory left "
                        f"after the margin ({usable_gb:.1f} GB): the compile may be OOM-killed")
    return plan


def plan_from_reading(reading: HostReading, gb_per_nvcc_thread: float, **options: Any
                      ) -> CompilePlan:
    memory, source = effective_memory(reading)
    return plan_compile(memory, effective_cpus(reading), gb_per_nvcc_thread,
                        memory_source=source, **options)


def gb_per_thread_for(kernels: dict[str, dict[str, Any]], names: Iterable[str],
                      default: float = 1.0) -> float:
    """The largest per-thread figure among the kernel packages compiled."""
    figures = [float(kernels[n]["gb_per_nvcc_thread"]) for n in names if n in kernels]
    return max(figures, default=default)


# --------------------------------------------------------------------------------------------
# Reading the real host
# --------------------------------------------------------------------------------------------

def parse_meminfo(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def parse_limit(text: str) -> int | None:
    """A cgroup memory figure: bytes, or None for `max` / an unlimited value."""
    value = text.strip()
    if not value or value == "max":
        return None
    number = int(value)
    return None if number >= UNLIMITED_THRESHOLD else number


def parse_cgroup_paths(text: str) -> dict[str, str]:
    """/proc/self/cgroup -> {controller: path}; the v2 hierarchy is under key ''."""
    paths = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 cpu.max `quota period` -> CPUs (None for `max`)."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100000
    return int(parts[0]) / period


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _tightest(mount: Path, group_path: str, name: str) -> Path | None:
    """The file `name` of the group or its nearest ancestor that has it (namespaced or not)."""
    relative = Path(group_path.lstrip("/"))
    for candidate in [relative, *relative.parents]:
        path = mount / candidate / name
        if path.is_file():
            return path
    return None


def _min_over_ancestors(mount: Path, group_path: str, name: str) -> int | None:
    """A hierarchical limit: the smallest along the path from the group to the root."""
    relative = Path(group_path.lstrip("/"))
    limits = []
    for candidate in [relative, *relative.parents]:
        text = _read(mount / candidate / name)
        value = parse_limit(text) if text is not None else None
        if value is not None:
            limits.append(value)
    return min(limits) if limits else None


def read_host(root: Path = Path("/")) -> HostReading:
    """Take the readings of this machine (`root` lets tests point at a copy of /proc and /sys)."""
    meminfo = _read(root / "proc/meminfo")
    groups = parse_cgroup_paths(_read(root / "proc/self/cgroup") or "")
    sys_cgroup = root / "sys/fs/cgroup"
    reading: dict[str, Any] = {"mem_available": parse_meminfo(meminfo) if meminfo else None}
    if (sys_cgroup / "cgroup.controllers").is_file():  # unified (v2) hierarchy
        path = groups.get("", "/")
        reading["cgroup_v2_max"] = _min_over_ancestors(sys_cgroup, path, "memory.max")
        current = _tightest(sys_cgroup, path, "memory.current")
        reading["cgroup_v2_current"] = parse_limit(_read(current) or "") if current else None
        cpu_max = _tightest(sys_cgroup, path, "cpu.max")
        reading["cpu_quota"] = parse_cpu_max(_read(cpu_max) or "") if cpu_max else None
    else:
        mem_path = groups.get("memory", "/")
        mount = sys_cgroup / "memory"
        reading["cgroup_v1_limit"] = _min_over_ancestors(mount, mem_path, "memory.limit_in_bytes")
        usage = _tightest(mount, mem_path, "memory.usage_in_bytes")
        if reading["cgroup_v1_limit"] is not None and usage:
            reading["cgroup_v1_usage"] = parse_limit(_read(usage) or "")
        cpu_mount = next((sys_cgroup / n for n in ("cpu,cpuacct", "cpu") if (sys_cgroup / n).is_dir()),
                         sys_cgroup / "cpu")
        cpu_path = groups.get("cpu", "/")
        quota_file = _tightest(cpu_mount, cpu_path, "cpu.cfs_quota_us")
        period_file = _tightest(cpu_mount, cpu_path, "cpu.cfs_period_us")
        quota = int((_read(quota_file) or "-1").strip()) if quota_file else -1
        period = int((_read(period_file) or "100000").strip()) if period_file else 100000
        reading["cpu_quota"] = quota / period if quota > 0 and period > 0 else None
    try:
        reading["cpus_affinity"] = len(os.sched_getaffinity(0)) if root == Path("/") \
            else os.cpu_count() or 1
    except AttributeError:
        reading["cpus_affinity"] = os.cpu_count() or 1
    return HostReading(**reading)
