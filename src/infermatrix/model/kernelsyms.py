"""Which architectures one kernel of a shared object carries code for (issue 46).

coverage.py judges a whole object by the union of its fat binaries' cubins; a serve profile
needs more: the FP8 GEMM an engine picks for the arch (vLLM's `cutlass_3x_gemm_fp8_blockwise`)
must itself have a cubin or PTX for that arch, not merely share an object with kernels that do.
This reads each fat binary entry's payload: an ELF cubin's symbol table (function symbols are
the kernels), a PTX text's `.entry` lines, and keeps the architectures whose entry defines a
kernel whose name contains the pattern.

Payloads are stored as-is or compressed, as the entry header says: the compressed size at byte
16 (u64), the uncompressed size at byte 56 (u64), and in the flags 0x2000 for an LZ4 block,
0x8000 for zstd. Observed: vLLM 0.33.0's objects (nvcc 13.0) are zstd frames (magic 28 b5 2f
fd); vLLM 0.19.0's _C.abi3.so mixes zstd entries and LZ4 blocks (flags 0x2011, e.g. an sm_120
cubin of 5,337,488 B that decodes to exactly its 18.5 MB). LZ4 is decoded here (lz4_block, a
few seconds per entry); zstd needs the zstandard module or the zstd command. An entry that still
cannot be read is counted, with its architecture, never guessed (profiles.py then says
`unverified` where such an entry could be the arch's code).
The fat binary layout and its walker are coverage.py's (fatbin_entries).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

from .coverage import ENTRY_ELF, ENTRY_PTX, Arch, DeviceCode, FatbinEntry, fatbin_entries

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
FLAG_LZ4, FLAG_ZSTD = 0x2000, 0x8000
ELF_MAGIC = b"\x7fELF"
_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)")

# bytes of a compressed payload -> the payload (None: cannot decompress here)
Decompress = Callable[[bytes], "bytes | None"]


class CannotDecompress(RuntimeError):
    """A compressed payload and no decompressor on this machine (zstandard or the zstd CLI)."""


def _zstd_module(payload: bytes) -> bytes | None:
    import zstandard  # type: ignore[import-not-found]

    return zstandard.ZstdDecompressor().decompressobj().decompress(payload)


def _zstd_cli(payload: bytes) -> bytes | None:
    done = subprocess.run(["zstd", "-d", "-c", "-q"], input=payload, capture_output=True,
                          check=False)
    return done.stdout or None


def default_decompress() -> Decompress | None:
    """The zstandard module where it is installed, else the zstd command; None: neither."""
    try:
        import zstandard  # noqa: F401
        return _zstd_module
    except ImportError:
        return _zstd_cli if shutil.which("zstd") else None


def _length(nibble: int, src: bytes, i: int) -> tuple[int, int]:
    """An LZ4 length: a token nibble of 15 goes on in bytes at `i` up to one below 255.
    Returns the length and the position after it."""
    length, more = nibble, 255 if nibble == 15 else 0
    while more == 255:
        more = src[i]
        i += 1
        length += more
    return length, i


def lz4_block(src: bytes, size: int) -> bytes:
    """Decode one LZ4 block (the format of LZ4_decompress_safe: sequences of a token, literals,
    a 2-byte offset and a match) into at most `size` bytes."""
    out = bytearray()
    i, n = 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        literals, i = _length(token >> 4, src, i)
        out += src[i:i + literals]
        i += literals
        if i >= n or len(out) >= size:
            break
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        length, i = _length(token & 15, src, i)
        length += 4
        start = len(out) - offset
        if offset <= 0 or start < 0:
            raise ValueError("LZ4 block: a match before the start of the output")
        if offset >= length:
            out += out[start:start + length]
        else:  # an overlapping match repeats the last `offset` bytes
            out += (out[start:] * (length // offset + 1))[:length]
    return bytes(out[:size])


def elf_function_names(elf: bytes) -> list[str]:
    """Names of the FUNC symbols of a little-endian ELF64 object (a cubin's kernels and device
    functions); [] for anything that is not one."""
    if elf[:4] != ELF_MAGIC or len(elf) < 64 or elf[4] != 2:
        return []
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(elf):
        return []
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
                for i in range(shnum)]
    names: list[str] = []
    for _name, kind, _f, _a, offset, size, link, _i, _al, entsize in sections:
        if kind != 2 or link >= len(sections):  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for j in range(size // max(entsize, 24)):
            name, info = struct.unpack_from("<IB", elf, offset + j * 24)
            if info & 0xF == 2:  # STT_FUNC
                end = elf.find(b"\0", strings + name)
                names.append(elf[strings + name:end].decode("utf-8", "replace"))
    return names


def ptx_entry_names(ptx: bytes) -> list[str]:
    return [m.group(1).decode("utf-8", "replace") for m in _PTX_ENTRY.finditer(ptx)]


@dataclass(frozen=True)
class KernelCode:
    """The architectures whose cubins (PTX) define a kernel matching `pattern`."""

    pattern: str
    code: DeviceCode
    kernels: int  # matching symbols found, over all entries
    example: str = ""  # one matching symbol, shortened
    unreadable: int = 0  # entries whose payload could not be read
    unreadable_code: DeviceCode = DeviceCode()  # their architectures (cubins, PTX)

    def as_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, **self.code.as_dict(), "kernels": self.kernels,
                "example": self.example, "unreadable": self.unreadable,
                "unreadable_archs": self.unreadable_code.as_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelCode:
        return cls(data["pattern"], DeviceCode.from_dict(data), int(data["kernels"]),
                   str(data.get("example", "")), int(data.get("unreadable", 0)),
                   DeviceCode.from_dict(data.get("unreadable_archs") or {}))


def _payload(raw: bytes, flags: int, sizes: tuple[int, int],
             decompress: Decompress | None) -> bytes | None:
    """An entry's payload as stored: decoded when the flags or the magic say compressed."""
    packed, size = sizes
    body = raw[:packed] if 0 < packed <= len(raw) else raw
    if flags & FLAG_LZ4 and size:
        try:
            return lz4_block(body, size)
        except (IndexError, ValueError):
            return None
    if body[:4] == ZSTD_MAGIC:
        if decompress is None:
            raise CannotDecompress("zstd-compressed fat binary entries and neither the "
                                   "zstandard module nor the zstd command here")
        return decompress(body)
    return raw


def _sizes(data: Any, entry: FatbinEntry) -> tuple[int, int]:
    """(compressed, uncompressed size) from an entry header of 64 bytes or more; else zeros."""
    if entry.header < 64:
        return (0, 0)
    return (struct.unpack_from("<Q", data, entry.offset + 16)[0],
            struct.unpack_from("<Q", data, entry.offset + 56)[0])


def kernel_code(data: Any, patterns: list[str], decompress: Decompress | None = None
                ) -> dict[str, KernelCode]:
    """For each pattern (a substring of the mangled kernel name), the architectures of the
    cubins and PTX in `data` (an object's bytes or mmap) that define a matching kernel."""
    cubins: dict[str, set[Arch]] = {p: set() for p in patterns}
    ptx: dict[str, set[Arch]] = {p: set() for p in patterns}
    counts = dict.fromkeys(patterns, 0)
    examples = dict.fromkeys(patterns, "")
    unreadable: dict[int, set[Arch]] = {ENTRY_ELF: set(), ENTRY_PTX: set()}
    count = 0
    for entry in fatbin_entries(data):
        payload = _payload(bytes(data[entry.payload]), entry.flags, _sizes(data, entry),
                           decompress)
        if entry.kind == ENTRY_ELF and payload and payload[:4] == ELF_MAGIC:
            names, into = elf_function_names(payload), cubins
        elif entry.kind == ENTRY_PTX and payload and b".version" in payload[:4096]:
            names, into = ptx_entry_names(payload), ptx
        else:
            count += 1
            unreadable.setdefault(entry.kind, set()).add(entry.arch)
            continue
        for pattern in patterns:
            hits = [n for n in names if pattern in n]
            if hits:
                into[pattern].add(entry.arch)
                counts[pattern] += len(hits)
                examples[pattern] = examples[pattern] or hits[0][:160]
    lost = DeviceCode(tuple(sorted(unreadable[ENTRY_ELF])), tuple(sorted(unreadable[ENTRY_PTX])))
    return {p: KernelCode(p, DeviceCode(tuple(sorted(cubins[p])), tuple(sorted(ptx[p]))),
                          counts[p], examples[p], count, lost) for p in patterns}
