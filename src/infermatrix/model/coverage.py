"""Which GPU code in a shared object can run on a target GPU: NVIDIA's compatibility rules, once.

Pure code (standard library only): it parses `cuobjdump --list-elf` / `--list-ptx` output and
decides, per target compute capability, how an object's embedded code covers it.

The rules, with their sources:
- CUDA Compatibility guide / nvcc docs ("GPU compilation", "binary compatibility"):
  a cubin (SASS) built for sm_XY runs on devices of compute capability X.Z with Z >= Y: same
  major, equal or higher minor. Never across majors, never on a lower minor.
  https://docs.nvidia.com/cuda/cuda-compiler-driver-nvcc/#gpu-compilation
  https://docs.nvidia.com/deploy/cuda-compatibility/
- CUDA C++ Programming Guide, "Feature Set Compiler Targets" (architecture-specific `a` and
  family-specific `f` targets, CUDA 12.0 / 12.9):
  * `sm_XYa` / `compute_XYa`: the code runs on compute capability X.Y only; no forward
    compatibility at all, not even to a higher minor of the same major (an sm_120a cubin does
    not run on sm_121 / GB10);
  * `sm_XYf` / `compute_XYf`: the code runs on the devices of the family that have the same major
    and an equal or higher minor: sm_100f on 10.0 and 10.3, sm_103f on 10.3, sm_120f on 12.0 and
    12.1, sm_121f on 12.1 only.
  https://docs.nvidia.com/cuda/cuda-c-programming-guide/#feature-availability
  https://docs.nvidia.com/cuda/blackwell-compatibility-guide/
- PTX (nvcc docs "Just-in-time compilation", Blackwell compatibility guide): plain
  `compute_XY` PTX is JIT-compiled by the driver for any device of compute capability >= X.Y
  (any later major). JIT costs start-up time on first load (the driver caches the result in
  ~/.nv/ComputeCache) and needs a driver at least as new as the toolkit that wrote the PTX.

Observed with cuobjdump 13.x: `--list-elf` names a family cubin without its `f`
(`x.1.sm_120.cubin` for an sm_120f cubin) while it names `a` cubins and `f`/`a` PTX with their
suffix. Coverage is the same for a plain and an `f` cubin (same major, minor >= Y), so the
verdict is right either way; only the label then reads `compatible` instead of `family`.

Limits: cuobjdump lists fat binaries per object, not per translation unit, so an object whose
translation units were built for different arch lists is judged on the union.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple

if TYPE_CHECKING:
    import mmap

SOURCE = ("NVIDIA CUDA C++ Programming Guide (Feature Set Compiler Targets), CUDA Compatibility "
          "guide, Blackwell compatibility guide, nvcc docs (GPU compilation)")

@dataclass(frozen=True, order=True)
class Arch:
    """A compute capability with an optional feature-set suffix: `a` (arch-specific) or `f`."""

    major: int
    minor: int
    variant: str = ""  # "", "a" or "f"

    @classmethod
    def parse(cls, text: str) -> "Arch":
        """Accepts `sm_120`, `sm_121a`, `compute_100f`, `sm120`, `120`, `12.0`, `9.0`."""
        raw = text.strip().lower()
        if re.fullmatch(r"\d+\.\d", raw):
            major, minor = raw.split(".")
            return cls(int(major), int(minor))
        match = re.fullmatch(r"(?:sm_|compute_|sm)?(\d{2,3})([af]?)", raw)
        if not match:
            raise ValueError(f"not a CUDA architecture: {text!r} (expected e.g. sm_120, sm_121a, "
                             "compute_120f, 12.0)")
        digits, variant = match.groups()
        return cls(int(digits[:-1]), int(digits[-1]), variant)

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def device(self) -> "Arch":
        """The device this names (a GPU has a compute capability, no suffix)."""
        return Arch(self.major, self.minor)

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.variant}"

    @property
    def compute(self) -> str:
        return f"compute_{self.major}{self.minor}{self.variant}"

    def __str__(self) -> str:
        return self.sm


class Coverage(str, Enum):
    """How a target is covered, best first."""

    EXACT = "exact"            # a cubin built for the target's compute capability
    FAMILY = "family"          # an `f` cubin of the same major, lower minor
    COMPATIBLE = "compatible"  # a plain cubin of the same major, lower minor
    PTX_JIT = "ptx-jit"        # no usable cubin; the driver JIT-compiles PTX at load time
    UNCOVERED = "uncovered"    # nothing that runs: "no kernel image is available"

    @property
    def covered(self) -> bool:
        return self is not Coverage.UNCOVERED

    @property
    def rank(self) -> int:
        return list(Coverage).index(self)


# --- the rules --------------------------------------------------------------------------------

def cubin_runs_on(cubin: Arch, target: Arch) -> bool:
    """Can the driver load this cubin (SASS) on a device of the target's compute capability?"""
    device = target.device
    if cubin.variant == "a":
        return cubin.cc == device.cc
    # plain and `f` cubins: same major, equal or higher minor on the device
    return cubin.major == device.major and cubin.minor <= device.minor


def ptx_jits_on(ptx: Arch, target: Arch) -> bool:
    """Can the driver JIT-compile this PTX for a device of the target's compute capability?"""
    if ptx.variant:  # `a` and `f` PTX: where a cubin of the same target runs
        return cubin_runs_on(ptx, target)
    return ptx.cc <= target.device.cc


def cubin_coverage(cubin: Arch, target: Arch) -> Coverage:
    if not cubin_runs_on(cubin, target):
        return Coverage.UNCOVERED
    if cubin.cc == target.device.cc:
        return Coverage.EXACT
    return Coverage.FAMILY if cubin.variant == "f" else Coverage.COMPATIBLE


@dataclass(frozen=True)
class Decision:
    """The verdict for one object on one target, with the code that gives it."""

    target: Arch
    coverage: Coverage
    by: Arch | None = None  # the cubin or PTX that covers it
    note: str = ""

    @property
    def covered(self) -> bool:
        return self.coverage.covered

    def as_dict(self) -> dict[str, str | None]:
        return {"target": str(self.target), "coverage": self.coverage.value,
                "by": None if self.by is None else
                (self.by.compute if self.coverage is Coverage.PTX_JIT else self.by.sm),
                "note": self.note}


@dataclass(frozen=True)
class DeviceCode:
    """The GPU code one object embeds: cubins (SASS) and PTX, by architecture."""

    cubins: tuple[Arch, ...] = ()
    ptx: tuple[Arch, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.cubins and not self.ptx

    def as_dict(self) -> dict[str, list[str]]:
        return {"cubins": [a.sm for a in self.cubins], "ptx": [a.compute for a in self.ptx]}

    @classmethod
    def from_dict(cls, data: dict[str, list[str]]) -> "DeviceCode":
        return cls(tuple(Arch.parse(a) for a in data.get("cubins", [])),
                   tuple(Arch.parse(a) for a in data.get("ptx", [])))


def decide(code: DeviceCode, target: Arch | str) -> Decision:
    """The best way `code` covers `target` (exact > family > compatible > PTX JIT)."""
    target = Arch.parse(target) if isinstance(target, str) else target
    target = target.device
    best: Decision | None = None
    for cubin in code.cubins:
        coverage = cubin_coverage(cubin, target)
        if coverage.covered and (best is None or coverage.rank < best.coverage.rank):
            best = Decision(target, coverage, cubin)
    if best is not None:
        return best
    jit = [p for p in code.ptx if ptx_jits_on(p, target)]
    if jit:
        newest = max(jit, key=lambda a: a.cc)
        return Decision(target, Coverage.PTX_JIT, newest,
                        f"no {target.sm}-compatible cubin: the driver JIT-compiles "
                        f"{newest.compute} PTX at first load (start-up time; needs a driver "
                        "as new as the toolkit that wrote it)")
    return Decision(target, Coverage.UNCOVERED, None, _why_uncovered(code, target))


def _why_uncovered(code: DeviceCode, target: Arch) -> str:
    parts = []
    if code.cubins:
        parts.append("cubins " + ", ".join(sorted({a.sm for a in code.cubins})))
    if code.ptx:
        parts.append("PTX " + ", ".join(sorted({a.compute for a in code.ptx})))
    have = "; ".join(parts) or "no GPU code"
    return f"nothing runs on {target.sm} (has {have})"


# --- cuobjdump output -------------------------------------------------------------------------

# `ELF file    1: libtorch_cuda.1.sm_90a.cubin`, `PTX file    3: x.3.sm_120f.ptx`
_LISTING_RE = re.compile(r"^\s*(ELF|PTX) file\s+\d+:\s*(?P<name>\S+)\s*$")
_NAME_ARCH_RE = re.compile(r"\.(?:sm|compute)_(\d{2,3}[af]?)\.(?:cubin|ptx)$")


def parse_listing(text: str, kind: str | None = None) -> list[Arch]:
    """Architectures named by `cuobjdump --list-elf` or `--list-ptx` output, in order; `kind`
    ("ELF" or "PTX") keeps only those lines (one run with both flags lists both).

    Lines that are not listings (info messages such as "does not contain device code") are
    ignored; a listing line whose name carries no architecture is an error (a format change).
    """
    archs = []
    for line in text.splitlines():
        match = _LISTING_RE.match(line)
        if not match or (kind is not None and match.group(1) != kind):
            continue
        name = match.group("name")
        found = _NAME_ARCH_RE.search(name)
        if not found:
            raise ValueError(f"cuobjdump listing without an architecture: {line.strip()!r}")
        archs.append(Arch.parse(found.group(1)))
    return archs


def device_code_from_listings(elf_listing: str, ptx_listing: str) -> DeviceCode:
    """Deduplicated, sorted cubin and PTX architectures of one object."""
    return DeviceCode(tuple(sorted(set(parse_listing(elf_listing, "ELF")))),
                      tuple(sorted(set(parse_listing(ptx_listing, "PTX")))))


def device_code_from_listing(listing: str) -> DeviceCode:
    """The same from one `cuobjdump --list-elf --list-ptx` run (its ELF and PTX lines)."""
    return device_code_from_listings(listing, listing)


# --- fat binaries embedded outside .nv_fatbin ---------------------------------------------------
# Some libraries keep most of their kernels in fat binaries of their own data sections and load
# them with the driver API (cuFFT 12 in CUDA 13: .nv_fatbin holds one sm_75 stub, .ldata ~24,000
# fat binaries with sm_75 ... sm_120 code). `cuobjdump` on the object sees only .nv_fatbin, so
# these are read from their headers. The layout is NVIDIA's fatbin container (fatbinary.h of
# the CUDA toolkit; undocumented fields checked against cuobjdump 13.5 in tests/unit/model/test_coverage.py):
#   container header: magic 0xBA55ED50 (u32), version 1 (u16), header size 16 (u16),
#                     payload size (u64);
#   entry header: kind (u16: 1 PTX, 2 ELF cubin), version (u16), header size (u32),
#                 padded payload size (u64), ..., SM arch at byte 28 (u32: 90, 120, 121),
#                 flags at byte 40 (u64: 0x100000 arch-specific `a`, 0x200000 family `f`).

FATBIN_MAGIC = bytes.fromhex("50ed55ba01001000")  # magic, version 1, header size 16
ENTRY_PTX, ENTRY_ELF = 1, 2
_FLAG_ARCH_SPECIFIC, _FLAG_FAMILY = 0x100000, 0x200000


class FatbinEntry(NamedTuple):
    """One entry of a fat binary container: its kind, architecture and flags, and where its
    container, its header (at `offset`, `header` bytes) and padded payload lie in the data."""

    container: int
    kind: int  # ENTRY_PTX or ENTRY_ELF
    arch: Arch
    flags: int
    offset: int
    header: int
    padded: int

    @property
    def payload(self) -> slice:
        start = self.offset + self.header
        return slice(start, start + self.padded)


def _entry_arch(sm: int, flags: int) -> Arch | None:
    if not 20 <= sm <= 999:
        return None
    variant = "a" if flags & _FLAG_ARCH_SPECIFIC else "f" if flags & _FLAG_FAMILY else ""
    return Arch(sm // 10, sm % 10, variant)


def _container_entries(data: bytes | mmap.mmap, start: int) -> tuple[list[FatbinEntry], int] | None:
    """(entries, end) of the fat binary container at `start`; None if it is not one."""
    if start + 16 > len(data):
        return None
    (size,) = struct.unpack_from("<Q", data, start + 8)
    end = start + 16 + size
    if size == 0 or end > len(data):
        return None
    entries: list[FatbinEntry] = []
    offset = start + 16
    while offset + 48 <= end:
        kind, _version, header, padded = struct.unpack_from("<HHIQ", data, offset)
        (sm,) = struct.unpack_from("<I", data, offset + 28)
        (flags,) = struct.unpack_from("<Q", data, offset + 40)
        arch = _entry_arch(sm, flags)
        if kind not in (ENTRY_PTX, ENTRY_ELF) or not 48 <= header <= 1024 or arch is None \
                or offset + header + padded > end:
            return None  # not a container after all: random bytes that matched the magic
        entries.append(FatbinEntry(start, kind, arch, flags, offset, header, padded))
        offset += header + padded
    return entries, end


def fatbin_entries(data: bytes | mmap.mmap) -> Iterator[FatbinEntry]:
    """Every entry of every fat binary container in `data` (bytes or an mmap)."""
    position = data.find(FATBIN_MAGIC)
    while position != -1:
        found = _container_entries(data, position)
        if found is None:
            position = data.find(FATBIN_MAGIC, position + 1)
            continue
        entries, end = found
        yield from entries
        position = data.find(FATBIN_MAGIC, end)


def device_code_of(entries: Iterable[FatbinEntry]) -> DeviceCode:
    """The sorted, deduplicated cubin and PTX architectures of these entries."""
    cubins: set[Arch] = set()
    ptx: set[Arch] = set()
    for entry in entries:
        (cubins if entry.kind == ENTRY_ELF else ptx).add(entry.arch)
    return DeviceCode(tuple(sorted(cubins)), tuple(sorted(ptx)))


def scan_fatbins(data: bytes | mmap.mmap, skip: Iterable[tuple[int, int]] = ()) -> DeviceCode:
    """Architectures of every fat binary container in `data` (bytes or an mmap), except those
    that start inside a `skip` range of (offset, size)."""
    skip = list(skip)
    return device_code_of(
        entry for entry in fatbin_entries(data)
        if not any(start <= entry.container < start + size for start, size in skip))


def union(*codes: DeviceCode) -> DeviceCode:
    return DeviceCode(tuple(sorted({a for c in codes for a in c.cubins})),
                      tuple(sorted({a for c in codes for a in c.ptx})))

