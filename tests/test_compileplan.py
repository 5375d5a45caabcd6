"""The compile planner: readings (cgroup v1/v2, MemAvailable, CPUs) -> MAX_JOBS/NVCC_THREADS."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infermatrix import compileplan as cp
from infermatrix.compileplan import GIB, HostReading

V1_UNLIMITED = 9223372036854771712


# ---- which memory figure wins -------------------------------------------------------------

def test_memavailable_alone():
    assert cp.effective_memory(HostReading(mem_available=24 * GIB)) == (24 * GIB, "MemAvailable")


def test_cgroup_v2_limit_below_memavailable_wins_minus_its_usage():
    reading = HostReading(mem_available=60 * GIB, cgroup_v2_max=16 * GIB,
                          cgroup_v2_current=4 * GIB)
    assert cp.effective_memory(reading) == (12 * GIB, "cgroup v2 memory.max")


def test_cgroup_v1_limit_wins_and_unlimited_is_ignored():
    limited = HostReading(mem_available=60 * GIB, cgroup_v1_limit=8 * GIB, cgroup_v1_usage=GIB)
    assert cp.effective_memory(limited) == (7 * GIB, "cgroup v1 memory.limit_in_bytes")
    unlimited = HostReading(mem_available=20 * GIB, cgroup_v1_limit=V1_UNLIMITED)
    assert cp.effective_memory(unlimited) == (20 * GIB, "MemAvailable")


def test_memavailable_below_the_cgroup_limit_wins():
    reading = HostReading(mem_available=3 * GIB, cgroup_v2_max=32 * GIB)
    assert cp.effective_memory(reading) == (3 * GIB, "MemAvailable")


def test_cpus_from_affinity_and_quota():
    assert cp.effective_cpus(HostReading(cpus_affinity=16)) == 16
    assert cp.effective_cpus(HostReading(cpus_affinity=16, cpu_quota=2.5)) == 3
    assert cp.effective_cpus(HostReading(cpus_affinity=2, cpu_quota=8)) == 2


# ---- the plan ------------------------------------------------------------------------------

def test_flash_attn_on_a_64_gb_box_with_many_cores():
    # 64 GB - 2 GB margin, 5 GB per nvcc thread, 4 threads: 20 GB per job -> 3 jobs.
    plan = cp.plan_compile(64 * GIB, 64, 5.0, safety_margin_gb=2, default_nvcc_threads=4)
    assert (plan.max_jobs, plan.nvcc_threads, plan.parallel_cells) == (3, 4, 1)
    assert plan.cell_budget_gb == 60 <= 62
    assert not plan.warnings


def test_jobs_capped_by_cpus():
    plan = cp.plan_compile(512 * GIB, 2, 0.5, safety_margin_gb=2, default_nvcc_threads=2)
    assert plan.max_jobs == 2 and plan.nvcc_threads == 2


def test_tight_memory_lowers_threads_then_jobs_to_one():
    plan = cp.plan_compile(9 * GIB, 32, 5.0, safety_margin_gb=2, default_nvcc_threads=4)
    assert (plan.max_jobs, plan.nvcc_threads) == (1, 1)
    assert plan.cell_budget_gb <= 7


def test_not_even_one_thread_fits_warns():
    plan = cp.plan_compile(4 * GIB, 8, 5.0, safety_margin_gb=2)
    assert (plan.max_jobs, plan.nvcc_threads) == (1, 1)
    assert plan.warnings and "OOM" in plan.warnings[0]


def test_parallel_cells_budgets_sum_under_the_limit():
    plan = cp.plan_compile(48 * GIB, 32, 5.0, safety_margin_gb=2, default_nvcc_threads=4,
                           max_parallel_cells=4, cells_to_compile=6)
    assert plan.parallel_cells == 4
    assert plan.total_budget_gb <= 46
    # Memory for only two cells at one thread each: the cap drops to 2.
    small = cp.plan_compile(13 * GIB, 32, 5.0, safety_margin_gb=2, max_parallel_cells=4,
                            cells_to_compile=6)
    assert small.parallel_cells == 2 and small.total_budget_gb <= 11


def test_parallel_cells_never_more_than_cells_compiling():
    plan = cp.plan_compile(256 * GIB, 64, 1.0, max_parallel_cells=8, cells_to_compile=3)
    assert plan.parallel_cells == 3


def test_overrides_are_kept_recorded_and_warned_when_too_big():
    plan = cp.plan_compile(16 * GIB, 16, 5.0, safety_margin_gb=2, max_jobs=8, nvcc_threads=4)
    assert (plan.max_jobs, plan.nvcc_threads) == (8, 4)
    assert plan.overrides == ["MAX_JOBS=8", "NVCC_THREADS=4"]
    assert plan.warnings
    assert plan.build_args() == {"MAX_JOBS": "8", "NVCC_THREADS": "4"}
    assert "overridden" in plan.describe()


def test_plan_is_serialisable_for_the_journal():
    import json

    plan = cp.plan_from_reading(HostReading(mem_available=24 * GIB, cpus_affinity=2), 0.5)
    data = json.loads(json.dumps(plan.as_dict()))
    assert data["memory_source"] == "MemAvailable" and data["cell_budget_gb"] > 0


def test_gb_per_thread_is_the_largest_of_the_kernels_compiled():
    kernels = {"flash-attn": {"gb_per_nvcc_thread": 5.0}, "flashinfer": {"gb_per_nvcc_thread": 4}}
    assert cp.gb_per_thread_for(kernels, ["flashinfer"]) == 4
    assert cp.gb_per_thread_for(kernels, ["flashinfer", "flash-attn"]) == 5
    assert cp.gb_per_thread_for(kernels, [], default=1.0) == 1.0


def test_bad_model_rejected():
    with pytest.raises(ValueError):
        cp.plan_compile(GIB, 1, 0)


# ---- parsing real files -----------------------------------------------------------------------

def test_parsers():
    assert cp.parse_meminfo("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2048 * 1024
    assert cp.parse_limit("max\n") is None
    assert cp.parse_limit(f"{V1_UNLIMITED}\n") is None
    assert cp.parse_limit("1073741824\n") == GIB
    assert cp.parse_cpu_max("200000 100000\n") == 2.0
    assert cp.parse_cpu_max("max 100000\n") is None
    assert cp.parse_cgroup_paths("4:memory:/lxc/101\n0::/user.slice\n") == \
        {"memory": "/lxc/101", "": "/user.slice"}


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_read_host_cgroup_v2_tree(tmp_path):
    _write(tmp_path, "proc/meminfo", "MemAvailable: 33554432 kB\n")  # 32 GiB
    _write(tmp_path, "proc/self/cgroup", "0::/lxc/101\n")
    _write(tmp_path, "sys/fs/cgroup/cgroup.controllers", "cpu memory\n")
    _write(tmp_path, "sys/fs/cgroup/lxc/memory.max", f"{12 * GIB}\n")  # parent limit
    _write(tmp_path, "sys/fs/cgroup/lxc/101/memory.max", "max\n")
    _write(tmp_path, "sys/fs/cgroup/lxc/101/memory.current", f"{2 * GIB}\n")
    _write(tmp_path, "sys/fs/cgroup/lxc/101/cpu.max", "400000 100000\n")
    reading = cp.read_host(tmp_path)
    assert reading.cgroup_v2_max == 12 * GIB and reading.cpu_quota == 4.0
    assert cp.effective_memory(reading) == (10 * GIB, "cgroup v2 memory.max")


def test_read_host_cgroup_v1_tree(tmp_path):
    _write(tmp_path, "proc/meminfo", "MemAvailable: 33554432 kB\n")
    _write(tmp_path, "proc/self/cgroup", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n")
    _write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", f"{V1_UNLIMITED}\n")
    _write(tmp_path, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", f"{6 * GIB}\n")
    _write(tmp_path, "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", f"{GIB}\n")
    _write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000\n")
    _write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    reading = cp.read_host(tmp_path)
    assert reading.cgroup_v1_limit == 6 * GIB and reading.cpu_quota == 1.5
    assert cp.effective_memory(reading) == (5 * GIB, "cgroup v1 memory.limit_in_bytes")


def test_read_host_of_this_machine_gives_a_usable_plan():
    """The reading of this machine agrees with what the test reads itself, and the plan made
    from it fits that machine (the budget under the memory left, no more jobs than CPUs)."""
    import os

    reading = cp.read_host()
    assert reading.cpus_affinity == len(os.sched_getaffinity(0))
    meminfo = Path("/proc/meminfo").read_text()
    own = int(re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.M).group(1)) * 1024
    assert abs(reading.mem_available - own) < 0.25 * own  # memory moves between two reads
    memory, source = cp.effective_memory(reading)
    assert 0 < memory <= reading.mem_available and source != "unknown"
    plan = cp.plan_from_reading(reading, 0.5)
    assert plan.memory_gb == memory / cp.GIB and plan.cpus == cp.effective_cpus(reading)
    assert plan.max_jobs <= plan.cpus and plan.nvcc_threads <= plan.cpus
    assert plan.total_budget_gb <= plan.memory_gb - plan.safety_margin_gb and not plan.warnings
