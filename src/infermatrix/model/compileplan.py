"""MAX_JOBS and NVCC_THREADS from the memory and CPUs really available, and a memory model of
one compile job that is measured, then learned from every build.

Inside Docker or LXC, `free` can lie: the limit that kills a build is the cgroup's. So the
memory figure is the smallest of the cgroup v2 `memory.max` (minus what the group uses), the
cgroup v1 `memory.limit_in_bytes` (likewise) and /proc/meminfo MemAvailable; the CPUs are the
smaller of the affinity mask and the cgroup CPU quota.

The model is per compile job (one nvcc with its cicc/ptxas/cc1plus children), not per thread:
`nvcc --threads` parallelises across -gencode targets, so a job with k = min(NVCC_THREADS,
targets) targets in flight peaks at about k x the one-target figure. NVCC_THREADS defaults to
the number of targets (1 for a cell, which compiles for its own arch only) and the memory it
would have reserved goes to MAX_JOBS. The one-target figure of a (package, version, CUDA,
targets) comes, in this order, from what an earlier build of that key recorded
(<state>/compile-history.jsonl), from a measurement in data/compile_model.yaml, from a
measurement of another version there, or from the package's unmeasured default; measured and
recorded peaks get the model's margin. Every figure carries where it came from
(`infermatrix build --explain`, `infermatrix compile-plan`).

The planning functions are pure (readings in, plan out); `read_host()` takes the readings and
`JobSampler` measures a real compile.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..datafiles import DATA_DIR, read_data

GIB = 1024 ** 3
# cgroup v1 reports "no limit" as a huge page-rounded number (9223372036854771712).
UNLIMITED_THRESHOLD = 1 << 60
MODEL_FILE = DATA_DIR / "compile_model.yaml"
HISTORY_FILE = "compile-history.jsonl"


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
# The memory model of one compile job
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Need:
    """What one kernel compile is: the key of the model (CUDA/version may be unknown)."""

    package: str
    version: str | None = None
    cuda: str | None = None
    targets: int = 1  # -gencode targets of the compile (a cell: its one arch)
    legacy_gb: float | None = None  # matrix.yaml build.kernels.<n>.gb_per_nvcc_thread


@dataclass(frozen=True)
class JobFigure:
    """GiB one job takes per target in flight (margin included), and where that came from."""

    package: str
    gib_per_target: float
    origin: str  # recorded | measured | measured-other | default
    source: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_model() -> dict[str, Any]:
    return read_data(MODEL_FILE)


def _minor(cuda: str | None) -> str | None:
    return ".".join(str(cuda).split(".")[:2]) if cuda else None


def history_path(state_root: Path) -> Path:
    return Path(state_root) / HISTORY_FILE


def read_history(path: Path | None) -> list[dict[str, Any]]:
    """The records of earlier kernel builds (a torn last line from a crash is skipped)."""
    if path is None or not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def record_build(path: Path, need: Need, stats: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Append what a kernel build measured (peak per job, whole-build peak, wall) to history."""
    record = {"package": need.package, "version": need.version, "cuda": _minor(need.cuda),
              "targets": need.targets, **stats, **extra,
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "host": os.uname().nodename}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
    return record


def _recorded(history: list[dict[str, Any]], need: Need) -> dict[str, Any] | None:
    """The latest usable record of the same (package, version, CUDA, targets)."""
    for record in reversed(history):
        if (record.get("package") == need.package and record.get("version") == need.version
                and record.get("cuda") == _minor(need.cuda)
                and record.get("targets") == need.targets
                and float(record.get("job_peak_max_gib") or 0) > 0):
            return record
    return None


def _measured(entries: list[dict[str, Any]], need: Need) -> tuple[dict[str, Any] | None, bool]:
    """(the measurement of this version and CUDA, True) or (the nearest other one, False)."""
    same = [e for e in entries if str(e.get("version")) == need.version
            and str(e.get("cuda")) == _minor(need.cuda)]
    if same:
        return same[0], True
    if not entries:
        return None, False
    # Another version or CUDA: the heaviest measurement is the safe stand-in.
    return max(entries, key=lambda e: float(e["job_peak_max_gib"]) / int(e.get("targets", 1))), \
        False


def job_figure(need: Need, model: dict[str, Any] | None = None,
               history: list[dict[str, Any]] | None = None) -> JobFigure:
    model = model if model is not None else load_model()
    margin = float(model.get("margin", 1.15))
    package = (model.get("packages") or {}).get(need.package) or {}
    record = _recorded(history or [], need)
    if record is not None:
        gib = float(record["job_peak_max_gib"]) / max(int(record.get("targets", 1)), 1)
        return JobFigure(need.package, round(gib * margin, 3), "recorded",
                         f"recorded by the build of {record.get('key', need.package)} on "
                         f"{record.get('host', '?')} {record.get('when', '')}: peak per job "
                         f"{float(record['job_peak_max_gib']):.2f} GiB x margin {margin:g}")
    entry, exact = _measured(list(package.get("measured") or []), need)
    if entry is not None:
        gib = float(entry["job_peak_max_gib"]) / max(int(entry.get("targets", 1)), 1)
        what = "" if exact else (f" (measured for {need.package} {entry.get('version')} CUDA "
                                 f"{entry.get('cuda')}, not {need.version or '?'} CUDA "
                                 f"{_minor(need.cuda) or '?'})")
        return JobFigure(need.package, round(gib * margin, 3),
                         "measured" if exact else "measured-other",
                         f"data/compile_model.yaml: {float(entry['job_peak_max_gib']):.2f} GiB "
                         f"peak per job measured {entry.get('when')} on "
                         f"{' '.join(str(entry.get('host', '?')).split()[:3])}... x margin "
                         f"{margin:g}{what}")
    default = package.get("default") or {}
    if default.get("gib_per_job_target"):
        return JobFigure(need.package, float(default["gib_per_job_target"]), "default",
                         f"data/compile_model.yaml default (unmeasured): "
                         f"{' '.join(str(default.get('source', '')).split())}")
    if need.legacy_gb:
        return JobFigure(need.package, float(need.legacy_gb), "default",
                         "matrix.yaml build.kernels gb_per_nvcc_thread (unmeasured)")
    return JobFigure(need.package, 1.0, "default", "no figure known: 1 GiB assumed")


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------

@dataclass
class CompilePlan:
    max_jobs: int
    nvcc_threads: int
    parallel_cells: int  # cells that may compile at once
    memory_gb: float  # memory really available (GiB)
    memory_source: str
    cpus: int
    job_gib: float  # one job at the planned NVCC_THREADS
    targets: int
    safety_margin_gb: float
    figures: list[JobFigure] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def targets_in_flight(self) -> int:
        return max(1, min(self.nvcc_threads, self.targets))

    @property
    def cell_budget_gb(self) -> float:
        """Expected peak of one compiling cell under this plan."""
        return self.max_jobs * self.job_gib

    @property
    def total_budget_gb(self) -> float:
        """Expected peak of the whole run: every cell compiling at once."""
        return self.cell_budget_gb * self.parallel_cells

    @property
    def usable_gb(self) -> float:
        return max(self.memory_gb - self.safety_margin_gb, 0.0)

    def build_args(self) -> dict[str, str]:
        return {"MAX_JOBS": str(self.max_jobs), "NVCC_THREADS": str(self.nvcc_threads)}

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(cell_budget_gb=round(self.cell_budget_gb, 2),
                    total_budget_gb=round(self.total_budget_gb, 2),
                    expected_peak_gib=round(self.total_budget_gb, 2),
                    budget_gib=round(self.usable_gb, 2),
                    memory_gb=round(self.memory_gb, 2), job_gib=round(self.job_gib, 3))
        return data

    def describe(self) -> str:
        text = (f"compile plan: MAX_JOBS={self.max_jobs} NVCC_THREADS={self.nvcc_threads}, "
                f"{self.parallel_cells} cell(s) compiling at once; "
                f"{self.memory_gb:.1f} GiB available ({self.memory_source}), {self.cpus} CPU(s), "
                f"{self.job_gib:.2f} GiB per job -> expected peak "
                f"{self.total_budget_gb:.1f} GiB of {self.usable_gb:.1f} GiB budget")
        if self.overrides:
            text += f" (overridden: {', '.join(self.overrides)})"
        for warning in self.warnings:
            text += f"\n  warning: {warning}"
        return text

    def explain(self) -> str:
        """Every figure of the plan with where it came from."""
        lines = [self.describe(),
                 f"  memory: {self.memory_gb:.1f} GiB from {self.memory_source}, minus the "
                 f"margin {self.safety_margin_gb:g} GiB (build.safety_margin_gb) = budget "
                 f"{self.usable_gb:.1f} GiB",
                 f"  cpus: {self.cpus}",
                 f"  gencode targets per compile: {self.targets}; NVCC_THREADS="
                 f"{self.nvcc_threads} -> {self.targets_in_flight} target(s) in flight per job"
                 + (" (override)" if any(o.startswith("NVCC") for o in self.overrides)
                    else " (default: the number of targets)")]
        for figure in self.figures:
            lines.append(f"  per job, {figure.package}: {figure.gib_per_target:.2f} GiB per "
                         f"target [{figure.origin}] {figure.source}")
        lines.append(f"  MAX_JOBS={self.max_jobs}: "
                     + ("override" if any(o.startswith("MAX") for o in self.overrides) else
                        f"min(CPUs per cell / targets in flight, budget per cell / "
                        f"{self.job_gib:.2f} GiB)"))
        return "\n".join(lines)


def plan_compile(memory_bytes: int, cpus: int, job_gib_per_target: float, *,
                 targets: int = 1, safety_margin_gb: float = 2.0,
                 max_parallel_cells: int = 1, cells_to_compile: int = 1,
                 max_jobs: int | None = None, nvcc_threads: int | None = None,
                 memory_source: str = "given",
                 figures: list[JobFigure] | None = None) -> CompilePlan:
    """Size the compile so that every compiling cell's expected peak sums under the budget.

    `job_gib_per_target`: the heaviest job's peak per target in flight (the model's figure).
    `max_jobs` / `nvcc_threads` override the computed figures: accepted, recorded as overrides,
    with a warning that gives the expected peak when it no longer fits.
    """
    if job_gib_per_target <= 0:
        raise ValueError("the per-job memory figure must be positive")
    for name, value in (("max_jobs", max_jobs), ("nvcc_threads", nvcc_threads),
                        ("targets", targets)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    cpus = max(cpus, 1)
    memory_gb = memory_bytes / GIB
    usable_gb = max(memory_gb - safety_margin_gb, 0.0)
    overrides = [f"{name}={value}" for name, value in
                 (("MAX_JOBS", max_jobs), ("NVCC_THREADS", nvcc_threads)) if value is not None]

    threads = nvcc_threads or min(targets, cpus)
    in_flight = max(1, min(threads, targets))
    job_gib = job_gib_per_target * in_flight
    jobs_fit = int(usable_gb // job_gib)
    parallel = max(1, min(max_parallel_cells, max(cells_to_compile, 1), jobs_fit or 1, cpus))
    per_cell_gb = usable_gb / parallel
    per_cell_cpus = max(1, cpus // parallel)
    jobs = max_jobs or max(1, min(max(1, per_cell_cpus // in_flight),
                                  int(per_cell_gb // job_gib)))
    plan = CompilePlan(max_jobs=jobs, nvcc_threads=threads, parallel_cells=parallel,
                       memory_gb=memory_gb, memory_source=memory_source, cpus=cpus,
                       job_gib=job_gib, targets=targets, safety_margin_gb=safety_margin_gb,
                       figures=list(figures or []), overrides=overrides)
    if plan.total_budget_gb > usable_gb:
        plan.warnings.append(
            f"MAX_JOBS={jobs} x NVCC_THREADS={threads} x {parallel} cell(s): expected peak "
            f"{plan.total_budget_gb:.1f} GiB exceeds the budget of {usable_gb:.1f} GiB "
            f"({memory_gb:.1f} GiB minus {safety_margin_gb:g} GiB margin): the compile may be "
            "OOM-killed")
    return plan


def jobs_for_next_compile(cpus: int, usable_gb: float, job_gib: float, in_flight_jobs: int,
                          in_flight_gib: float, useful: int | None = None,
                          override: int | None = None) -> int:
    """MAX_JOBS for a kernel compile that would start now, or 0: wait for one under way to end
    (issue 47, no idle core). A compile takes the CPUs and memory the compiles under way leave
    (never more jobs than it has files: `useful`), so on a small host the compiles run one at
    a time at full width, and a cell that finishes or fails early leaves no core idle; on a
    large one they share. The memory cap holds: the jobs in flight never sum over `usable_gb`,
    except that one job always runs when nothing else compiles. `override` (--max-jobs): that
    width, started when it fits beside the compiles under way or when none runs."""
    if override is not None:
        fits = in_flight_jobs + override <= max(cpus, 1) and \
            in_flight_gib + override * job_gib <= usable_gb
        return override if in_flight_jobs == 0 or fits else 0
    free_cpus = max(cpus, 1) - in_flight_jobs
    free_jobs_by_memory = int(max(usable_gb - in_flight_gib, 0.0) // job_gib) if job_gib > 0 \
        else free_cpus
    jobs = min(free_cpus, free_jobs_by_memory, useful if useful else free_cpus)
    if jobs >= 1:
        return jobs
    return 1 if in_flight_jobs == 0 else 0


def plan_for_needs(memory_bytes: int, cpus: int, needs: Iterable[Need], *,
                   model: dict[str, Any] | None = None,
                   history: list[dict[str, Any]] | None = None, **options: Any) -> CompilePlan:
    """The plan for the kernels to compile: the heaviest job figure and most targets win."""
    needs = list(dict.fromkeys(needs))  # one figure per distinct key
    model = model if model is not None else load_model()
    figures = [job_figure(n, model, history) for n in needs]
    heaviest = max((f.gib_per_target for f in figures), default=1.0)
    targets = max((n.targets for n in needs), default=1)
    return plan_compile(memory_bytes, cpus, heaviest, targets=targets, figures=figures,
                        **options)


def plan_from_reading(reading: HostReading, needs: Iterable[Need], **options: Any
                      ) -> CompilePlan:
    memory, source = effective_memory(reading)
    return plan_for_needs(memory, effective_cpus(reading), needs, memory_source=source,
                          **options)


def parse_size(text: str) -> int:
    """`512G`, `512GiB`, `96g`, `1.5T`, `2048M` -> bytes (binary units); bare numbers are GiB."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    factor = units.get(value[-1:], None)
    number = value[:-1] if factor else value
    try:
        size = float(number) * (factor or GIB)
    except ValueError:
        raise ValueError(f"not a memory size: {text!r} (e.g. 512G)") from None
    if size <= 0:
        raise ValueError(f"a memory size must be positive: {text!r}")
    return int(size)


# --------------------------------------------------------------------------------------------
# Measuring a real compile (every build records its kernels' peak)
# --------------------------------------------------------------------------------------------

COMPILER_PROCESSES = frozenset({
    "nvcc", "cicc", "ptxas", "cc1plus", "cudafe++", "fatbinary", "nvlink", "gcc", "g++",
    "c++", "as", "ld", "collect2"})


def _processes() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, comm, RSS bytes) for every live process."""
    page = os.sysconf("SC_PAGE_SIZE")
    procs: dict[int, tuple[int, str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            statm = Path(f"/proc/{entry.name}/statm").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        procs[int(entry.name)] = (ppid, comm, int(statm.split()[1]) * page)
    return procs


def _cmdline(pid: int) -> list[str]:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []
    return [a.decode(errors="replace") for a in argv]


def is_measure_wrapper(argv: list[str], kernel: str) -> bool:
    """Is this the kernel stage's `measure KERNEL OUT -- ...` (templates/files/measure.sh.j2),
    run as `measure ...` or through its shell (`sh /usr/local/bin/measure ...`)?"""
    for index, arg in enumerate(argv[:2]):
        if arg.rsplit("/", 1)[-1] == "measure":
            return argv[index + 1: index + 2] == [kernel]
    return False


def _translation_unit(pid: int) -> str:
    names = [a for a in _cmdline(pid) if a.endswith((".cu", ".cpp", ".cc"))]
    return names[0].rsplit("/", 1)[-1] if names else "?"


def _nvcc_of(pid: int, procs: dict[int, tuple[int, str, int]]) -> int | None:
    while pid in procs and pid > 1:
        if procs[pid][1] == "nvcc":
            return pid
        pid = procs[pid][0]
    return None


def _descendants(root: int, procs: dict[int, tuple[int, str, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, []))
    return seen


class JobSampler:
    """Samples, every `interval` s, the RSS of every compiler process on this host, summed per
    nvcc job (the nvcc and its descendants), and the sum over all jobs.

    It sees BuildKit's RUN steps too (they are processes of this host), so `infermatrix build`
    runs one around each kernel compile. With `scope` (a kernel name) it counts only the jobs
    under that kernel's `measure NAME ...` wrapper, so a compile of another kernel running on
    the host at the same time (cells build in parallel) is left out; two cells compiling the
    same kernel name for different keys at once would still be summed. RSS counts shared pages
    once per process, so the sums lean high: the safe side for the model.
    """

    def __init__(self, interval: float = 0.25, root_pid: int | None = None,
                 scope: str | None = None) -> None:
        self.interval = interval
        self.root_pid = root_pid  # only this process's descendants (None: the whole host)
        self.scope = scope
        self._wrapper: dict[int, bool] = {}  # pid -> is it `measure <scope> ...` (read once)
        self.jobs: dict[int, dict[str, Any]] = {}
        self.all_jobs_peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self.wall_s = 0.0

    def sample(self) -> None:
        procs = _processes()
        mine = _descendants(self.root_pid, procs) if self.root_pid else None
        if self.scope is not None:
            scoped: set[int] = set()
            for pid in procs:
                if self._is_wrapper(pid):
                    scoped |= _descendants(pid, procs)
            mine = scoped if mine is None else mine & scoped
        per_job: dict[int, int] = {}
        for pid, (_, comm, rss) in procs.items():
            if comm in COMPILER_PROCESSES and (mine is None or pid in mine):
                job = _nvcc_of(pid, procs)
                if job is not None:
                    per_job[job] = per_job.get(job, 0) + rss
        now = time.monotonic() - self._started
        for job, rss in per_job.items():
            record = self.jobs.setdefault(job, {"tu": "?", "peak": 0, "start": now})
            if record["tu"] == "?":  # read again while unknown: a loaded host races the read
                record["tu"] = _translation_unit(job)
            record["peak"] = max(record["peak"], rss)
            record["end"] = now
        self.all_jobs_peak = max(self.all_jobs_peak, sum(per_job.values()))
        self.samples += 1

    def _is_wrapper(self, pid: int) -> bool:
        if pid not in self._wrapper:
            self._wrapper[pid] = is_measure_wrapper(_cmdline(pid), self.scope or "")
        return self._wrapper[pid]

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "JobSampler":
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="compile-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.wall_s = time.monotonic() - self._started

    def stats(self) -> dict[str, Any]:
        peaks = sorted((j["peak"] / GIB for j in self.jobs.values()), reverse=True)
        heaviest = max(self.jobs.values(), key=lambda j: j["peak"], default=None)
        p90 = peaks[min(len(peaks) - 1, round(0.1 * (len(peaks) - 1)))] if peaks else 0.0
        return {"job_peak_max_gib": round(peaks[0], 3) if peaks else 0.0,
                "job_peak_p90_gib": round(p90, 3), "jobs": len(peaks),
                "build_peak_gib": round(self.all_jobs_peak / GIB, 3),
                "heaviest_tu": heaviest["tu"] if heaviest else None,
                "wall_s": round(self.wall_s, 1), "samples": self.samples,
                "sampler": f"host /proc RSS per nvcc job every {self.interval:g} s"}


# --------------------------------------------------------------------------------------------
# Reading the real host
# --------------------------------------------------------------------------------------------

def mem_available(meminfo_text: str) -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None when the file has none)."""
    from .unifiedmem import meminfo_bytes

    return meminfo_bytes(meminfo_text).get("MemAvailable")


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
    reading: dict[str, Any] = {"mem_available": mem_available(meminfo) if meminfo else None}
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
