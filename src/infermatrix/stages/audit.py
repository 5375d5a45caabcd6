"""Audit a built image without a GPU: kernel coverage per target arch, one CUDA major, the pins.

How it works:
1. A probe (harness/audit_probe.py, standard-library Python) runs once in a throw-away container of the
   image. It lists every ELF shared object under site-packages with its size, sha256, owning
   distribution, ELF NEEDED entries and whether it carries a CUDA fat binary (pyelftools from
   the host is bind-mounted read-only for that: nothing is installed in the image). It also
   reports the installed distributions, `torch.version.cuda`, and `pip check` (the image's pip,
   else its uv, else the host's uv binary mounted read-only).
2. The objects with GPU code whose content hash is not in the cache (<state>/cache/cuobjdump/)
   are copied out of the image (engine.copy_from_image: a created, never started container)
   and listed on the host with `cuobjdump --list-elf` / `--list-ptx` (the `nvidia-cuda-cuobjdump`
   wheel; no CUDA toolkit is needed in the image nor on the host), plus the fat binaries a
   library keeps in its own data sections (cuFFT), read from their headers (coverage.py).
3. coverage.py decides each object per target arch; the other checks compare the probe's facts
   with the cell: one CUDA major, torch's CUDA, installed versions against the lock and the
   cell's pins, `pip check`, the engine against the model card's floor.

Any failing check fails the audit (exit 1); the cell is then not eligible for a tag. Which
objects must cover the arch comes from the loaded set (loadedset.py, data/loaded.yaml, plus the
matrix's `audit.not_loaded`): an object the engine never loads for the cell's model on the arch
is listed as "not loaded" with its entry's reason and source; every other one must be covered
(PTX-JIT ones are flagged). Builds for another CUDA major that a package picks at run time are
no evidence of a mixed image. Two more checks: `triton-smem` compiles the engine's own Triton
attention kernels for the arch in a container of the image (harness/triton_smem.py, no GPU) and
compares their shared memory with the arch's limit; `loaded-set` judges what the live server
mapped, once the `model` smoke level recorded it (server_mapped_objects).
"""

from __future__ import annotations

import concurrent.futures
import functools

import json
import os
import re
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .. import journal, proc
from ..journal import Status
from ..model import loadedset, tritontwin
from ..model.coverage import (
    Arch,
    Coverage,
    Decision,
    DeviceCode,
    decide,
    device_code_from_listing,
    scan_fatbins,
    union,
)
from ..errors import CommandFailed, MissingTool, StageFailure, UsageError
from ..model.loadedset import LoadVerdict
from ..model.cell import CellPlan
from ..model.index import cached_entry
from ..engine.docker import Engine
from ..options import OPTIONS, from_environment
from ..state import StatePaths, write_json_atomic
from .watch import Heartbeat

if TYPE_CHECKING:
    from ..context import Context

PASS, FAIL, SKIP = Status.PASS, Status.FAIL, Status.SKIP  # the journal's one vocabulary
NOT_LOADED_GROUP = "not-loaded"
CUOBJDUMP_ENV = OPTIONS["cuobjdump"].env[0]
CUOBJDUMP_DIST = "nvidia-cuda-cuobjdump"
HARNESS_DIR = Path(__file__).resolve().parents[1] / "harness"  # in-image programs, mounted
HARNESS_MOUNT = "/opt/infermatrix/harness"
AUDIT_MOUNT = "/opt/infermatrix-audit"  # where host tools are bind-mounted in the probe container
PROBE_TIMEOUT_S = 900
CACHE_VERSION = 2  # 2: cuobjdump listing + fat binaries embedded outside .nv_fatbin

# CUDA libraries whose soname major is the CUDA major (cuFFT, cuSPARSE, cuRAND... version apart).
_CUDA_SONAME = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc|nvJitLink)\.so\.(\d+)$")
# NVIDIA runtime wheels: `nvidia-cuda-runtime-cu12` (CUDA 12 naming) or `nvidia-cuda-runtime`
# 13.x (CUDA 13 naming: the version's major is the CUDA major).
_CUDA_WHEEL = re.compile(r"^nvidia-(cuda-runtime|cublas|cuda-nvrtc|nvjitlink)(?:-cu(\d+))?$")


# --------------------------------------------------------------------------------------------
# cuobjdump on the host
# --------------------------------------------------------------------------------------------

def find_cuobjdump() -> str:
    """$INFERMATRIX_CUOBJDUMP, the `nvidia-cuda-cuobjdump` wheel, PATH, then $CUDA_HOME/bin."""
    explicit = from_environment("cuobjdump")  # checked there: a missing file is a usage error
    if explicit:
        return str(explicit)
    from_wheel = _cuobjdump_from_wheel()
    if from_wheel:
        return from_wheel
    on_path = shutil.which("cuobjdump")
    if on_path:
        return on_path
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "cuobjdump").is_file():
            return str(Path(home) / "bin" / "cuobjdump")
    raise MissingTool("cuobjdump not found", fix="`pip install nvidia-cuda-cuobjdump` (a "
                      "dependency of infermatrix on Linux x86_64/aarch64), or set "
                      f"{CUOBJDUMP_ENV}=/path/to/cuobjdump")


def _cuobjdump_from_wheel() -> str | None:
    import importlib.metadata as md

    try:
        files = md.files(CUOBJDUMP_DIST) or []
    except md.PackageNotFoundError:
        return None
    for item in files:
        if item.name == "cuobjdump":
            path = Path(str(item.locate()))
            if path.is_file():
                if not os.access(path, os.X_OK):  # some installers drop the mode bits
                    path.chmod(path.stat().st_mode | 0o111)
                return str(path)
    return None


def list_device_code(path: Path, cuobjdump: str | None = None,
                     log_path: Path | None = None) -> DeviceCode:
    """The cubins and PTX one file embeds: `cuobjdump --list-elf` / `--list-ptx` (the fat
    binary the CUDA runtime registers), plus the fat binaries a library keeps in its own data
    sections (cuFFT), read from their headers (coverage.scan_fatbins)."""
    tool = cuobjdump or find_cuobjdump()
    # both listings in one run: cuobjdump reads (and decompresses) the fat binary once, not
    # twice (libtorch_cuda.so is over 1 GB)
    done = proc.run([tool, "--list-elf", "--list-ptx", str(path)], check=False,
                    log_path=log_path, timeout=600)
    if done.returncode != 0 and "does not contain device code" not in done.output:
        raise CommandFailed(done.command, done.returncode, proc.tail(done.output), log_path)
    return union(device_code_from_listing(done.output), embedded_fatbins(path))


def embedded_fatbins(path: Path) -> DeviceCode:
    """Fat binary containers anywhere in the file, read from their headers. Like cuobjdump, the
    relocatable ones (`__nv_relfatbin`: input to device linking, never loaded) are left out when
    the object has an executable `.nv_fatbin`."""
    import mmap

    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return DeviceCode()
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return scan_fatbins(data, skip=relocatable_fatbin_ranges(handle))


def relocatable_fatbin_ranges(handle: Any) -> list[tuple[int, int]]:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    handle.seek(0)
    try:
        sections = {s.name: (s["sh_offset"], s["sh_size"]) for s in ELFFile(handle).iter_sections()}
    except ELFError:  # not an ELF file: nothing to tell apart
        return []
    if ".nv_fatbin" not in sections or "__nv_relfatbin" not in sections:
        return []
    return [sections["__nv_relfatbin"]]


def cuobjdump_version(tool: str) -> str:
    out = proc.run([tool, "--version"], check=False, timeout=60).output
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else out.strip().splitlines()[-1:][0] if out.strip() else "?"


def _device_code(data: dict[str, Any]) -> DeviceCode | None:
    """A cached entry's device code; None for an entry of another cache version."""
    if data.get("version") != CACHE_VERSION:
        return None
    return DeviceCode.from_dict(data["device_code"])


class DeviceCodeCache:
    """cuobjdump results by file content hash: libtorch_cuda.so is ~1 GB, listed once."""

    def __init__(self, state: StatePaths) -> None:
        self.root = state.root / "cache" / "cuobjdump"

    def _path(self, sha256: str) -> Path:
        return self.root / f"{sha256}.json"

    def get(self, sha256: str) -> DeviceCode | None:
        return cached_entry(self._path(sha256), _device_code, "device-code cache entry",
                            "read again from the image")

    def put(self, sha256: str, code: DeviceCode, tool_version: str) -> None:
        write_json_atomic(self._path(sha256), {"version": CACHE_VERSION, "sha256": sha256,
                                               "cuobjdump": tool_version,
                                               "device_code": code.as_dict()})


# --------------------------------------------------------------------------------------------
# The probe: what the image holds (runs inside it with the image's own python3)
# --------------------------------------------------------------------------------------------

MARKER = "@@infermatrix-audit@@"

PROBE_PROGRAM = "harness.audit_probe"  # harness/audit_probe.py, mounted like the smoke harness


@dataclass
class ImageFacts:
    python: str
    site_dirs: list[str]
    distributions: dict[str, str]  # canonical name -> version
    objects: list[dict[str, Any]]
    torch: dict[str, Any] | None
    pip_check: dict[str, Any]
    py_digests: dict[str, dict[str, Any]] = field(default_factory=dict)  # the twin check's

    @classmethod
    def from_probe(cls, data: dict[str, Any]) -> "ImageFacts":
        from packaging.utils import canonicalize_name

        return cls(python=data["python"], site_dirs=data["site_dirs"],
                   distributions={canonicalize_name(k): v
                                  for k, v in data["distributions"].items()},
                   objects=data["objects"], torch=data["torch"], pip_check=data["pip_check"],
                   py_digests=data.get("py_digests") or {})


def parse_probe_output(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise StageFailure("the audit probe printed no result; its output ends with:\n"
                       + proc.tail(output, 30))


def host_tool_mounts() -> list[Any]:
    """pyelftools (pure Python) and the uv binary from the host, read-only, for the probe."""
    import elftools

    from ..engine import docker as engine
    from .lock import uv_bin

    return [engine.Mount(str(Path(elftools.__file__).resolve().parent),
                         f"{AUDIT_MOUNT}/py/elftools"),
            engine.Mount(str(Path(uv_bin()).resolve()), f"{AUDIT_MOUNT}/uv"),
            engine.Mount(str(HARNESS_DIR), HARNESS_MOUNT, read_only=True)]


def probe_args() -> list[str]:
    from ..model.coverage import FATBIN_MAGIC

    return ["-m", PROBE_PROGRAM, AUDIT_MOUNT, MARKER, FATBIN_MAGIC.hex()]


NATIVE_MOUNT = f"{AUDIT_MOUNT}/native"  # this machine's Python, for an emulated image's probe


@dataclass(frozen=True)
class NativePython:
    """This machine's Python interpreter as a program that any container on this host can
    run, whatever the image's CPU: its prefix (binary, libpython, standard library) and the
    system library directory of its loader, mounted read-only, started through that loader
    (the kernel runs it natively; nothing of the image's libc is used)."""

    prefix: Path  # sys.base_prefix
    binary: Path  # under prefix
    loader: Path  # the PT_INTERP of the binary, resolved
    library_dir: Path  # the loader's directory (libc and the rest of the system's libraries)

    def mounts(self) -> list[Any]:
        from ..engine import docker as engine

        return [engine.Mount(str(self.prefix), f"{NATIVE_MOUNT}/prefix"),
                engine.Mount(str(self.library_dir), f"{NATIVE_MOUNT}/lib")]

    def loader_argv(self) -> list[str]:
        """How a program of this machine starts in the container: through its own loader."""
        return [f"{NATIVE_MOUNT}/lib/{self.loader.name}", "--library-path",
                f"{NATIVE_MOUNT}/prefix/lib:{NATIVE_MOUNT}/lib"]

    def entrypoint(self) -> list[str]:
        return [*self.loader_argv(),
                f"{NATIVE_MOUNT}/prefix/{self.binary.relative_to(self.prefix)}"]

    def env(self, image_python: str = "python3") -> dict[str, str]:
        return {"PYTHONHOME": f"{NATIVE_MOUNT}/prefix", "PYTHONNOUSERSITE": "1",
                "PYTHONDONTWRITEBYTECODE": "1", "INFERMATRIX_PROBE_PYTHON": image_python,
                "INFERMATRIX_NATIVE_LOADER": json.dumps(self.loader_argv())}


@functools.cache
def native_python() -> NativePython | None:
    """This Python as a NativePython, or None when it cannot be (not a dynamic ELF program,
    its binary outside its prefix)."""
    import sys

    from elftools.elf.elffile import ELFFile

    binary = Path(os.path.realpath(sys.executable))
    prefix = Path(os.path.realpath(sys.base_prefix))
    try:
        with open(binary, "rb") as handle:
            interp = next((seg.get_interp_name() for seg in ELFFile(handle).iter_segments()
                           if seg["p_type"] == "PT_INTERP"), None)
    except Exception:  # noqa: BLE001 - not an ELF program: no native probe
        return None
    if not interp or not binary.is_relative_to(prefix):
        return None
    loader = Path(os.path.realpath(interp))
    return NativePython(prefix, binary, loader, loader.parent)


def probe_image(image: str, docker: Engine, log_path: Path | None = None,
                timeout: float = PROBE_TIMEOUT_S,
                digest_dists: Iterable[str] = (), emulated: str | None = None) -> ImageFacts:
    """Run the probe in a throw-away container of `image` (no GPU, no network needed);
    `digest_dists`: distributions whose .py files it hashes (the native twin check). An image
    whose programs run `emulated` here, on an engine of this machine, is probed by this
    machine's own Python inside its container (the image's python3 only answers for itself):
    the same files at the same paths, read at native speed (the GB10 cell's probe took ~3 min
    under QEMU). Where that Python cannot start there, the image's own runs, emulated."""
    native = native_python() if emulated and docker.is_local() else None
    if native is not None:
        code, output = _run_probe(image, digest_dists, timeout, native, docker)
        _log_probe(log_path, image, code, output, f"native {native.binary}")
        if code == 0:
            return ImageFacts.from_probe(parse_probe_output(output))
    code, output = _run_probe(image, digest_dists, timeout, None, docker)
    _log_probe(log_path, image, code, output, "the image's python3")
    if code != 0:
        raise StageFailure(f"the audit probe failed in {image} (exit {code}):\n"
                           + proc.tail(output, 30))
    return ImageFacts.from_probe(parse_probe_output(output))


def _run_probe(image: str, digest_dists: Iterable[str], timeout: float,
               native: NativePython | None, docker: Engine) -> tuple[int, str]:
    from ..engine import docker as engine

    env = {"PYTHONPATH": str(Path(HARNESS_MOUNT).parent),
           "INFERMATRIX_DIGEST_DISTS": ",".join(digest_dists), **(native.env() if native else {})}
    try:
        with docker.container(image, probe_args(),
                              entrypoint=native.entrypoint() if native else ["python3"],
                              mounts=host_tool_mounts() + (native.mounts() if native else []),
                              network="none", prefix="infermatrix-audit", env=env,
                              labels={"io.infermatrix.stage": "audit"}) as container:
            code = docker.wait_container(container, timeout=timeout)
            output = docker.container_logs(container)
    except engine.EngineError as exc:  # no such image, no python3 in it, ...
        raise StageFailure(f"cannot start the audit probe in {image}: {exc}") from None
    return code, output


def _log_probe(log_path: Path | None, image: str, code: int, output: str, how: str) -> None:
    if log_path is None:
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as sink:
        sink.write(f"# probe of {image} with {how}: exit {code}\n")
        sink.write("\n".join(ln for ln in output.splitlines() if not ln.startswith(MARKER)))
        sink.write("\n")


def copy_rounds(paths: Iterable[str]) -> list[list[str]]:
    """Split paths into rounds whose basenames are unique (copy_from_image lands each path
    under its basename): `a/_C.so` and `b/_C.so` go in two rounds."""
    rounds: list[list[str]] = []
    seen: Counter[str] = Counter()
    for path in paths:
        name = Path(path).name
        index = seen[name]
        seen[name] += 1
        while len(rounds) <= index:
            rounds.append([])
        rounds[index].append(path)
    return rounds


def device_code_of(image: str, objects: list[dict[str, Any]], state: StatePaths,
                   docker: Engine, log_path: Path | None = None) -> dict[str, DeviceCode]:
    """sha256 -> DeviceCode for the GPU objects: from the cache, else copied out of `docker`'s
    image and listed."""
    cache = DeviceCodeCache(state)
    found: dict[str, DeviceCode] = {}
    missing: dict[str, str] = {}  # path in image -> sha256
    for obj in objects:
        cached = cache.get(obj["sha256"])
        if cached is not None:
            found[obj["sha256"]] = cached
        elif obj["sha256"] not in missing.values():
            missing[obj["path"]] = obj["sha256"]
    if not missing:
        return found
    tool = find_cuobjdump()
    version = cuobjdump_version(tool)
    for batch in copy_rounds(sorted(missing)):
        with tempfile.TemporaryDirectory(prefix="infermatrix-audit-") as tmp:
            copied = docker.copy_from_image(image, batch, Path(tmp))
            for path in batch:
                if path not in copied:
                    raise StageFailure(f"{path} vanished from {image} while auditing it")
                code = list_device_code(copied[path], tool, log_path)
                cache.put(missing[path], code, version)
                found[missing[path]] = code
                copied[path].unlink()  # keep at most one batch of big files on disk
    return found


# --------------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------------

@dataclass
class Check:
    name: str  # kernels, cuda-major, torch-cuda, pins, pip-check, engine-floor
    status: Status  # pass, fail, skip
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, **self.data}


@dataclass
class AuditedObject:
    path: str  # relative to site-packages: torch/lib/libtorch_cuda.so
    package: str | None
    size: int
    code: DeviceCode
    decisions: list[Decision]
    waivers: dict[str, str] = field(default_factory=dict)  # target -> why it never loads there
    loads: dict[str, LoadVerdict] = field(default_factory=dict)  # target -> loaded-set verdict

    def fails(self, decision: Decision) -> bool:
        return not decision.covered and str(decision.target) not in self.waivers

    def group(self, decision: Decision) -> str:
        """covered | ptx-jit | not-loaded | uncovered, for one target."""
        if str(decision.target) in self.waivers:
            return NOT_LOADED_GROUP
        if not decision.covered:
            return "uncovered"
        return "ptx-jit" if decision.coverage is Coverage.PTX_JIT else "covered"

    @property
    def covered(self) -> bool:
        return not any(self.fails(d) for d in self.decisions)

    def verdict_text(self, decision: Decision, short: bool = False) -> str:
        by = decision.as_dict()["by"]
        text = decision.coverage.value + (f" ({by})" if by else "")
        waiver = self.waivers.get(str(decision.target))
        if waiver and not decision.covered:
            text += " (not loaded)" if short else f" (not loaded: {waiver})"
        return text

    def row(self) -> dict[str, Any]:
        """One flat row for the journal and the report."""
        row: dict[str, Any] = {"object": self.path, "package": self.package, "size": self.size,
                               "cubins": " ".join(a.sm for a in self.code.cubins),
                               "ptx": " ".join(a.compute for a in self.code.ptx)}
        for decision in self.decisions:
            row[str(decision.target)] = self.verdict_text(decision)
        row["covered"] = self.covered
        row["group"] = "; ".join(self.group_text(d) for d in self.decisions)
        return row

    def group_text(self, decision: Decision) -> str:
        """`not-loaded (vllm-fa3)`, `ptx-jit`, `covered` (target-prefixed with several)."""
        load = self.loads.get(str(decision.target))
        group = self.group(decision)
        text = group + (f" ({load.entry})" if load and load.entry and group == NOT_LOADED_GROUP
                        else "")
        return text if len(self.decisions) == 1 else f"{decision.target}: {text}"


@dataclass
class AuditResult:
    cell_id: str
    image: str
    targets: list[Arch]
    objects: list[AuditedObject] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)  # probe, device code, Triton

    @property
    def status(self) -> str:
        return FAIL if any(c.status == FAIL for c in self.checks) else PASS

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def uncovered(self) -> list[str]:
        """`object (target)` for every object a target cannot run."""
        return [f"{o.path} ({', '.join(str(d.target) for d in o.decisions if o.fails(d))})"
                for o in self.objects if not o.covered]

    def groups(self) -> dict[str, dict[str, Any]]:
        """Per target: the covered count, the PTX-JIT objects, the objects data says are not
        loaded (with entry, reason and source) and the uncovered ones."""
        return {str(t): object_groups(self.objects, t) for t in self.targets}

    @property
    def reason(self) -> str | None:
        failed = [f"{c.name}: {c.detail}" for c in self.checks if c.status == FAIL]
        return "; ".join(failed) if failed else None

    def as_dict(self) -> dict[str, Any]:
        return {"cell": self.cell_id, "image": self.image, "status": self.status,
                "targets": [str(t) for t in self.targets],
                "checks": [c.as_dict() for c in self.checks],
                "coverage": [o.row() for o in self.objects],
                "groups": self.groups(),
                "uncovered": self.uncovered, "versions": self.versions,
                "duration_s": round(self.duration_s, 3),
                "phase_s": {k: round(v, 1) for k, v in self.phase_s.items()}}


# --------------------------------------------------------------------------------------------
# The checks (pure: facts in, Check out)
# --------------------------------------------------------------------------------------------

def object_groups(objects: list[AuditedObject], target: Arch) -> dict[str, Any]:
    groups: dict[str, Any] = {"covered": [], "ptx-jit": [], NOT_LOADED_GROUP: [], "uncovered": []}
    for obj in objects:
        decision = next((d for d in obj.decisions if d.target == target), None)
        if decision is None:
            continue
        group = obj.group(decision)
        if group == NOT_LOADED_GROUP:
            load = obj.loads.get(str(target))
            groups[group].append({"object": obj.path, "coverage": decision.coverage.value,
                                  "entry": load.entry if load else None,
                                  "key": (load.key if load else "") or "waived",
                                  "reason": obj.waivers[str(target)],
                                  "source": load.source if load else ""})
        elif group == "ptx-jit":
            groups[group].append({"object": obj.path, "ptx": decision.by.compute
                                  if decision.by else None, "jit_cost": decision.note})
        elif group == "uncovered":
            groups[group].append({"object": obj.path, "package": obj.package,
                                  "note": decision.note, "key": uncovered_key(obj.code, target)})
        else:
            groups[group].append(obj.path)
    groups["counts"] = {"covered": len(groups["covered"]), "ptx-jit": len(groups["ptx-jit"]),
                        NOT_LOADED_GROUP: len(groups[NOT_LOADED_GROUP]),
                        "uncovered": len(groups["uncovered"])}
    return groups


def uncovered_key(code: DeviceCode, target: Arch) -> str:
    """Short key of why an object cannot run on `target`: `no-gpu-code`, `sm_120a-only`,
    `built-for-sm_80-sm_90`, or `ptx-compute_100-too-new`."""
    if not code.cubins and not code.ptx:
        return "no-gpu-code"
    if code.cubins and all(a.sm.endswith("a") for a in code.cubins) and not code.ptx:
        return f"{'-'.join(a.sm for a in code.cubins)}-only"
    if code.ptx and not code.cubins:
        return f"ptx-{'-'.join(a.compute for a in code.ptx)}-not-for-{target.sm}"
    return f"built-for-{'-'.join(dict.fromkeys(a.sm for a in code.cubins))}"


def check_kernels(objects: list[AuditedObject], targets: list[Arch]) -> Check:
    """Objects loaded (or not known to be unloaded) must cover every target; PTX-JIT ones are
    flagged with their JIT cost; the ones data says are not loaded are listed with why."""
    if not objects:
        return Check("kernels", FAIL, "no shared object with GPU code found under site-packages")
    bad = [o for o in objects if not o.covered]
    waived = []
    for obj in objects:
        idle = [str(d.target) for d in obj.decisions if obj.group(d) == NOT_LOADED_GROUP]
        reasons = dict.fromkeys(obj.waivers[t] for t in idle)
        if idle:
            waived.append(f"{obj.path} on {', '.join(idle)}: {' / '.join(reasons)}")
    jit = [o for o in objects if any(o.group(d) == "ptx-jit" for d in o.decisions)]
    names = ", ".join(str(t) for t in targets)
    groups = {str(t): object_groups(objects, t) for t in targets}
    data = {"objects": len(objects), "uncovered": [o.path for o in bad],
            "ptx_jit": [o.path for o in jit], "not_loaded": waived,
            "counts": {t: g["counts"] for t, g in groups.items()}}
    counts = "; ".join(f"{t}: {c['covered']} covered, {c['ptx-jit']} PTX-JIT, "
                       f"{c[NOT_LOADED_GROUP]} not loaded" for t, c in data["counts"].items())
    if bad:
        listed = "; ".join(f"{o.path} [{o.package or '?'}]: {d.note}"
                           for o in bad for d in o.decisions if o.fails(d))
        return Check("kernels", FAIL, f"{len(bad)} of {len(objects)} objects do not run on "
                     f"{names}: {listed}", data)
    detail = f"{len(objects)} objects cover {names} ({counts})"
    if jit:
        detail += (f"; {len(jit)} only through PTX JIT (the driver compiles them at first load: "
                   "slower first start): " + ", ".join(o.path for o in jit))
    if waived:
        detail += f"; {len(waived)} not loaded there (loaded.yaml / audit.not_loaded): " + \
            "; ".join(waived)
    return Check("kernels", PASS, detail, data)


def cuda_majors(facts: ImageFacts, chosen_at_run_time: Iterable[str] = ()) -> dict[int, list[str]]:
    """CUDA major -> the evidence (linked sonames, bundled libraries, NVIDIA wheels). Objects in
    `chosen_at_run_time` (builds for another CUDA major that their package never loads on this
    CUDA, by loaded.yaml) are no evidence."""
    skip = set(chosen_at_run_time)
    found: dict[int, list[str]] = defaultdict(list)
    for obj in facts.objects:
        if obj["rel"] in skip:
            continue
        for needed in obj.get("needed", []):
            match = _CUDA_SONAME.match(needed)
            if match:
                found[int(match.group(2))].append(f"{obj['rel']} links {needed}")
        match = _CUDA_SONAME.match(Path(obj["rel"]).name)
        if match:
            found[int(match.group(2))].append(f"bundles {obj['rel']}")
    for name, version in facts.distributions.items():
        match = _CUDA_WHEEL.match(name)
        if match:
            major = int(match.group(2)) if match.group(2) else int(version.split(".")[0])
            found[major].append(f"wheel {name}=={version}")
    return dict(found)


def runtime_chosen_builds(facts: ImageFacts, load_ctx: loadedset.Context) -> dict[str, str]:
    """rel path -> why: builds for another CUDA major that their package does not load here."""
    chosen = {}
    for obj in facts.objects:
        found = loadedset.verdict(obj["rel"], None, load_ctx)
        if found.runtime_cuda:
            chosen[obj["rel"]] = f"{found.reason} ({found.source})"
    return chosen


def check_cuda_major(facts: ImageFacts, cuda: str,
                     chosen_at_run_time: dict[str, str] | None = None) -> Check:
    expected = int(cuda.split(".")[0])
    chosen_at_run_time = chosen_at_run_time or {}
    majors = cuda_majors(facts, chosen_at_run_time)
    if not majors:
        return Check("cuda-major", FAIL, "no CUDA runtime library linked or bundled in the image")
    others = {m: ev for m, ev in majors.items() if m != expected}
    data = {"majors": {str(m): sorted(set(ev))[:20] for m, ev in majors.items()},
            "chosen_at_run_time": chosen_at_run_time}
    if others:
        evidence = "; ".join(f"CUDA {m}: " + ", ".join(sorted(set(ev))[:5])
                             for m, ev in sorted(others.items()))
        return Check("cuda-major", FAIL, f"the cell is CUDA {cuda} but the image mixes in "
                     f"{evidence}", data)
    detail = f"every CUDA runtime library is CUDA {expected}"
    if chosen_at_run_time:
        detail += (f"; {len(chosen_at_run_time)} builds for another CUDA major are never loaded "
                   "here (chosen at run time): " + ", ".join(sorted(chosen_at_run_time)))
    return Check("cuda-major", PASS, detail, data)


def check_torch_cuda(facts: ImageFacts, cuda: str, emulated: str | None = None) -> Check:
    """torch.version.cuda is the cell's CUDA. Under emulation (`emulated`: why, e.g. "linux/arm64
    under QEMU on linux/amd64") an import that cannot run there is no finding about the image:
    torch/version.py, which torch.version.cuda reads, answers instead, and the detail says so."""
    if facts.torch is None:
        return Check("torch-cuda", FAIL, "torch is not installed")
    torch_facts, how = facts.torch, ""
    if "error" in facts.torch:
        static = facts.torch.get("static")
        if not (emulated and static and static.get("cuda")):
            return Check("torch-cuda", FAIL,
                         "import torch failed: " + proc.tail(facts.torch["error"], 5))
        torch_facts = static
        how = (f" (read from torch/version.py: `import torch` cannot run {emulated}: "
               f"{proc.tail(facts.torch['error'], 1)})")
    got = torch_facts.get("cuda")
    data = {"torch": torch_facts.get("version"), "torch_cuda": got,
            "arch_list": torch_facts.get("arch_list"), "emulated": emulated,
            "import_error": proc.tail(facts.torch["error"], 5) if how else None}
    if got is None or ".".join(str(got).split(".")[:2]) != cuda:
        return Check("torch-cuda", FAIL, f"torch.version.cuda is {got}, the cell is CUDA {cuda}",
                     data)
    return Check("torch-cuda", PASS,
                 f"torch {torch_facts.get('version')} built for CUDA {got}{how}", data)


def expected_pins(ctx: "Context", plan: CellPlan) -> dict[str, tuple[str, str]]:
    """canonical name -> (version, where the pin comes from): the lock, then the cell."""
    from packaging.utils import canonicalize_name

    from ..model.spec import MATCH_ENGINE

    pins: dict[str, tuple[str, str]] = {}
    cell = plan.cell
    spec = ctx.spec(plan) if plan.settings is not None else None
    if spec is not None:
        for name, version in spec.lock_pins.items():
            pins[name] = (version, f"lock {spec.lock_path.name}")
    pins["torch"] = (cell.torch, "cell axis torch")
    if spec is not None and spec.engine_package:
        pins[canonicalize_name(spec.engine_package)] = (cell.engine_version, "cell axis engine")
    for kernel in (spec.kernels if spec else ()):
        if kernel.declared and kernel.scope != MATCH_ENGINE:
            pins[canonicalize_name(kernel.package)] = (kernel.declared,
                                                       f"build.kernels.{kernel.name}")
    return pins


def version_matches(pinned: str, installed: str) -> bool:
    """`==pinned` in PEP 440 terms: 2.11.0 accepts 2.11.0+cu130; 2.11.0+cu130 wants exactly it."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(f"=={pinned}").contains(installed, prereleases=True)
    except InvalidSpecifier:
        return pinned == installed


def check_pins(facts: ImageFacts,
               pins: dict[str, tuple[str, str]]) -> tuple[Check, dict[str, str]]:
    wrong, missing, versions = [], [], {}
    for name, (pinned, source) in sorted(pins.items()):
        installed = facts.distributions.get(name)
        if installed is None:
            missing.append(f"{name}=={pinned} ({source})")
            continue
        versions[name] = installed
        if not version_matches(pinned, installed):
            wrong.append(f"{name}: pinned {pinned} ({source}), installed {installed}")
    data = {"checked": len(pins), "mismatched": wrong, "missing": missing}
    if wrong or missing:
        parts = list(wrong)
        if missing:
            shown = "; ".join(missing[:8]) + (f"; and {len(missing) - 8} more" if len(missing) > 8
                                              else "")
            parts.append(f"{len(missing)} pinned packages not installed: {shown}")
        return Check("pins", FAIL, "; ".join(parts), data), versions
    return Check("pins", PASS, f"{len(pins)} pinned packages installed at their pins", data), \
        versions


def no_deps_packages(ctx: "Context", plan: CellPlan) -> list[str]:
    engine = ctx.matrix.engines.get(plan.cell.engine, {})
    return list(engine.get("install", {}).get("no_deps", []))


def check_pip(facts: ImageFacts, waived: Iterable[str] = ()) -> Check:
    """`pip check` must be clean, except for packages the matrix installs with --no-deps on
    purpose (their unmet requirements are waived and listed)."""
    from packaging.utils import canonicalize_name

    result = facts.pip_check
    waived_names = {canonicalize_name(w) for w in waived}
    lines = [ln.strip() for ln in result.get("output", "").splitlines() if ln.strip()]
    problems = [ln for ln in lines if _pip_problem(ln)]
    sbsa = _sbsa_tagged(result)
    kept = [ln for ln in problems if canonicalize_name(_pip_subject(ln)) not in waived_names
            and _pip_subject(ln) not in sbsa]
    waived_lines = [ln for ln in problems if ln not in kept and _pip_subject(ln) not in sbsa]
    data = {"tool": result.get("tool"), "command": result.get("command"),
            "returncode": result.get("returncode"), "waived": waived_lines,
            "sbsa_tagged": sorted(sbsa)}
    if kept or (result.get("returncode") != 0 and not problems):
        return Check("pip-check", FAIL, "; ".join(kept) or proc.tail(result.get("output", ""), 5),
                     data)
    detail = f"{result.get('tool')} check clean"
    if waived_lines:
        detail += " (waived, installed with --no-deps: " + "; ".join(waived_lines) + ")"
    if sbsa:
        detail += (f"; {len(sbsa)} NVIDIA wheel(s) whose WHEEL file says `*_sbsa` (Arm's "
                   f"server architecture: aarch64) where the file name the installer matched "
                   f"says aarch64, accepted on {result.get('machine')}: " + ", ".join(sorted(sbsa)))
    return Check("pip-check", PASS, detail, data)


def _sbsa_tagged(result: dict[str, Any]) -> set[str]:
    """Packages pip/uv check calls "built for a different platform" only because their WHEEL
    file's tags are all `..._sbsa` (NVIDIA's name for aarch64 servers, e.g. nvidia-cusparselt-cu13
    0.8.1: `py3-none-manylinux2014_sbsa`), read from the image on an aarch64 interpreter."""
    if result.get("machine") != "aarch64":
        return set()
    return {name for name, tags in (result.get("wheel_tags") or {}).items()
            if tags and all(tag.endswith("_sbsa") for tag in tags)}


def _pip_subject(line: str) -> str:
    """The package a problem line is about: `The package `x` requires ...` (uv) or `x 1.0 has
    requirement ...` / `x 1.0 requires ...` (pip)."""
    match = re.match(r"^The package `([^`]+)`", line)
    return match.group(1) if match else line.split()[0]


def _pip_problem(line: str) -> bool:
    """A problem line of `pip check` / `uv pip check` output (not a summary or a header)."""
    lowered = line.lower()
    if lowered.startswith(("no broken requirements", "checked ", "found ", "all installed",
                           "using python", "warning")):
        return False
    return any(k in lowered for k in (" requires ", " has requirement ", "is not installed",
                                      " which is not", "but you have", "is incompatible",
                                      "the package", "requirement"))


def check_floor(ctx: "Context", plan: CellPlan, facts: ImageFacts) -> Check:
    from packaging.utils import canonicalize_name

    package = plan.settings.engine_package if plan.settings else None
    floor = ctx.matrix.floors.get(plan.cell.engine)
    if not package:
        return Check("engine-floor", SKIP, f"engine {plan.cell.engine} installs no package")
    if floor is None:
        return Check("engine-floor", SKIP, f"model.floors names no floor for {plan.cell.engine}")
    installed = facts.distributions.get(canonicalize_name(package))
    if installed is None:
        return Check("engine-floor", FAIL, f"{package} is not installed")
    if not floor.contains(installed, prereleases=True):
        return Check("engine-floor", FAIL, f"{package} {installed} is below the model card's "
                     f"floor {floor}")
    return Check("engine-floor", PASS, f"{package} {installed} meets {floor}")


def load_context(ctx_matrix_data: dict[str, Any], facts: ImageFacts, cuda: str | None,
                 model: str | None) -> loadedset.Context:
    """What loaded.yaml's verdicts depend on: installed versions, CUDA major, model traits."""
    traits = loadedset.model_traits(model)
    major = int(cuda.split(".")[0]) if cuda and cuda[0].isdigit() else None
    return loadedset.Context(
        distributions=facts.distributions, cuda_major=major,
        traits=tuple(traits["traits"]) if traits else None,
        linked={name for obj in facts.objects for name in obj.get("needed", [])},
        entries=loadedset.entries(ctx_matrix_data))


def audited_objects(facts: ImageFacts, codes: dict[str, DeviceCode], targets: list[Arch],
                    load_ctx: loadedset.Context | None = None) -> list[AuditedObject]:
    load_ctx = load_ctx or load_context({}, facts, None, None)
    objects = []
    for obj in facts.objects:
        if not obj.get("gpu_code"):
            continue
        code = codes[obj["sha256"]]
        if code.empty:  # a fat binary section with nothing cuobjdump can list
            continue
        loads = {str(t): loadedset.verdict(obj["rel"], t, load_ctx) for t in targets}
        waivers = {t: f"{v.reason} (loaded.yaml {v.entry}; {v.source})" if v.source
                   else f"{v.reason} ({v.entry})"
                   for t, v in loads.items() if not v.counts_as_loaded}
        objects.append(AuditedObject(obj["rel"], obj.get("dist"), obj["size"], code,
                                     [decide(code, t) for t in targets], waivers, loads))
    return objects


def recorded_mapped(ctx: "Context", cell_id: str, image: str, docker: Engine
                    ) -> dict[str, Any] | None:
    """The objects the `model` smoke level saw the server map, for this very image."""
    stage = journal.load(ctx.state, cell_id).get("stages", {}).get("smoke") or {}
    details = stage.get("details") or {}
    mapped = ((details.get("levels") or {}).get("model") or {}).get("mapped")
    if not mapped or details.get("image_id") not in (image, _image_id(image, docker)):
        return None
    return mapped


def _image_id(ref: str, docker: Engine) -> str | None:
    try:
        return docker.image_id_of(ref)
    except Exception:  # noqa: BLE001 - no engine: no observation to match
        return None


def check_loaded_set(mapped: dict[str, Any] | None, targets: list[Arch],
                     load_ctx: loadedset.Context, rows: list[dict[str, Any]]) -> Check:
    """The server's mapped objects (when the model level recorded them) against loaded.yaml
    and the coverage verdicts."""
    if mapped is None:
        return Check("loaded-set", SKIP, "no server observation recorded for this image yet "
                     "(the model smoke level records /proc/<pid>/maps)")
    judged = loadedset.judge_mapped(mapped.get("objects", []), targets, load_ctx, rows)
    return Check("loaded-set", judged.status, judged.detail,
                 {"mapped": len(mapped.get("objects", [])), "notes": judged.notes,
                  "problems": judged.problems})


# --------------------------------------------------------------------------------------------
# Observation: the objects a running server maps (the `model` smoke level calls this)
# --------------------------------------------------------------------------------------------

MAPS_PROBE = r"""
import importlib.metadata as md, json, os, sys
me, procs = os.getpid(), []
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    if int(pid) == me:
        continue
    try:
        with open(f"/proc/{pid}/maps") as handle:
            maps = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmd = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        continue
    paths = set()
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
            paths.add(parts[5].replace(" (deleted)", ""))
    procs.append({"pid": int(pid), "cmd": cmd[:300], "paths": sorted(paths)})
dists = {d.metadata["Name"]: d.version for d in md.distributions()}
print(sys.argv[1] + json.dumps({"processes": procs, "distributions": dists}))
"""


def server_mapped_objects(docker: Engine, container_id: str) -> dict[str, Any]:
    """/proc/<pid>/maps of every process in the server's container (the server and its
    workers), read by the image's python3 through `docker exec`."""
    from packaging.utils import canonicalize_name

    code, output = docker.exec_in_container(container_id, ["python3", "-c", MAPS_PROBE, MARKER])
    if code != 0:
        raise StageFailure(f"reading the server's /proc/<pid>/maps failed (exit {code}): "
                           + proc.tail(output, 10))
    data = parse_probe_output(output)
    objects: set[str] = set()
    outside = set()
    processes = []
    for process in data["processes"]:
        rel = [loadedset.site_relative(p) for p in process["paths"]]
        objects.update(r for r in rel if r)
        outside.update(p for p, r in zip(process["paths"], rel) if not r)
        processes.append({"pid": process["pid"], "cmd": process["cmd"],
                          "site_objects": sum(1 for r in rel if r),
                          "other_objects": sum(1 for r in rel if not r)})
    return {"objects": sorted(objects), "other": len(outside), "processes": processes,
            "distributions": {canonicalize_name(k): v for k, v in data["distributions"].items()}}


def judge_server_maps(ctx: "Context", plan: CellPlan, mapped: dict[str, Any]) -> dict[str, Any]:
    """The observation against loaded.yaml and the audit recorded for the cell (its coverage
    rows): status, detail, problems, notes."""
    cell = plan.cell
    facts = ImageFacts("", [], mapped.get("distributions", {}), [], None, {})
    load_ctx = load_context(ctx.matrix.data, facts, cell.cuda if cell.is_gpu else None,
                            (ctx.matrix.model or {}).get("name"))
    recorded = (journal.load(ctx.state, cell.id).get("stages", {}).get("audit") or {})
    rows = (recorded.get("details") or {}).get("coverage", [])
    judged = loadedset.judge_mapped(mapped.get("objects", []), default_targets(plan), load_ctx,
                                    rows)
    return judged.as_dict()


# --------------------------------------------------------------------------------------------
# Triton shared memory (harness/triton_smem.py in a container of the image, no GPU)
# --------------------------------------------------------------------------------------------

TRITON_TIMEOUT_S = 1200


def shared_memory_limits() -> tuple[dict[str, int], str]:
    """Per-block shared memory by arch (rules.yaml attention-backend-arch), and its source."""
    from ..model.rules import load_rules

    spec = load_rules()["attention-backend-arch"]["shared_memory_per_block"]
    return {k: int(v) for k, v in spec["bytes"].items()}, spec["source"]


def triton_smem_args(engine_name: str, backend: str | None, targets: list[Arch],
                     model: str | None, serve_args: Iterable[str] = ()) -> list[str] | None:
    """The harness command line for a cell; None when no limit is known for a target. The
    cell's serve arguments go along: a flag such as --gdn-prefill-backend changes the path
    the engine takes, so the audit follows it."""
    limits, _ = shared_memory_limits()
    traits = loadedset.model_traits(model) or {}
    args = ["--engine", engine_name, "--backend", backend or "default"]
    for target in targets:
        if target.sm not in limits:
            return None
        args += ["--arch", f"{target.sm}={limits[target.sm]}"]
    for flag, key in (("--head-dim", "head_dim"), ("--q-heads", "num_q_heads"),
                      ("--kv-heads", "num_kv_heads"), ("--vision-head-dim", "vision_head_dim"),
                      ("--vision-heads", "vision_heads"), ("--gdn-key-heads", "gdn_key_heads"),
                      ("--gdn-value-heads", "gdn_value_heads"),
                      ("--gdn-head-dim", "gdn_head_dim"), ("--gdn-conv-width", "gdn_conv_width")):
        if key in traits:
            args += [flag, str(traits[key])]
    return args + [f"--serve-arg={arg}" for arg in serve_args]


def judge_triton(result: dict[str, Any] | None, backend: str | None, output: str = "") -> Check:
    """The harness result as a check. Kernels that could not be driven make it `skip`, except
    when the cell's rule-chosen backend is triton: then the choice is unverified and fails."""
    _, source = shared_memory_limits()
    if result is None:
        return Check("triton-smem", FAIL, "the Triton shared-memory harness printed no result: "
                     + proc.tail(output, 10))
    per_kernel = [{"arch": a.get("arch"), "family": f.get("family"), "kernel": k.get("kernel"),
                   "shared": k.get("shared"), "limit": k.get("limit"),
                   "num_warps": k.get("num_warps"), "num_stages": k.get("num_stages")}
                  for a in result.get("archs", []) for f in a.get("families", [])
                  for k in f.get("kernels", [])]
    summary = [{"arch": a.get("arch"), **row} for a in result.get("archs", [])
               for f in a.get("families", []) for row in f.get("summary", [])]
    data = {"backend": backend, "kernels": per_kernel, "summary": summary,
            "paths": {a.get("arch"): a.get("paths", {}) for a in result.get("archs", [])},
            "first_start": {a.get("arch"): a.get("first_start", [])
                            for a in result.get("archs", [])},
            "notes": [f"{a.get('arch')}: {n}" for a in result.get("archs", [])
                      for n in a.get("notes", [])],
            "limit_source": source,
            "archs": [{k: v for k, v in a.items()
                       if k not in ("families", "paths", "first_start", "notes")} |
                      {"not_driven": [f"{f['family']}: {f.get('reason')}"
                                      for f in a.get("families", []) if not f.get("driven")]}
                      for a in result.get("archs", [])]}
    status = result.get("status", FAIL)
    sizes = ", ".join(f"{k['kernel']}[{k['family']}]@{k['arch']} {k['shared']} B"
                      for k in per_kernel)
    if status == PASS:
        return Check("triton-smem", PASS, f"every Triton kernel of the serve path fits the "
                     f"per-block shared memory ({triton_digest(summary) or sizes})"
                     + first_start_digest(data["first_start"]), data)
    if status == SKIP and backend != "triton":
        return Check("triton-smem", SKIP, str(result.get("reason")), data)
    reason = str(result.get("reason"))
    if status == SKIP:
        reason = "the cell's attention backend is triton but its kernels were not verified: " \
            + reason
    return Check("triton-smem", FAIL, reason, data)


def triton_digest(summary: list[dict[str, Any]]) -> str:
    """`kernel[family]@arch min-max B (configs, over)` per kernel, short enough to read."""
    parts = []
    for row in summary:
        size = (f"{row['min_shared']} B" if row["min_shared"] == row["max_shared"]
                else f"{row['min_shared']}-{row['max_shared']} B")
        tuned = f", {row['configs']} configs, {row['over']} over" if row["autotuned"] else ""
        parts.append(f"{row['kernel']}[{row['family']}]@{row['arch']} {size}{tuned}")
    return ", ".join(parts)


def first_start_digest(first: dict[str, list[dict[str, Any]]]) -> str:
    """What the engine compiles at first start, named in the verdict (never passed silently)."""
    seen = dict.fromkeys(item["what"] + (f" for {arch} ({item['count']} kernels, "
                                         f"{item['configs']} configs, "
                                         f"{item['compile_s_here']} s to compile here)"
                                         if "count" in item else "")
                         for arch, items in first.items() for item in items)
    return f"; compiled at first start: {'; '.join(seen)}" if seen else ""


def emulation_of(image: str, docker: Engine) -> str | None:
    """Why programs of this image run emulated here ("linux/arm64 under QEMU on linux/amd64"),
    or None when the image is for this host's CPU."""
    from ..engine import docker as engine

    info = docker.inspect_image(image) or {}
    platform = f"{info.get('Os', 'linux')}/{info.get('Architecture', '')}"
    host = engine.host_platform()
    if not info.get("Architecture") or platform == host:
        return None
    return f"{platform} under QEMU on {host}"


def check_triton_smem(image: str, docker: Engine, engine_name: str, backend: str | None,
                      targets: list[Arch],
                      model: str | None, log_path: Path | None = None,
                      timeout: float = TRITON_TIMEOUT_S, emulated: str | None = None,
                      serve_args: Iterable[str] = (), extra_archs: Iterable[Arch] = ()) -> Check:
    """The harness for `targets` (and `extra_archs`, a twin's foreign archs, compiled and
    recorded under data["harness"] but not judged here)."""
    from ..harness import _result as harness_result

    if engine_name not in ("sglang", "vllm"):
        return Check("triton-smem", SKIP, f"engine {engine_name}: no Triton attention kernels "
                     "known to the harness")
    extra_archs = list(extra_archs)
    args = triton_smem_args(engine_name, backend, [*targets, *extra_archs], model, serve_args)
    if args is None:
        return Check("triton-smem", SKIP, "no shared-memory limit recorded for "
                     + ", ".join(t.sm for t in targets) + " (rules.yaml)")
    try:
        output = run_triton_harness(image, args, timeout, docker)
    except StageFailure:
        return Check("triton-smem", FAIL, f"the Triton compile check ran over {timeout:.0f} s")
    if log_path is not None:
        with open(log_path, "a", encoding="utf-8") as sink:
            sink.write(f"# harness.triton_smem {' '.join(args)}\n{output}\n")
    parsed = harness_result.parse(output)
    if emulated and not_started(parsed):  # torch/Triton cannot start under qemu-user
        return Check("triton-smem", SKIP, f"not verified here: the harness cannot run {emulated} "
                     f"({proc.tail(output, 1)}); run the audit on a native host of the image's "
                     "CPU", {"backend": backend, "emulated": emulated})
    own = tritontwin.restrict_to_archs(parsed, [t.sm for t in targets]) \
        if parsed is not None and extra_archs else parsed
    check = judge_triton(own, backend, output)
    if parsed is not None:
        check.data["harness"] = parsed
    return check


def serve_paths(image: str, docker: Engine, engine_name: str, targets: list[Arch],
                model: str | None, serve_args: Iterable[str]) -> dict[str, Any]:
    """The backend choices the engine makes for this serve command on each target (the
    harness's --paths-only: its own selection logic in a container of the image, no compile)."""
    from ..harness import _result as harness_result

    args = triton_smem_args(engine_name, None, targets, model, serve_args) or []
    output = run_triton_harness(image, [*args, "--paths-only"], TRITON_TIMEOUT_S, docker)
    parsed = harness_result.parse(output) or {}
    return {a.get("arch"): a.get("paths", {}) for a in parsed.get("archs", [])}


def run_triton_harness(image: str, args: list[str], timeout: float, docker: Engine) -> str:
    """harness.triton_smem in a container of the image, no network; its output. StageFailure
    when it runs over `timeout` (the container is removed either way)."""
    from ..engine import docker as engine

    mount = engine.Mount(str(HARNESS_DIR), HARNESS_MOUNT, read_only=True)
    container = docker.run_container(
        image, args, entrypoint=["python3", "-m", "harness.triton_smem"], mounts=[mount],
        network="none", env={"PYTHONPATH": str(Path(HARNESS_MOUNT).parent)},
        labels={"io.infermatrix.stage": "audit"})
    try:
        docker.wait_container(container, timeout=timeout)
        return docker.container_logs(container)
    finally:
        docker.remove_container(container)


def not_started(result: dict[str, Any] | None) -> bool:
    """The harness printed nothing, or every arch's compile process died before a result (a
    crash, not a measured kernel): nothing about the kernels was learnt."""
    if result is None:
        return True
    archs = result.get("archs") or []
    return bool(archs) and all(a.get("crashed") for a in archs)


# --------------------------------------------------------------------------------------------
# The stage
# --------------------------------------------------------------------------------------------

def parse_targets(values: Iterable[str] | None) -> list[Arch] | None:
    if not values:
        return None
    try:
        return [Arch.parse(v).device for v in values]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def default_targets(plan: CellPlan) -> list[Arch]:
    return [Arch.parse(plan.cell.arch).device] if plan.cell.is_gpu else []


def audit_cell(ctx: "Context", plan: CellPlan, image_ref: str,
               targets: Iterable[Arch | str] | None = None, *, record: bool = True,
               twin_archs: Iterable[str] = (), docker: Engine | None = None) -> AuditResult:
    """Audit one built image of `docker` (default DOCKER_HOST / the current context) against
    its cell; record it in the journal (stage `audit`). `twin_archs`: archs of foreign-CPU
    cells this native cell is the twin of (tritontwin): its Triton check compiles for them
    too, for those cells to adopt."""
    started = time.monotonic()
    docker = docker or Engine()
    cell = plan.cell
    arch_targets = [Arch.parse(t).device if isinstance(t, str) else t.device
                    for t in targets] if targets else default_targets(plan)
    log_path = ctx.state.cell_log(cell.id, "audit")
    result = AuditResult(cell.id, image_ref, arch_targets)
    runs_emulated = emulation_of(image_ref, docker)
    emulated = runs_emulated if cell.is_gpu else None
    extra = [Arch.parse(a).device for a in twin_archs
             if a not in {t.sm for t in arch_targets}]
    # under emulation Triton cannot start: a native twin's recorded result is looked for first
    triton = start_triton_check(ctx, plan, image_ref, arch_targets, log_path, extra, docker) \
        if cell.is_gpu and not emulated else None
    try:
        with Heartbeat(f"{cell.id}: audit probe of {image_ref[:19]}"):
            facts = probe_image(image_ref, docker, log_path, digest_dists=tritontwin.digest_distributions(
                plan.settings.engine_package if plan.settings else None) if cell.is_gpu else (),
                emulated=runs_emulated)
        result.phase_s["probe"] = time.monotonic() - started
        load_ctx = load_context(ctx.matrix.data, facts, cell.cuda if cell.is_gpu else None,
                                (ctx.matrix.model or {}).get("name"))
        if cell.is_gpu:
            gpu = [o for o in facts.objects if o.get("gpu_code")]
            mark = time.monotonic()
            codes = device_code_of(image_ref, gpu, ctx.state, docker, log_path)
            result.phase_s["device_code"] = time.monotonic() - mark
            result.objects = audited_objects(facts, codes, arch_targets, load_ctx)
            result.checks.append(check_kernels(result.objects, arch_targets))
            result.checks.append(check_cuda_major(facts, cell.cuda,
                                                  runtime_chosen_builds(facts, load_ctx)))
            result.checks.append(check_torch_cuda(facts, cell.cuda, emulated))
            mark = time.monotonic()
            if triton is None:
                triton_check = twin_or_own_triton_check(ctx, plan, image_ref, arch_targets,
                                                        log_path, facts, emulated, docker)
            else:
                triton_check = triton.result()
                triton_check.data.update(python=facts.python, py_digests=facts.py_digests)
            result.checks.append(triton_check)
            result.phase_s["triton_wait"] = time.monotonic() - mark  # beyond the overlap
            result.phase_s["triton"] = triton_check.data.get("seconds", 0.0)
        else:
            reason = "arch cpu: no GPU code to audit"
            result.checks += [Check("kernels", SKIP, reason),
                              Check("cuda-major", SKIP, "CPU lane: torch's CUDA libraries are "
                                    "not used"),
                              Check("torch-cuda", SKIP, "CPU lane")]
        pins_check, result.versions = check_pins(facts, expected_pins(ctx, plan))
        result.checks.append(pins_check)
        result.checks.append(check_pip(facts, no_deps_packages(ctx, plan)))
        result.checks.append(check_floor(ctx, plan, facts))
        result.checks.append(check_loaded_set(recorded_mapped(ctx, cell.id, image_ref, docker),
                                              arch_targets, load_ctx,
                                              [o.row() for o in result.objects]))
    except StageFailure as exc:  # the probe or cuobjdump failed: the audit fails, with why
        result.checks.append(Check("probe", FAIL, str(exc)))
    finally:
        if triton is not None:  # a failed probe: the check still ends, its container removed
            concurrent.futures.wait([triton])
    result.duration_s = time.monotonic() - started
    if record:
        journal.record_stage(ctx.state, cell.id, "audit", result.status,
                             duration_s=result.duration_s, log=log_path, reason=result.reason,
                             details=result.as_dict())
    return result


def timed_triton_check(ctx: "Context", plan: CellPlan, image_ref: str, targets: list[Arch],
                       log_path: Path, docker: Engine, extra: Iterable[Arch] = (),
                       emulated: str | None = None) -> Check:
    """check_triton_smem for the cell, with a heartbeat and its seconds in the data."""
    cell, extra = plan.cell, list(extra)
    began = time.monotonic()
    with Heartbeat(f"{cell.id}: Triton kernels compiled for "
                   f"{', '.join(str(t) for t in [*targets, *extra])}"):
        check = check_triton_smem(
            image_ref, docker, cell.engine, plan.settings.attention_backend if plan.settings else None,
            targets, (ctx.matrix.model or {}).get("name"), log_path, emulated=emulated,
            serve_args=plan.settings.engine_args if plan.settings else (), extra_archs=extra)
    check.data["seconds"] = round(time.monotonic() - began, 1)
    return check


def start_triton_check(ctx: "Context", plan: CellPlan, image_ref: str, targets: list[Arch],
                       log_path: Path, extra: list[Arch], docker: Engine
                       ) -> concurrent.futures.Future[Check]:
    """The Triton compile check, started in a thread of its own: it needs only the image, so
    it runs while the probe and cuobjdump read the objects (both mostly one CPU each, so on a
    2-core machine the audit takes about the longer of the two instead of their sum). The
    thread talks to the audit's engine, `docker`."""
    def run() -> Check:
        return timed_triton_check(ctx, plan, image_ref, targets, log_path, docker, extra)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="infermatrix-triton")
    try:
        return pool.submit(run)
    finally:
        pool.shutdown(wait=False)


def twin_or_own_triton_check(ctx: "Context", plan: CellPlan, image_ref: str,
                             targets: list[Arch], log_path: Path, facts: ImageFacts,
                             emulated: str, docker: Engine) -> Check:
    """A cell whose image runs emulated here: the Triton result of its native twin when the
    journal holds one for these archs with identical sources (tritontwin), else the harness
    in its own image (which cannot start under qemu-user: a skip that names the fix)."""
    audits = {cell_id: (record.get("stages", {}).get("audit") or {}).get("details") or {}
              for cell_id, record in journal.load_all(ctx.state).items()}
    archs = [t.sm for t in targets]
    match, passed_over = tritontwin.adopt(plan.id, facts.python, facts.py_digests, archs,
                                          audits)
    backend = plan.settings.attention_backend if plan.settings else None
    if match is None:
        check = timed_triton_check(ctx, plan, image_ref, targets, log_path, docker,
                                   emulated=emulated)
        if check.status == SKIP:
            check.detail += ("; no native twin stands for it: " + "; ".join(passed_over)
                             if passed_over else
                             "; no native twin (a cell of the same CUDA, torch and engine "
                             "for this machine's CPU) is audited in this state directory")
        return check
    check = judge_triton(match.result, backend)
    names = ", ".join(f"{n} {d.get('version')}" for n, d in sorted(match.digests.items()))
    check.detail = (f"compiled in the image of its native twin {match.cell_id}, whose Python "
                    f"sources are identical ({names}: every .py file's sha256): "
                    + check.detail)
    check.data.update(twin={"cell": match.cell_id, "image": match.image,
                            "digests": match.digests, "emulated": emulated},
                      python=facts.python, py_digests=facts.py_digests)
    return check


def images_to_audit(ctx: "Context", plans: list[CellPlan], refs: list[str],
                    select: list[str], docker: Engine) -> list[tuple[CellPlan, str]]:
    """(plan, image) pairs to audit, from cell ids, image references (in `docker`) or the
    journal."""
    by_id = {p.id: p for p in plans}
    pairs = []
    if not refs:
        for plan in plans:
            if not plan.planned:
                continue
            image = journal.load(ctx.state, plan.id).get("image_id")
            if image:
                pairs.append((plan, image))
        if not pairs:
            raise UsageError("no built cell to audit" + (f" among {', '.join(select)}" if select
                             else ""), fix="run `infermatrix build` first, or name an image")
        return pairs
    for ref in refs:
        if ref in by_id:
            plan = by_id[ref]
            image = journal.load(ctx.state, ref).get("image_id")
            if not image:
                raise StageFailure(f"{ref} has no built image in the journal",
                                   fix=f"infermatrix build --select {ref}")
        else:
            if not docker.image_exists(ref):
                raise UsageError(f"{ref!r} is neither a cell of {ctx.matrix.path} nor a local "
                                 "image")
            cell_id = docker.image_labels(ref).get("io.infermatrix.cell")
            if not cell_id or cell_id not in by_id:
                raise UsageError(f"image {ref} has no io.infermatrix.cell label naming a cell of "
                                 f"{ctx.matrix.path} (label: {cell_id!r})")
            plan, image = by_id[cell_id], ref
        if not plan.planned:
            raise UsageError(f"{plan.id} is pruned: "
                             + "; ".join(v.reason for v in plan.verdicts))
        pairs.append((plan, image))
    return pairs


# --------------------------------------------------------------------------------------------
# Human output
# --------------------------------------------------------------------------------------------

_STYLE = {PASS: "green", FAIL: "bold red", SKIP: "yellow", "exact": "green",
          "compatible": "green", "family": "green", "ptx-jit": "yellow", "uncovered": "bold red"}


def render(result: AuditResult, console: Any = None, all_objects: bool = False) -> None:
    """Two rich tables: the checks, then the objects (uncovered and PTX-JIT ones first)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    checks = Table(title=f"audit {result.cell_id} ({result.image}): {result.status.upper()}",
                   show_lines=False)
    for column in ("check", "status", "detail"):
        checks.add_column(column, overflow="fold")
    for check in result.checks:
        checks.add_row(check.name, f"[{_STYLE[check.status]}]{check.status}[/]",
                       escape(check.detail))
    console.print(checks)
    if not result.objects:
        return
    shown = sorted(result.objects, key=lambda o: (o.covered, _best_rank(o), o.path))
    if not all_objects:
        shown = [o for o in shown if not o.covered or _best_rank(o) >= Coverage.PTX_JIT.rank] \
            or shown[:10]
    table = Table(title=f"GPU code: {len(result.objects)} objects"
                  + ("" if all_objects else " (uncovered and PTX-only first; --all lists all)"))
    for column in ("object", "package", "cubins", "ptx", *[str(t) for t in result.targets]):
        table.add_column(column, overflow="fold")
    for obj in shown:
        cells = []
        for decision in obj.decisions:
            style = _STYLE[decision.coverage.value] if obj.fails(decision) or decision.covered \
                else "dim"
            cells.append(f"[{style}]{escape(obj.verdict_text(decision, short=True))}[/]")
        table.add_row(escape(obj.path), escape(obj.package or ""),
                      " ".join(a.sm for a in obj.code.cubins),
                      " ".join(a.compute for a in obj.code.ptx), *cells)
    console.print(table)


def _best_rank(obj: AuditedObject) -> int:
    return max((d.coverage.rank for d in obj.decisions), default=0)
