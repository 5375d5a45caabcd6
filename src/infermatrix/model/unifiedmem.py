"""Engine memory on GPUs that share the host's memory (DGX Spark / GB10, issue 30). Pure: the
caller reads /proc/meminfo. data/unified_memory.yaml holds the field findings with their sources.

On a discrete card the engine's memory fraction (vLLM --gpu-memory-utilization, SGLang
--mem-fraction-static) bounds its own VRAM. On GB10 the same pool serves the OS, the page cache
and the engine's host side, and the fraction is not a hard bound. So the budget comes from what
is free now: MemAvailable less a headroom. The fraction handed to the engine is that budget over
the total, the container gets the budget as its memory limit, and /dev/shm is capped. Below
`min_budget_gib` nothing is started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..datafiles import DATA_DIR, read_data
from ..errors import UnifiedMemoryShort
from . import engines

SPEC_PATH = DATA_DIR / "unified_memory.yaml"
GIB = 2**30


def spec() -> dict[str, Any]:
    return read_data(SPEC_PATH)


def unified_arch(arch: str, data: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The data of a unified-memory arch (`sm_121`, with or without a/f suffix), else None."""
    arches = (data or spec())["arches"]
    return arches.get(arch) or arches.get(arch.rstrip("af"))


def unified_capability(compute_cap: str, data: Mapping[str, Any] | None = None) -> str | None:
    """`12.1` -> `sm_121` when that arch shares the host's memory."""
    major, _, minor = compute_cap.partition(".")
    arch = f"sm_{major}{minor}"
    return arch if unified_arch(arch, data) else None


def meminfo_bytes(text: str) -> dict[str, int]:
    """Every `Key: N kB` line of /proc/meminfo, in bytes (the one reader of the file's form)."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return values


def parse_meminfo(text: str) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo."""
    values = {k: v for k, v in meminfo_bytes(text).items() if k in ("MemTotal", "MemAvailable")}
    if len(values) != 2:
        raise ValueError("/proc/meminfo has no MemTotal or MemAvailable line")
    return values["MemTotal"], values["MemAvailable"]


@dataclass(frozen=True)
class Sizing:
    total: int
    available: int
    headroom: int
    budget: int  # bytes the engine may take
    fraction: float  # budget / total, rounded down to 0.01
    shm_size: str  # "8g"
    flag: str | None  # the engine's fraction flag; None: an engine without one

    def describe(self) -> str:
        return (f"unified memory: MemAvailable {self.available / GIB:.1f} of "
                f"{self.total / GIB:.1f} GiB, headroom {self.headroom / GIB:.1f} GiB -> "
                f"budget {self.budget / GIB:.1f} GiB: "
                + (f"{self.flag} {self.fraction:.2f}, " if self.flag else "")
                + f"container memory limit {self.budget // GIB}g, shm {self.shm_size}")

    def as_dict(self) -> dict[str, Any]:
        return {"total_bytes": self.total, "available_bytes": self.available,
                "headroom_bytes": self.headroom, "budget_bytes": self.budget,
                "fraction": self.fraction, "flag": self.flag, "shm_size": self.shm_size}


def size(total: int, available: int, engine: str, servers: int = 1,
         data: Mapping[str, Any] | None = None) -> Sizing:
    """Each of `servers` engines' share of a unified pool; UnifiedMemoryShort below the
    floor."""
    data = data or spec()
    rule = data["headroom"]
    headroom = max(int(rule["min_gib"] * GIB), int(rule["fraction_of_total"] * total))
    budget = (available - headroom) // max(servers, 1)
    floor = int(data["min_budget_gib"] * GIB)
    if budget < floor:
        raise UnifiedMemoryShort(
            f"only {available / GIB:.1f} GiB of this host's {total / GIB:.1f} GiB is available "
            f"now; with {headroom / GIB:.1f} GiB kept for the OS that leaves "
            f"{max(budget, 0) / GIB:.1f} GiB per server, under the {data['min_budget_gib']} GiB floor of a "
            "unified-memory GPU (data/unified_memory.yaml): stop other work on the host first")
    fraction = math.floor(budget / total * 100) / 100
    shm = f"{min(int(data['shm_size_gib']), budget // GIB)}g"
    return Sizing(total, available, headroom, budget, fraction, shm,
                  engines.row(engine).get("memory_flag"))


def size_from_meminfo(meminfo: Path, arch: str, engine: str, servers: int = 1
                      ) -> Sizing | None:
    """Each of `servers` engines' share of this host's pool, read from `meminfo` now, when
    `arch` is a unified-memory GPU's (None otherwise); `engine`: the engine label (vllm,
    sglang, vllm-cpu...). A meminfo that cannot be read: UsageError naming --memory-from."""
    from ..errors import UsageError

    if unified_arch(arch) is None:
        return None
    try:
        total, available = parse_meminfo(meminfo.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--memory-from {meminfo}: {exc}") from None
    return size(total, available, engine, servers=servers)


def with_fraction(command: list[str], sizing: Sizing) -> list[str]:
    """The serve command with the engine's fraction flag set to the sizing's (a value the
    recorded command already had is replaced, in either `--flag V` or `--flag=V` form)."""
    if sizing.flag is None:
        return list(command)
    value = f"{sizing.fraction:.2f}"
    out: list[str] = []
    skip = False
    for index, arg in enumerate(command):
        if skip:
            skip = False
            continue
        if arg == sizing.flag:
            skip = index + 1 < len(command)
            continue
        if arg.startswith(sizing.flag + "="):
            continue
        out.append(arg)
    return [*out, sizing.flag, value]
