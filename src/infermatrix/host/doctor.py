"""`infermatrix doctor`: what this host offers (GPU, driver, Docker, LXC, memory limit) and which
cells of images.lock can run on it, and why the others cannot.

Every reading goes through `HostReaders`, so tests (and a user diagnosing another machine) feed
recorded outputs: an `nvidia-smi` CSV, a root directory holding proc/, sys/ and run/ files.
The fit rules are those of coverage.py: a cell's cubins run on a GPU of the same major and an
equal or higher minor; its CUDA needs the driver minimum of data/drivers.yaml.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from ..engine import docker as engine
from .. import proc
from ..model.compileplan import parse_limit
from ..model.coverage import Arch, cubin_runs_on
from ..errors import InfermatrixError
from ..model.cell import CPU
from ..model.rules import known_bad_driver, min_driver_for

NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=index,name,compute_cap,driver_version",
                    "--format=csv"]
NO_DRIVER_HINT = "no NVIDIA driver reachable (nvidia-smi not found)"


# --- readers --------------------------------------------------------------------------------

def run_nvidia_smi() -> tuple[int | None, str]:
    """(exit code, output) of the nvidia-smi query; (None, message) when it is not installed."""
    if shutil.which("nvidia-smi") is None:
        return None, NO_DRIVER_HINT
    done = proc.run(NVIDIA_SMI_QUERY, check=False, timeout=60)
    return done.returncode, done.output


def read_docker_info() -> dict[str, Any]:
    """This machine's engine (DOCKER_HOST / the current context): the host doctor checks."""
    return engine.Engine().host_info()


@dataclass
class HostReaders:
    """Where doctor reads from; tests swap each one for a recorded answer."""

    root: Path = Path("/")
    nvidia_smi: Callable[[], tuple[int | None, str]] = run_nvidia_smi
    docker_info: Callable[[], dict[str, Any]] = read_docker_info
    which: Callable[[str], str | None] = shutil.which

    def read(self, relative: str) -> str | None:
        try:
            return (self.root / relative).read_text(encoding="utf-8", errors="replace")
        except OSError:  # absent or unreadable (e.g. /proc/1/environ without root)
            return None


# --- facts ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_cap: str  # "12.0"
    driver: str  # "580.95.05"

    def describe(self) -> str:
        return f"GPU {self.index} ({self.name}, compute capability {self.compute_cap})"


def parse_nvidia_smi_csv(text: str) -> list[Gpu]:
    """Rows of `nvidia-smi --query-gpu=...compute_cap,driver_version --format=csv[,noheader]`.

    Columns are found by the header when there is one; without it, the last two columns are
    compute_cap and driver_version (the order of the query)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = [h.strip().split(" ")[0] for h in lines[0].split(",")]
    has_header = "compute_cap" in header
    rows = lines[1:] if has_header else lines
    gpus = []
    for number, row in enumerate(rows):
        cells = [c.strip() for c in row.split(",")]
        if has_header:
            values = dict(zip(header, cells, strict=False))
        else:
            values = {"compute_cap": cells[-2], "driver_version": cells[-1]}
        if not _looks_like_cc(values.get("compute_cap", "")):
            raise ValueError(f"unexpected nvidia-smi line: {row!r}")
        gpus.append(Gpu(index=int(values.get("index", number)),
                        name=values.get("name", "GPU"), compute_cap=values["compute_cap"],
                        driver=values.get("driver_version", "")))
    return gpus


def _looks_like_cc(text: str) -> bool:
    major, dot, minor = text.partition(".")
    return bool(dot) and major.isdigit() and minor.isdigit()


def detect_lxc(readers: HostReaders) -> str | None:
    """Evidence that this runs inside an LXC container, or None."""
    if (readers.read("run/systemd/container") or "").strip() == "lxc":
        return "/run/systemd/container says lxc"
    environ = readers.read("proc/1/environ") or ""
    if "container=lxc" in environ.split("\0"):
        return "PID 1 runs with container=lxc"
    if (readers.root / "dev/.lxc-boot-id").exists():
        return "/dev/.lxc-boot-id exists"
    cgroup = readers.read("proc/1/cgroup") or ""
    if "/lxc/" in cgroup or "/lxc.payload" in cgroup:
        return "PID 1's cgroup is under lxc"
    return None


def cgroup_memory_limit(readers: HostReaders) -> int | None:
    """The memory limit of this cgroup in bytes (v2 memory.max, v1 limit_in_bytes); None: none."""
    for path in ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = readers.read(path)
        if text is not None:
            try:
                return parse_limit(text)
            except ValueError:  # not a number: no limit we can read
                return None
    return None


def read_meminfo(readers: HostReaders) -> tuple[int, int] | None:
    from ..model.unifiedmem import parse_meminfo

    text = readers.read("proc/meminfo")
    try:
        return parse_meminfo(text) if text is not None else None
    except ValueError:
        return None


@dataclass
class HostFacts:
    gpus: list[Gpu] = field(default_factory=list)
    gpu_error: str | None = None
    docker: dict[str, Any] | None = None
    docker_error: str | None = None
    lxc: str | None = None  # evidence, None outside LXC
    memory_limit: int | None = None
    container_toolkit: str | None = None  # path of the NVIDIA container toolkit, if any
    meminfo: tuple[int, int] | None = None  # (MemTotal, MemAvailable) bytes

    def as_dict(self) -> dict[str, Any]:
        return {"gpus": [g.__dict__ for g in self.gpus], "gpu_error": self.gpu_error,
                "docker": self.docker, "docker_error": self.docker_error, "lxc": self.lxc,
                "memory_limit_bytes": self.memory_limit,
                "container_toolkit": self.container_toolkit,
                "unified_memory": unified_memory(self)}


def unified_memory(facts: HostFacts) -> dict[str, Any] | None:
    """For a GPU that shares the host's memory (GB10): the pool and what `deploy` would give
    one engine now (model/unifiedmem.py), or why it would not start one."""
    from ..model import unifiedmem

    gpu = next((g for g in facts.gpus if unifiedmem.unified_capability(g.compute_cap)), None)
    if gpu is None:
        return None
    arch = unifiedmem.unified_capability(gpu.compute_cap)
    unified = unifiedmem.unified_arch(arch) if arch else None
    if arch is None or unified is None:  # not reached: the GPU was picked for its arch
        return None
    found: dict[str, Any] = {"gpu": gpu.index, "arch": arch, "name": unified["name"]}
    if facts.meminfo is None:
        return {**found, "error": "/proc/meminfo unreadable"}
    total, available = facts.meminfo
    try:
        sizing = unifiedmem.size(total, available, "vllm")
    except unifiedmem.UnifiedMemoryShort as exc:
        return {**found, "total_bytes": total, "available_bytes": available, "error": str(exc)}
    return {**found, **sizing.as_dict(), "summary": sizing.describe()}


def gather(readers: HostReaders | None = None) -> HostFacts:
    readers = readers or HostReaders()
    facts = HostFacts(lxc=detect_lxc(readers), memory_limit=cgroup_memory_limit(readers),
                      meminfo=read_meminfo(readers))
    code, output = readers.nvidia_smi()
    if code == 0:
        try:
            facts.gpus = parse_nvidia_smi_csv(output)
        except ValueError as exc:
            facts.gpu_error = str(exc)
        if not facts.gpus and not facts.gpu_error:
            facts.gpu_error = "nvidia-smi lists no GPU"
    else:
        first = next((ln for ln in output.splitlines() if ln.strip()), "no output")
        facts.gpu_error = first if code is None else f"nvidia-smi failed ({code}): {first}"
    try:
        facts.docker = readers.docker_info()
    except InfermatrixError as exc:
        facts.docker_error = str(exc).splitlines()[0]
    facts.container_toolkit = next(
        (p for p in (readers.which("nvidia-container-runtime-hook"), readers.which("nvidia-ctk"))
         if p), None)
    return facts


# --- fits -----------------------------------------------------------------------------------

@dataclass
class Fit:
    cell: str
    fits: bool
    reasons: list[str]  # why not (or, when it fits, on which GPUs)

    def as_dict(self) -> dict[str, Any]:
        return {"cell": self.cell, "fits": self.fits, "reasons": self.reasons}


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def gpu_problems(entry: dict[str, Any], gpu: Gpu) -> list[str]:
    """Why this GPU cannot run the cell's image (empty: it can)."""
    problems = []
    built = Arch.parse(entry["arch"])
    device = Arch.parse(gpu.compute_cap)
    if not cubin_runs_on(built, device):
        how = "a different major" if built.major != device.major else "a lower minor"
        problems.append(f"arch mismatch: built for {built.sm} (compute capability "
                        f"{built.major}.{built.minor}); {gpu.describe()} is {how}")
    bad = known_bad_driver(gpu.driver, gpu.compute_cap)
    if bad is not None:
        problems.append(f"driver {gpu.driver} is known to break on compute capability "
                        f"{gpu.compute_cap}: {bad['symptom']}; fix: {bad['fix']} "
                        f"({bad['source']}, data/drivers.yaml)")
    minimum, why = driver_floor_of(entry)
    have, need = _version(gpu.driver), _version(minimum or "")
    if need is not None and (have is None or have < need):
        problems.append(f"driver {gpu.driver} is below {minimum}, {why}; fix: install an "
                        f"NVIDIA driver >= {minimum} on the host, or pick a cell whose floor "
                        "this driver meets")
    return problems


DRIVER_FLOOR_LABEL = "io.infermatrix.driver.floor"


def driver_floor_of(entry: dict[str, Any]) -> tuple[str | None, str]:
    """(oldest driver, what sets it) for an images.lock entry: the image's driver-floor label
    (plan: the CUDA runtime and the PTX ISA of PTX-only objects), else its CUDA's minimum."""
    labelled = (entry.get("labels") or {}).get(DRIVER_FLOOR_LABEL)
    if labelled:
        return labelled, f"the driver floor of this image (label {DRIVER_FLOOR_LABEL})"
    cuda = entry.get("cuda", CPU)
    return entry.get("min_driver") or min_driver_for(cuda), f"the minimum for CUDA {cuda}"


def cell_fit(entry: dict[str, Any], facts: HostFacts) -> Fit:
    cell = entry["cell"]
    if entry.get("arch") == CPU:
        return Fit(cell, True, ["CPU lane: needs no GPU"])
    if not facts.gpus:
        return Fit(cell, False, [f"needs an NVIDIA GPU: {facts.gpu_error or 'none found'}"])
    per_gpu = {gpu.index: gpu_problems(entry, gpu) for gpu in facts.gpus}
    good = [i for i, problems in per_gpu.items() if not problems]
    if good:
        return Fit(cell, True, [f"runs on GPU {', '.join(str(i) for i in good)}"])
    unique = list(dict.fromkeys(p for problems in per_gpu.values() for p in problems))
    return Fit(cell, False, unique)


def fits(lock: dict[str, Any], facts: HostFacts) -> list[Fit]:
    return [cell_fit(entry, facts) for _, entry in sorted(lock.get("images", {}).items())]


def warnings(facts: HostFacts) -> list[str]:
    """What will go wrong on this host, from failure-modes.md."""
    found = []
    for gpu in facts.gpus:
        bad = known_bad_driver(gpu.driver, gpu.compute_cap)
        if bad is not None:
            found.append(f"{gpu.describe()}: driver {gpu.driver} is known to break: "
                         f"{bad['symptom']}; fix: {bad['fix']} ({bad['source']})")
    docker = facts.docker or {}
    if docker.get("storage_driver") == "vfs":
        found.append("Docker uses the vfs storage driver: every layer is a full copy (ZFS before "
                     "2.2 has no overlay2; tteck/Proxmox#875). Use ZFS >= 2.2 or an ext4/xfs "
                     "volume for /var/lib/docker, 150-200 GB")
    if facts.gpus and facts.docker is not None and docker.get("gpu_access_error"):
        found.append(docker["gpu_access_error"]
                     + ("" if facts.container_toolkit else " (no nvidia-ctk on this host)"))
    elif facts.gpus and facts.docker is not None and "gpu_access_error" not in docker \
            and "nvidia" not in docker.get("runtimes", []) and not facts.container_toolkit:
        found.append("no NVIDIA Container Toolkit (no nvidia runtime, no nvidia-ctk): "
                     "`docker run --gpus` will fail; install nvidia-container-toolkit")
    if facts.lxc and facts.gpus:
        found.append("inside LXC: set `no-cgroups = true` in /etc/nvidia-container-runtime/"
                     "config.toml, pass /dev/nvidia* with --device, and keep this container's "
                     f"NVIDIA libraries at the host driver's exact version ({facts.gpus[0].driver})"
                     "; `infermatrix proxmox lxc-config` on the host prints the lines")
    if facts.lxc and not facts.gpus:
        found.append("inside LXC without a visible GPU: pass the devices from the host "
                     "(`infermatrix proxmox lxc-config --ctid N` on the Proxmox host)")
    return found


def _gib(value: int) -> str:
    return f"{value / 2**30:.1f} GiB"


def report_lines(facts: HostFacts, cell_fits: list[Fit]) -> list[str]:
    lines = []
    if facts.gpus:
        for gpu in facts.gpus:
            lines.append(f"gpu:      {gpu.describe()}, driver {gpu.driver}")
    else:
        lines.append(f"gpu:      none ({facts.gpu_error}); checking the rest")
    if facts.docker is not None:
        d = facts.docker
        lines.append(f"docker:   {d.get('server_version')}, storage driver "
                     f"{d.get('storage_driver')}, runtimes {', '.join(d.get('runtimes', []))}"
                     f" (default {d.get('default_runtime')})")
        if "gpu_access" in d:
            lines.append("          GPUs in containers: "
                         + (d["gpu_access"] or "none (" + d.get("gpu_access_error", "") + ")"))
    else:
        lines.append(f"docker:   not reachable ({facts.docker_error})")
    lines.append(f"lxc:      {'yes: ' + facts.lxc if facts.lxc else 'no'}")
    lines.append("memory:   cgroup limit " + (_gib(facts.memory_limit) if facts.memory_limit
                                              else "none"))
    unified = unified_memory(facts)
    if unified is not None:
        lines.append(f"unified:  GPU {unified['gpu']} ({unified['name']}, {unified['arch']}) "
                     "shares the host's memory; the engine's memory fraction is no bound there")
        lines.append("          " + (unified.get("summary") or
                                     "no engine would start: " + unified.get("error", "")))
    for warning in warnings(facts):
        lines.append(f"warning:  {warning}")
    if not cell_fits:
        lines.append("images.lock: no published cells")
    for fit in cell_fits:
        mark = "fits   " if fit.fits else "no     "
        lines.append(f"{mark} {fit.cell}: {'; '.join(fit.reasons)}")
    return lines
