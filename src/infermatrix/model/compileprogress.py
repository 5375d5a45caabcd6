"""How far a kernel compile is, and when it ends (issue 31): ninja's `[N/M]` lines in, files done,
elapsed and an ETA out.

ninja, writing to a pipe, prints one `[finished/total] command` line as each edge ends (the
BuildKit log prefixes it with `#<step> <seconds>`). Each line names its translation unit (the
`.o.d` dependency file or the `-c` source of nvcc/c++). The ETA weighs the files not done yet:
- by this host's own seconds for each file, recorded at the end of an earlier compile of the
  same kernel (compile history), when there is one;
- else by the compile model's heaviest files (data/compile_model.yaml `heaviest_tus`), the
  others at the measured mean;
- else all alike.
The weights are relative: the rate that turns them into seconds is the one observed so far (done
weight per elapsed second), so the ETA corrects itself as files finish. Before the first file
ends, the prior is the recorded (or modelled) wall time of the whole compile.

Pure: lines and clock readings in, figures out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

# pip -v indents a build backend's output by two spaces
STATUS = re.compile(r"^(?:#\d+ [\d.]+ )?\s*\[(\d+)/(\d+)\] (.*)$")
# templates/files/measure.sh.j2 says this as the compile command starts (after the toolchain
# stages, which may take long on a cold cache): the compile's clock starts there
COMPILE_START = re.compile(r"^(?:#\d+ [\d.]+ )?measure: \S+: start\b")
# the dependency file nvcc writes (torch's cpp_extension: --dependency-output; FlashInfer: -MF)
_DEPFILE = re.compile(r"(?:--dependency-output|-MF)\s+(\S+?)\.o\.d\b")
_SOURCE = re.compile(r"(?:^|\s)-c\s+(\S+\.(?:cu|cpp|cc|cxx|c))(?:\s|$)")
_OUTPUT = re.compile(r"(?:^|\s)-o\s+(\S+)")
_ANY_SOURCE = re.compile(r"(\S+\.(?:cu|cpp|cc|cxx))\b")
# a line `measure` shortened keeps its end: the object or library the edge writes
_TRAILING_OUTPUT = re.compile(r"(\S+\.(?:o|so))\s*$")


def parse_status(line: str) -> tuple[int, int, str] | None:
    """(finished, total, file) of a ninja status line, or None for any other line."""
    match = STATUS.match(line.rstrip("\n"))
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), edge_name(match.group(3))


def edge_name(command: str) -> str:
    """The file an edge compiles (`flash_bwd_hdim256_bf16_sm80.cu`) or links (its output)."""
    for pattern in (_DEPFILE, _SOURCE, _TRAILING_OUTPUT, _ANY_SOURCE, _OUTPUT):
        found = pattern.search(command)
        if found:  # the file and its directory: FlashInfer's modules reuse file names
            return "/".join(PurePosixPath(found.group(1)).parts[-2:])[-120:]
    return command.strip().split(" ", 1)[0][:60]


def unit_key(name: str) -> str:
    """The comparable part of a unit's name (its directory, if any, kept): no source or
    object suffix."""
    for suffix in (".cuda.o", ".cuda", ".o", ".cu", ".cpp", ".cc", ".cxx", ".c", ".so"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def base_key(key: str) -> str:
    return key.rsplit("/", 1)[-1]


@dataclass
class Prior:
    """What is known before the compile starts."""

    total_s: float | None = None  # the whole compile's expected wall time on this host
    weights: dict[str, float] = field(default_factory=dict)  # unit key -> relative cost
    default_weight: float = 1.0
    origin: str = "uniform"  # history | model | uniform
    files: int | None = None  # the compile's files (ninja edges), when known

    @classmethod
    def from_history(cls, record: dict[str, Any]) -> Prior:
        """An earlier compile of the same kernel on this state directory's host."""
        units = {unit_key(k): float(v) for k, v in (record.get("unit_seconds") or {}).items()}
        mean = sum(units.values()) / len(units) if units else 1.0
        # the compile itself: from its start to its last file (not the toolchain before it)
        return cls(total_s=sum(units.values()) or None, weights=units,
                   default_weight=mean or 1.0, origin="history",
                   files=int(record.get("files") or len(units)) or None)

    @classmethod
    def from_model(cls, entry: dict[str, Any], max_jobs: int) -> Prior:
        """The compile model's measured entry: the heaviest units' seconds, the others at the
        mean of the measured build; the wall time scaled from its jobs to `max_jobs`."""
        units = {unit_key(u["tu"]): float(u["s"]) for u in entry.get("heaviest_tus") or []
                 if u.get("tu") and u.get("s")}
        wall, jobs, tus = entry.get("wall_s"), entry.get("max_jobs"), entry.get("tus")
        mean = float(wall) * int(jobs) / int(tus) if wall and jobs and tus else 1.0
        total = mean * int(tus) / max(max_jobs, 1) if wall and jobs and tus else None
        return cls(total_s=total, weights=units, default_weight=mean, origin="model",
                   files=int(tus) + 1 if tus else None)  # + the host-compiler unit


@dataclass
class CompileProgress:
    """One compile as it goes: feed it lines with the time they arrived."""

    prior: Prior = field(default_factory=Prior)
    started: float = 0.0
    done: int = 0
    total: int = 0
    finished: list[str] = field(default_factory=list)  # unit keys, in the order they ended
    _offset: int = 0  # edges of earlier ninja runs of this compile (one setup.py may run several)
    _run_done: int = 0
    _run_total: int = 0
    _last_end: float = 0.0
    unit_seconds: dict[str, float] = field(default_factory=dict)  # unit -> since the last end
    compiling: bool = False  # the compile command started (else: the stages before it run)

    def feed(self, line: str, now: float) -> bool:
        """Take one output line; True when it was a status line."""
        if COMPILE_START.match(line) and not self.done:
            self.started, self.compiling = now, True
            return False
        status = parse_status(line)
        if status is None:
            return False
        self.compiling = True
        finished, total, name = status
        if self._run_total and (total != self._run_total or finished <= self._run_done):
            self._offset += self._run_done  # the counter started again: another ninja run
        self._run_done, self._run_total = finished, total
        self.done = self._offset + finished
        self.total = self._offset + total
        key = unit_key(name)
        self.finished.append(key)
        self.unit_seconds[key] = round(now - (self._last_end or self.started), 3)
        self._last_end = now
        return True

    def weight(self, key: str) -> float:
        """A unit's prior weight: by its key, else by its file name (the compile model names
        files without their directory), else the default."""
        weights = self.prior.weights
        return weights.get(key, weights.get(base_key(key), self.prior.default_weight))

    def remaining_weight(self) -> float:
        """The weight of the units not done: the known ones not seen, and the unnamed rest."""
        seen = set(self.finished) | {base_key(k) for k in self.finished}
        not_seen = [w for k, w in self.prior.weights.items() if k not in seen]
        unnamed = max(self.total - self.done - len(not_seen), 0)
        return sum(not_seen) + unnamed * self.prior.default_weight

    def eta_s(self, now: float) -> float | None:
        """Seconds left, or None while nothing says (no total, no prior)."""
        elapsed = max(now - self.started, 0.0)
        if self.total and self.done >= self.total:
            return 0.0
        if self.done and self.total:
            done_weight = sum(self.weight(k) for k in self.finished)
            rate = done_weight / elapsed if elapsed > 0 else 0.0  # weight per second
            if rate > 0:
                return self.remaining_weight() / rate
        if self.prior.total_s is not None:  # the whole compile while it has not started
            return max(self.prior.total_s - (elapsed if self.compiling else 0.0), 0.0)
        return None

    def line(self, now: float) -> str:
        """`12/74 files, 5m12s elapsed, ETA 23m40s (history)`."""
        eta = self.eta_s(now)
        files = f"{self.done}/{self.total} files" if self.total else \
            "no file done yet" if self.compiling else "the stages before the compile run"
        return (f"{files}, {clock(now - self.started)} elapsed, "
                + (f"ETA {clock(eta)} ({self.prior.origin})" if eta is not None else "ETA unknown"))


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def prior_for(slug: str, package: str, version: str | None, cuda: str | None, max_jobs: int,
              history: list[dict[str, Any]], model: dict[str, Any]) -> Prior:
    """This host's last compile of the same kernel key (at the same MAX_JOBS if there is one),
    else the compile model's measurement of the same package, version and CUDA (of several,
    the one measured at the MAX_JOBS nearest `max_jobs`: a compile's wall time does not scale
    linearly from 16 jobs to 2), else uniform."""
    mine = [r for r in history if r.get("key") == slug and r.get("unit_seconds")]
    same_jobs = [r for r in mine if int(r.get("max_jobs") or 0) == max_jobs]
    if same_jobs or mine:
        return Prior.from_history((same_jobs or mine)[-1])
    minor = ".".join(str(cuda).split(".")[:2]) if cuda else None
    same = [e for e in ((model.get("packages") or {}).get(package) or {}).get("measured") or []
            if str(e.get("version")) == str(version) and str(e.get("cuda")) == minor]
    if same:  # min() keeps the first of equally near ones
        nearest = min(same, key=lambda e: abs(int(e.get("max_jobs") or 0) - max_jobs))
        return Prior.from_model(nearest, max_jobs)
    return Prior()
