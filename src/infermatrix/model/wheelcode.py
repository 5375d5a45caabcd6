"""GPU code in published wheels, read before any build: which cubins and PTX the objects an
engine loads carry, and the PTX ISA version of that PTX (it sets the driver a JIT needs).

Members are read out of the wheel on the index with HTTP range requests (index._RangeFile):
only the named shared objects are fetched, never the rest of a 400 MB wheel. Results are cached
by the wheel's sha256 (from the index listing) and member name, so a wheel is read once; the
decisions reuse coverage.py, the audit's code.
"""

from __future__ import annotations

import fnmatch
import io
import json
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from packaging.utils import canonicalize_name

from ..state import write_json_atomic
from .coverage import ENTRY_PTX, DeviceCode, FatbinEntry, device_code_of, fatbin_entries
from .kernelsyms import Decompress, KernelCode, default_decompress, kernel_code
from .index import (SIMPLE_JSON, IndexUnavailable, _http_get, _pick_wheel, _RangeFile,
                    cached_entry, typed)

_PTX_VERSION = re.compile(rb"\.version\s+(\d+)\.(\d+)")


@dataclass(frozen=True)
class ObjectCode:
    """One shared object's device code and the newest PTX ISA among its PTX entries."""

    member: str
    code: DeviceCode
    ptx_isa: str | None

    def as_dict(self) -> dict:
        return {"member": self.member, **self.code.as_dict(), "ptx_isa": self.ptx_isa}

    @classmethod
    def from_dict(cls, data: dict) -> ObjectCode:
        return cls(data["member"], DeviceCode.from_dict(data), data.get("ptx_isa"))


def _ptx_isa(data: bytes, entry: FatbinEntry) -> tuple[int, int] | None:
    """The PTX ISA version of a PTX entry. The `.version` line opens the PTX text; in an
    LZ4-compressed entry it is still in the first literal run. The entry header's word at
    offset 24 holds (major << 16 | minor) when the text is not readable."""
    start = entry.payload.start
    match = _PTX_VERSION.search(data, start, start + 256)
    if match:
        return int(match.group(1)), int(match.group(2))
    (word,) = struct.unpack_from("<I", data, entry.offset + 24)
    return (word >> 16, word & 0xFFFF) if 1 <= word >> 16 <= 20 else None


def scan_object(member: str, data: bytes) -> ObjectCode:
    """One object's device code and newest PTX ISA, from one walk over its fat binaries."""
    entries = list(fatbin_entries(data))
    isas = [isa for e in entries if e.kind == ENTRY_PTX and (isa := _ptx_isa(data, e))]
    newest = max(isas) if isas else None
    return ObjectCode(member, device_code_of(entries),
                      f"{newest[0]}.{newest[1]}" if newest else None)


@dataclass(frozen=True)
class WheelRef:
    filename: str
    url: str
    size: int
    sha256: str


def _scan_entry(data: dict[str, Any]) -> dict[str, Any]:
    """A cached wheel scan: {"members": {name: object}, "names": [...] | None}."""
    members, names = data.get("members", {}), data.get("names")
    if not isinstance(members, dict) or not all(isinstance(v, dict) for v in members.values()) \
            or not (names is None or isinstance(names, list)):
        raise TypeError("members/names")
    return {**data, "members": members}


def find_wheel(index: str, package: str, version: str, machine: str) -> WheelRef:
    listing = json.loads(_http_get(f"{index}/{canonicalize_name(package)}/",
                                   {"Accept": SIMPLE_JSON}))
    entry = _pick_wheel(listing.get("files", []), version, machine)
    return WheelRef(entry["filename"], entry["url"], int(entry["size"]),
                    entry.get("hashes", {}).get("sha256", ""))


class WheelCodeCache:
    """Scanned objects by wheel sha256 under `root` (offline: the cache alone)."""

    def __init__(self, root: Path, index: str, offline: bool = False,
                 opener: Callable[[WheelRef], zipfile.ZipFile] | None = None) -> None:
        self.root, self.index, self.offline = root, index, offline
        self.opener = opener or _open_remote

    def objects(self, package: str, version: str, machine: str,
                patterns: list[str]) -> tuple[WheelRef | None, list[ObjectCode]]:
        """The objects of `package==version`'s wheel for `machine` whose names match."""
        ref = self._ref(package, version, machine)
        path, cached = self._scan_of(ref)
        names = cached.get("names")
        archive = None
        if names is None:
            archive = self._open(ref)
            names = [n for n in archive.namelist() if n.endswith(".so") or ".so." in n]
        wanted = sorted({n for n in names for p in patterns if fnmatch.fnmatchcase(n, p)})
        found = []
        for member in wanted:
            if member not in cached["members"]:
                archive = archive or self._open(ref)
                cached["members"][member] = scan_object(member, archive.read(member)).as_dict()
            found.append(ObjectCode.from_dict(cached["members"][member]))
        cached.update(names=names, wheel=ref.filename)
        write_json_atomic(path, cached)
        return ref, found

    def kernels(self, package: str, version: str, machine: str, member: str,
                patterns: list[str], decompress: Decompress | None = None
                ) -> tuple[WheelRef, dict[str, KernelCode] | None]:
        """Per pattern, the architectures of `member`'s cubins/PTX that define a matching
        kernel (kernelsyms.py); None when the wheel has no such member. Cached with the
        object's scan, by pattern."""
        ref = self._ref(package, version, machine)
        path, cached = self._scan_of(ref)
        known = cached.setdefault("kernels", {}).setdefault(member, {})
        # an entry written before the reader decoded LZ4 counts unreadable entries without
        # their architectures: read again
        missing = [p for p in patterns if p not in known or
                   (known[p].get("unreadable") and "unreadable_archs" not in known[p])]
        if missing:
            archive = self._open(ref)
            if member not in archive.namelist():
                return ref, None
            found = kernel_code(archive.read(member), missing,
                                decompress or default_decompress())
            known.update({p: k.as_dict() for p, k in found.items()})
            cached.setdefault("wheel", ref.filename)
            write_json_atomic(path, cached)
        return ref, {p: KernelCode.from_dict(known[p]) for p in patterns}

    def has_member(self, package: str, version: str, machine: str,
                   member: str) -> tuple[WheelRef, bool]:
        """Does the wheel hold `member` (any file: a JIT kernel's source)? Cached by wheel."""
        ref = self._ref(package, version, machine)
        path, cached = self._scan_of(ref)
        present = cached.setdefault("present", {})
        if member not in present:
            present[member] = member in self._open(ref).namelist()
            cached.setdefault("wheel", ref.filename)
            write_json_atomic(path, cached)
        return ref, bool(present[member])

    def _scan_of(self, ref: WheelRef) -> tuple[Path, dict[str, Any]]:
        """Where the wheel's scan is cached, and what it holds so far."""
        path = self.root / f"{ref.sha256 or ref.filename}.json"
        return path, cached_entry(path, _scan_entry) or {"members": {}, "names": None}

    def _ref(self, package: str, version: str, machine: str) -> WheelRef:
        refs = self.root / "refs" / f"{canonicalize_name(package)}-{version}-{machine}.json"
        cached = cached_entry(refs, lambda d: typed(WheelRef, d))
        if cached is not None:
            return cached
        if self.offline:
            raise IndexUnavailable(f"offline: {package} {version} ({machine}) not read yet")
        ref = find_wheel(self.index, package, version, machine)
        write_json_atomic(refs, ref.__dict__)
        return ref

    def _open(self, ref: WheelRef) -> zipfile.ZipFile:
        if self.offline:
            raise IndexUnavailable(f"offline: {ref.filename} not scanned yet")
        return self.opener(ref)


def _open_remote(ref: WheelRef) -> zipfile.ZipFile:
    remote = io.BufferedReader(_RangeFile(ref.url, ref.size), buffer_size=8 * 1024 * 1024)
    return zipfile.ZipFile(remote)

