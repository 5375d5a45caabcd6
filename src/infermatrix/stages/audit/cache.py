"""cuobjdump on the host and the cache of what it listed (by content hash)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from ... import proc
from ...errors import CommandFailed, MissingTool
from ...journal import Status
from ...model.coverage import DeviceCode, device_code_from_listing, scan_fatbins, union
from ...model.index import cached_entry
from ...options import OPTIONS, from_environment
from ...state import StatePaths, write_json_atomic

PASS, FAIL, SKIP = Status.PASS, Status.FAIL, Status.SKIP  # the journal's one vocabulary
NOT_LOADED_GROUP = "not-loaded"
CUOBJDUMP_ENV = OPTIONS["cuobjdump"].env[0]
CUOBJDUMP_DIST = "nvidia-cuda-cuobjdump"
HARNESS_DIR = Path(__file__).resolve().parents[2] / "harness"  # in-image programs, mounted
HARNESS_MOUNT = "/opt/infermatrix/harness"
AUDIT_MOUNT = "/opt/infermatrix-audit"  # where host tools are bind-mounted in the probe container
PROBE_TIMEOUT_S = 900
CACHE_VERSION = 2  # 2: cuobjdump listing + fat binaries embedded outside .nv_fatbin


# CUDA libraries whose soname major is the CUDA major (cuFFT, cuSPARSE, cuRAND... version apart).
_CUDA_SONAME = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc|nvJitLink)\.so\.(\d+)$")


# NVIDIA runtime wheels: `nvidia-cuda-runtime-cu12` (CUDA 12 naming) or `nvidia-cuda-runtime`
# 13.x (CUDA 13 naming: the version's major is the CUDA major).
_CUDA_WHEEL = re.compile(r"^nvidia-(cuda-runtime|cublas|cuda-nvrtc|nvjitlink)(?:-cu(\d+))?$")


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
