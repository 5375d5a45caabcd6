"""The compile planner: readings (cgroup v1/v2, MemAvailable, CPUs) -> MAX_JOBS/NVCC_THREADS."""

from __future__ import annotations

from tests.paths import TESTS

import re
from pathlib import Path

import pytest

from infermatrix.options import RunOptions
from infermatrix.model import compileplan as cp
from infermatrix.model.compileplan import GIB, HostReading

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

def test_one_target_means_one_nvcc_thread_and_the_memory_goes_to_max_jobs():
    # The case: a 16-CPU, 125 GB host. The old model planned 6 x 4; per job, one
    # target, the CPUs are the limit.
    plan = cp.plan_compile(125 * GIB, 16, 6.6, safety_margin_gb=2)
    assert (plan.max_jobs, plan.nvcc_threads, plan.parallel_cells) == (16, 1, 1)
    assert plan.total_budget_gb == pytest.approx(16 * 6.6) and not plan.warnings


def test_threads_follow_the_targets_and_jobs_share_the_cpus():
    plan = cp.plan_compile(512 * GIB, 64, 5.0, targets=4, safety_margin_gb=2)
    assert plan.nvcc_threads == 4 and plan.targets_in_flight == 4
    assert plan.job_gib == 20 and plan.max_jobs == 16  # 64 CPUs / 4 targets in flight
    more_threads_than_targets = cp.plan_compile(512 * GIB, 64, 5.0, nvcc_threads=4)
    assert more_threads_than_targets.job_gib == 5.0  # idle threads take no memory


def test_memory_caps_jobs():
    plan = cp.plan_compile(64 * GIB, 64, 6.6, safety_margin_gb=2)
    assert plan.max_jobs == 9 and plan.total_budget_gb <= 62  # 62 // 6.6


def test_not_even_one_job_fits_warns_with_the_expected_peak():
    plan = cp.plan_compile(4 * GIB, 8, 5.0, safety_margin_gb=2)
    assert (plan.max_jobs, plan.nvcc_threads) == (1, 1)
    assert plan.warnings and "expected peak 5.0 GiB" in plan.warnings[0]
    assert "OOM" in plan.warnings[0]


def test_parallel_cells_budgets_sum_under_the_limit():
    plan = cp.plan_compile(48 * GIB, 32, 5.0, safety_margin_gb=2, max_parallel_cells=4,
                           cells_to_compile=6)
    assert plan.parallel_cells == 4 and plan.total_budget_gb <= 46
    small = cp.plan_compile(13 * GIB, 32, 5.0, safety_margin_gb=2, max_parallel_cells=4,
                            cells_to_compile=6)
    assert small.parallel_cells == 2 and small.total_budget_gb <= 11


def test_parallel_cells_never_more_than_cells_compiling():
    plan = cp.plan_compile(256 * GIB, 64, 1.0, max_parallel_cells=8, cells_to_compile=3)
    assert plan.parallel_cells == 3


def test_overrides_are_accepted_recorded_and_warned_with_the_expected_peak():
    plan = cp.plan_compile(16 * GIB, 16, 5.0, safety_margin_gb=2, max_jobs=8, nvcc_threads=4)
    assert (plan.max_jobs, plan.nvcc_threads) == (8, 4)
    assert plan.overrides == ["MAX_JOBS=8", "NVCC_THREADS=4"]
    assert plan.warnings and "expected peak 40.0 GiB exceeds the budget of 14.0 GiB" \
        in plan.warnings[0]
    assert plan.build_args() == {"MAX_JOBS": "8", "NVCC_THREADS": "4"}
    assert "overridden" in plan.describe()
    fits = cp.plan_compile(64 * GIB, 16, 5.0, max_jobs=4)
    assert fits.overrides == ["MAX_JOBS=4"] and not fits.warnings


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4"])
def test_overrides_must_be_positive_integers(bad):
    with pytest.raises(ValueError, match="positive integer"):
        cp.plan_compile(16 * GIB, 16, 5.0, max_jobs=bad)
    with pytest.raises(ValueError, match="positive integer"):
        cp.plan_compile(16 * GIB, 16, 5.0, nvcc_threads=bad)


def test_plan_is_serialisable_for_the_journal():
    import json

    plan = cp.plan_from_reading(HostReading(mem_available=24 * GIB, cpus_affinity=2),
                                [cp.Need("cudakern", "0.1.0", "13.0")])
    data = json.loads(json.dumps(plan.as_dict()))
    assert data["memory_source"] == "MemAvailable" and data["cell_budget_gb"] > 0
    assert data["figures"][0]["origin"] == "measured"


def test_bad_model_rejected():
    with pytest.raises(ValueError):
        cp.plan_compile(GIB, 1, 0)


def test_parse_size():
    assert cp.parse_size("512G") == 512 * GIB == cp.parse_size("512GiB") == cp.parse_size("512")
    assert cp.parse_size("1.5T") == int(1.5 * 1024 * GIB) and cp.parse_size("2048m") == 2 * GIB
    for bad in ("lots", "-4G", "0"):
        with pytest.raises(ValueError):
            cp.parse_size(bad)


# ---- the memory model: data, then what builds recorded -------------------------------------

def test_model_data_cites_where_and_when_each_measurement_was_made():
    model = cp.load_model()
    for name, package in model["packages"].items():
        assert package["default"]["source"], name
        for entry in package["measured"]:
            assert entry["when"] and entry["host"] and entry["job_peak_max_gib"] > 0, name
    flash = model["packages"]["flash-attn"]["measured"][0]
    assert (flash["version"], flash["cuda"], flash["targets"]) == ("2.8.3", "13.0", 1)


def test_figure_precedence_measured_then_other_version_then_default():
    model = cp.load_model()
    exact = cp.job_figure(cp.Need("flash-attn", "2.8.3", "13.0"), model)
    assert exact.origin == "measured"
    assert exact.gib_per_target == pytest.approx(6.598 * model["margin"], abs=1e-3)
    other = cp.job_figure(cp.Need("flash-attn", "2.8.3", "12.8"), model)
    assert other.origin == "measured-other" and "not 2.8.3 CUDA 12.8" in other.source
    nearest = cp.job_figure(cp.Need("flashinfer-python", "0.6.8", "13.0"), model)
    assert nearest.origin == "measured-other"
    assert nearest.gib_per_target == pytest.approx(1.664 * model["margin"], abs=1e-3)
    import copy

    bare = copy.deepcopy(model)
    bare["packages"]["flashinfer-python"]["measured"] = []
    unmeasured = cp.job_figure(cp.Need("flashinfer-python", "0.6.8", "13.0"), bare)
    assert unmeasured.origin == "default" and "unmeasured" in unmeasured.source
    legacy = cp.job_figure(cp.Need("newkern", "1", "13.0", legacy_gb=3.0), model)
    assert (legacy.origin, legacy.gib_per_target) == ("default", 3.0)


def test_a_recorded_build_of_the_same_key_wins_with_margin(tmp_path):
    history = cp.history_path(tmp_path)
    need = cp.Need("flash-attn", "2.8.3", "13.0.2", 1)
    cp.record_build(cp.history_path(tmp_path), cp.Need("flash-attn", "2.8.3", "12.8", 1),
                    {"job_peak_max_gib": 9.0}, key="other-cuda")
    cp.record_build(history, need, {"job_peak_max_gib": 3.0, "wall_s": 100}, key="k1")
    with history.open("a") as handle:
        handle.write('{"torn')  # a crash mid-write: ignored
    figure = cp.job_figure(need, history=cp.read_history(history))
    assert figure.origin == "recorded" and "k1" in figure.source
    assert figure.gib_per_target == pytest.approx(3.0 * cp.load_model()["margin"], abs=1e-3)
    plan = cp.plan_for_needs(64 * GIB, 64, [need], history=cp.read_history(history))
    assert plan.max_jobs == int(62 // figure.gib_per_target)
    assert "[recorded]" in plan.explain()


def test_seeds_128_cpu_box_plan_for_a_host_we_are_not_on():
    """The seeds' box: 128 CPUs. One flash-attn cell for sm_120 on CUDA 13."""
    need = cp.Need("flash-attn", "2.8.3", "13.0", 1)
    plan = cp.plan_for_needs(512 * GIB, 128, [need], memory_source="--memory")
    assert plan.nvcc_threads == 1 and plan.max_jobs == int(510 // plan.job_gib) == 67
    assert plan.total_budget_gb <= 510 and not plan.warnings
    tight = cp.plan_for_needs(128 * GIB, 128, [need])
    assert tight.max_jobs == 16 and tight.total_budget_gb <= 126  # far below 128 jobs


# ---- the sampler, on a real nvcc compile of the CI fixture kernel ------------------------------

def _nvcc() -> str | None:
    from tests.support.cuda_tools import NVCC

    return NVCC


def test_sampler_measures_a_real_compile_and_the_next_plan_uses_it(tmp_path):
    import subprocess

    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    source = TESTS / "fixtures" / "cudakern" / "src" / "saxpy.cu"
    import os

    with cp.JobSampler(interval=0.1, root_pid=os.getpid()) as sampler:
        subprocess.run([nvcc, "-O2", "--threads", "1", "-gencode",
                        "arch=compute_120,code=sm_120", "-c", str(source), "-o",
                        str(tmp_path / "saxpy.o")], check=True)
    stats = sampler.stats()
    assert stats["job_peak_max_gib"] > 0.01 and stats["heaviest_tu"] == "saxpy.cu"
    need = cp.Need("cudakern", "src-test", "13.0", 1)
    before = cp.job_figure(need)
    cp.record_build(cp.history_path(tmp_path), need, stats, key="cudakern-test")
    after = cp.job_figure(need, history=cp.read_history(cp.history_path(tmp_path)))
    assert before.origin == "measured-other" and after.origin == "recorded"
    assert after.gib_per_target == pytest.approx(stats["job_peak_max_gib"] * 1.15, abs=1e-3)


def test_measure_wrapper_is_recognised_run_directly_or_through_its_shell():
    assert cp.is_measure_wrapper(["/bin/sh", "/usr/local/bin/measure", "flashinfer", "/wheels",
                                  "--"], "flashinfer")
    assert cp.is_measure_wrapper(["measure", "flash-attn", "/wheels", "--"], "flash-attn")
    assert not cp.is_measure_wrapper(["/bin/sh", "/usr/local/bin/measure", "flash-attn"],
                                     "flashinfer")
    assert not cp.is_measure_wrapper(["python3", "setup.py", "measure", "flashinfer"],
                                     "flashinfer")


def test_a_scoped_sampler_counts_only_its_kernels_jobs_while_another_compiles(tmp_path):
    """Two real process trees, as two cells compiling different kernels at once build them:
    `sh measure NAME OUT -- nvcc` where the `nvcc` is a copy of sleep (only its name matters to
    the sampler). Unscoped, the sampler sums both; scoped, only its own."""
    import shutil
    import subprocess
    import time

    (tmp_path / "measure").write_text('#!/bin/sh\nshift 3\n"$@"\n')
    nvcc = tmp_path / "nvcc"
    shutil.copy(shutil.which("sleep"), nvcc)
    trees = [subprocess.Popen(["sh", str(tmp_path / "measure"), name, str(tmp_path), "--",
                               str(nvcc), "3"]) for name in ("flash-attn", "flashinfer")]
    try:
        time.sleep(0.5)
        scoped, unscoped = cp.JobSampler(scope="flashinfer"), cp.JobSampler()
        scoped.sample()
        unscoped.sample()
        parents = {job: cp._processes()[job][0] for job in scoped.jobs}
    finally:
        for tree in trees:
            tree.kill()
            tree.wait()
    assert len(unscoped.jobs) >= 2
    assert list(parents.values()) == [trees[1].pid]  # the one job is flashinfer's nvcc


# ---- the commands ----------------------------------------------------------------------------

def test_max_jobs_and_nvcc_threads_are_validated_alike_in_every_command(capsys):
    from infermatrix.cli import main

    for command in (["build"], ["pipeline"], ["compile-plan"]):
        for flag in ("--max-jobs", "--nvcc-threads"):
            for bad in ("0", "-3", "two"):
                try:  # argparse's own usage error, or the option validator's: exit 2 alike
                    code = main([*command, flag, bad])
                except SystemExit as exit_info:
                    code = exit_info.code
                assert code == 2, (command, flag, bad)
                assert flag in capsys.readouterr().err


def test_compile_plan_command_for_another_host_as_json(tmp_path, capsys):
    import json

    from infermatrix.cli import main

    matrix = TESTS / "matrix" / "matrix.yaml"
    code = main(["compile-plan", "--matrix", str(matrix), "--state-dir", str(tmp_path),
                 "--offline", "--memory", "512G", "--cpus", "128", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["cpus"] == 128 and data["memory_source"] == "--memory"
    assert data["nvcc_threads"] == 1 and data["expected_peak_gib"] <= data["budget_gib"]
    code = main(["compile-plan", "--matrix", str(matrix), "--state-dir", str(tmp_path),
                 "--offline", "--memory", "4G", "--cpus", "8", "--max-jobs", "64"])
    out = capsys.readouterr().out
    assert code == 0 and "expected peak" in out and "warning" in out


# ---- parsing real files -----------------------------------------------------------------------

def test_parsers():
    assert cp.mem_available("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2048 * 1024
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
    plan = cp.plan_from_reading(reading, [cp.Need("flash-attn", "2.8.3", "13.0")])
    assert plan.memory_gb == memory / cp.GIB and plan.cpus == cp.effective_cpus(reading)
    assert plan.max_jobs <= plan.cpus and plan.nvcc_threads == 1
    assert plan.total_budget_gb <= plan.usable_gb and not plan.warnings


def test_build_records_a_kernel_compile_and_the_next_plan_of_that_key_uses_it(tmp_path):
    """build.py's wiring, without Docker: the sampler around a real nvcc compile of the
    fixture kernel, recorded under its cache key in the state directory; the next
    compile_plan_for that key (and `build --explain`) names the recorded figure."""
    import os
    import subprocess

    from infermatrix.stages import build
    from infermatrix.kernels import kernelcache
    from infermatrix.context import Context

    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    ctx = Context.load(str(TESTS / "matrix" / "matrix.yaml"), str(tmp_path),
                       True)
    spec = ctx.matrix.build["kernels"]["cudakern"]
    key = kernelcache.make_key(spec, torch="2.11.0", cuda="13.0", python="3.12",
                               archs=["sm_120"], source_root=ctx.root)
    reading = HostReading(mem_available=64 * GIB, cpus_affinity=16)
    first = build.compile_plan_for(ctx, [[key]], RunOptions(), reading)
    assert first.figures[0].origin != "recorded"
    source = TESTS / "fixtures" / "cudakern" / "src" / "reduce.cu"
    with cp.JobSampler(interval=0.1, root_pid=os.getpid()) as sampler:
        subprocess.run([nvcc, "-gencode", "arch=compute_120,code=sm_120", "-c", str(source),
                        "-o", str(tmp_path / "reduce.o")], check=True)
    stats = build._record_compile(ctx, key, sampler, {"MAX_JOBS": "1", "NVCC_THREADS": "1"})
    second = build.compile_plan_for(ctx, [[key]], RunOptions(), reading)
    assert second.figures[0].origin == "recorded" and key.slug in second.figures[0].source
    assert second.job_gib == pytest.approx(stats["job_peak_max_gib"] * 1.15, abs=1e-3)
    assert "[recorded]" in second.explain()
