"""The probe: what an image holds, read by harness/audit_probe.py in a container of it (natively
when the image's CPU runs emulated here)."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ... import proc
from ...engine.docker import Engine
from ...errors import StageFailure
from ...model.coverage import DeviceCode
from ...state import StatePaths
from .cache import (
    AUDIT_MOUNT,
    HARNESS_DIR,
    HARNESS_MOUNT,
    PROBE_TIMEOUT_S,
    DeviceCodeCache,
    cuobjdump_version,
    find_cuobjdump,
    list_device_code,
)

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

    from ...engine import docker as engine
    from ..lock import uv_bin

    return [engine.Mount(str(Path(elftools.__file__).resolve().parent),
                         f"{AUDIT_MOUNT}/py/elftools"),
            engine.Mount(str(Path(uv_bin()).resolve()), f"{AUDIT_MOUNT}/uv"),
            engine.Mount(str(HARNESS_DIR), HARNESS_MOUNT, read_only=True)]


def probe_args() -> list[str]:
    from ...model.coverage import FATBIN_MAGIC

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
        from ...engine import docker as engine

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
    from elftools.elf.segments import InterpSegment

    binary = Path(os.path.realpath(sys.executable))
    prefix = Path(os.path.realpath(sys.base_prefix))
    try:
        with open(binary, "rb") as handle:
            interp = next((seg.get_interp_name() for seg in ELFFile(handle).iter_segments()
                           if isinstance(seg, InterpSegment)), None)  # its p_type: PT_INTERP
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
    from ...engine import docker as engine

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
