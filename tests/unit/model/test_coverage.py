"""The cubin/PTX coverage rules (coverage.py): pure, no Docker, no GPU."""

from __future__ import annotations

import pytest

import struct

from infermatrix.model.coverage import (FATBIN_MAGIC, Arch, Coverage, DeviceCode, decide,
                                  device_code_from_listings, parse_listing, scan_fatbins, union)


def code(cubins: str = "", ptx: str = "") -> DeviceCode:
    return DeviceCode(tuple(Arch.parse(a) for a in cubins.split()),
                      tuple(Arch.parse(a) for a in ptx.split()))


@pytest.mark.parametrize("cubins, ptx, target, expected", [
    # the cases named in the issue
    ("sm_120", "", "sm_121", Coverage.COMPATIBLE),
    ("sm_120a", "", "sm_121", Coverage.UNCOVERED),
    ("sm_120f", "", "sm_121", Coverage.FAMILY),
    ("", "compute_120", "sm_121", Coverage.PTX_JIT),
    ("sm_90", "", "sm_120", Coverage.UNCOVERED),
    # exact matches, suffix or not
    ("sm_120", "", "sm_120", Coverage.EXACT),
    ("sm_120a", "", "sm_120", Coverage.EXACT),
    ("sm_121a", "", "sm_121", Coverage.EXACT),
    ("sm_120f", "", "sm_120", Coverage.EXACT),
    ("sm_90a", "", "sm_90", Coverage.EXACT),
    # binary compatibility never goes to a lower minor or across majors
    ("sm_121", "", "sm_120", Coverage.UNCOVERED),
    ("sm_121f", "", "sm_120", Coverage.UNCOVERED),
    ("sm_100", "", "sm_120", Coverage.UNCOVERED),
    ("sm_120", "", "sm_90", Coverage.UNCOVERED),
    ("sm_80", "", "sm_90", Coverage.UNCOVERED),
    ("sm_80", "", "sm_86", Coverage.COMPATIBLE),
    ("sm_86", "", "sm_80", Coverage.UNCOVERED),
    # family cubins: sm_100f covers 10.0 and 10.3, not 11.0 or 12.x
    ("sm_100f", "", "sm_103", Coverage.FAMILY),
    ("sm_100f", "", "sm_110", Coverage.UNCOVERED),
    ("sm_100f", "", "sm_120", Coverage.UNCOVERED),
    ("sm_103f", "", "sm_100", Coverage.UNCOVERED),
    ("sm_100a", "", "sm_103", Coverage.UNCOVERED),
    # PTX: plain PTX JITs forward across majors; `a` PTX only on its own CC; `f` PTX in family
    ("", "compute_90", "sm_120", Coverage.PTX_JIT),
    ("", "compute_80", "sm_90", Coverage.PTX_JIT),
    ("", "compute_121", "sm_120", Coverage.UNCOVERED),
    ("", "compute_100", "sm_90", Coverage.UNCOVERED),
    ("", "compute_120a", "sm_121", Coverage.UNCOVERED),
    ("", "compute_121a", "sm_121", Coverage.PTX_JIT),
    ("", "compute_120f", "sm_121", Coverage.PTX_JIT),
    ("", "compute_121f", "sm_120", Coverage.UNCOVERED),
    ("", "compute_100f", "sm_120", Coverage.UNCOVERED),
    ("", "compute_90a", "sm_90", Coverage.PTX_JIT),
    # a cubin wins over PTX; a better cubin wins over a worse one
    ("sm_120", "compute_120", "sm_121", Coverage.COMPATIBLE),
    ("sm_120 sm_121", "", "sm_121", Coverage.EXACT),
    ("sm_120a sm_90", "compute_90", "sm_121", Coverage.PTX_JIT),
    ("sm_120a sm_120f", "", "sm_121", Coverage.FAMILY),
    # nothing at all
    ("", "", "sm_120", Coverage.UNCOVERED),
])
def test_decide(cubins: str, ptx: str, target: str, expected: Coverage) -> None:
    assert decide(code(cubins, ptx), target).coverage is expected


def test_decision_names_the_code_that_covers() -> None:
    decision = decide(code("sm_90 sm_120", "compute_120"), "sm_121")
    assert decision.by == Arch(12, 0)
    assert decision.as_dict() == {"target": "sm_121", "coverage": "compatible", "by": "sm_120",
                                  "note": ""}


def test_ptx_jit_says_it_costs_start_up_time_and_picks_the_newest_ptx() -> None:
    decision = decide(code("", "compute_80 compute_90"), "sm_120")
    assert decision.by == Arch(9, 0)
    assert "start-up time" in decision.note
    assert decision.as_dict()["by"] == "compute_90"


def test_uncovered_says_what_the_object_has() -> None:
    decision = decide(code("sm_120a", "compute_120a"), "sm_121")
    assert not decision.covered
    assert "sm_121" in decision.note and "sm_120a" in decision.note
    assert "compute_120a" in decision.note


def test_target_with_a_suffix_means_the_device() -> None:
    assert decide(code("sm_120"), "sm_121a").coverage is Coverage.COMPATIBLE
    assert decide(code("sm_120"), Arch(12, 1, "f")).target == Arch(12, 1)


@pytest.mark.parametrize("text, arch", [
    ("sm_120", Arch(12, 0)), ("sm_121a", Arch(12, 1, "a")), ("compute_100f", Arch(10, 0, "f")),
    ("sm_90", Arch(9, 0)), ("sm120", Arch(12, 0)), ("120", Arch(12, 0)), ("12.1", Arch(12, 1)),
    ("9.0", Arch(9, 0)), ("SM_90A", Arch(9, 0, "a")), ("sm_75", Arch(7, 5)),
])
def test_arch_parse(text: str, arch: Arch) -> None:
    assert Arch.parse(text) == arch


@pytest.mark.parametrize("text", ["sm_9", "gfx90a", "sm_120x", "", "cpu", "compute_1200", "sm_1a"])
def test_arch_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a CUDA architecture"):
        Arch.parse(text)


def test_arch_spellings() -> None:
    arch = Arch.parse("sm_120f")
    assert (arch.sm, arch.compute, str(arch), arch.device) == (
        "sm_120f", "compute_120f", "sm_120f", Arch(12, 0))


# Real cuobjdump 13.5 output for an object built with
# -gencode arch=compute_120,code=sm_120 -gencode arch=compute_120a,code=sm_120a
# -gencode arch=compute_90,code=compute_90 -gencode arch=compute_90a,code=sm_90a
ELF_LISTING = """\
ELF file    1: l1.1.sm_120.cubin
ELF file    2: l1.2.sm_120a.cubin
ELF file    3: l1.3.sm_90a.cubin
ELF file    4: l1.4.sm_120.cubin
ELF file    5: l1.5.sm_120a.cubin
ELF file    6: l1.6.sm_90a.cubin
"""
PTX_LISTING = "PTX file    1: l1.1.sm_90.ptx\n"


def test_parse_listing_real_output() -> None:
    got = device_code_from_listings(ELF_LISTING, PTX_LISTING)
    assert got.cubins == (Arch(9, 0, "a"), Arch(12, 0), Arch(12, 0, "a"))
    assert got.ptx == (Arch(9, 0),)
    assert got.as_dict() == {"cubins": ["sm_90a", "sm_120", "sm_120a"], "ptx": ["compute_90"]}
    assert DeviceCode.from_dict(got.as_dict()) == got


def test_parse_listing_family_ptx_and_dotted_names() -> None:
    text = ("PTX file    1: libflashinfer.so.1.sm_100f.ptx\n"
            "PTX file    2: a.b.c.2.sm_121a.ptx\n")
    assert parse_listing(text) == [Arch(10, 0, "f"), Arch(12, 1, "a")]


def test_parse_listing_ignores_messages() -> None:
    text = "cuobjdump info    : File '/x/libc10.so' does not contain device code\n"
    assert parse_listing(text) == []
    assert device_code_from_listings(text, text).empty


def test_parse_listing_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="without an architecture"):
        parse_listing("ELF file    1: something.cubin\n")


def container(*entries: tuple[int, int, int], payload: bytes = b"\xaa" * 32) -> bytes:
    """A fat binary container: entries of (kind 1 PTX / 2 ELF, SM arch, flags)."""
    body = b""
    for kind, sm, flags in entries:
        header = struct.pack("<HHIQ", kind, 0x101, 64, len(payload))
        header += struct.pack("<IIII", 0, 0, 0x10008, sm) + struct.pack("<II", 0, 0)
        header += struct.pack("<Q", flags) + b"\0" * 16
        assert len(header) == 64
        body += header + payload
    return FATBIN_MAGIC + struct.pack("<Q", len(body)) + body


def test_scan_fatbins_reads_kinds_archs_and_variants() -> None:
    data = (b"junk" + container((2, 120, 0x01000011), (2, 120, 0x01100011), (1, 90, 0x8011))
            + b"\0" * 7 + container((2, 120, 0x01200011), (1, 100, 0x208011),
                                     (1, 121, 0x108011)))
    code = scan_fatbins(data)
    assert code.cubins == (Arch(12, 0), Arch(12, 0, "a"), Arch(12, 0, "f"))
    assert code.ptx == (Arch(9, 0), Arch(10, 0, "f"), Arch(12, 1, "a"))


def test_scan_fatbins_skips_bytes_that_only_look_like_a_container() -> None:
    fake = FATBIN_MAGIC + struct.pack("<Q", 10 ** 9)  # claims more bytes than there are
    bad_kind = FATBIN_MAGIC + struct.pack("<Q", 96) + b"\x07" * 96
    assert scan_fatbins(fake + bad_kind + b"rest").empty
    assert scan_fatbins(fake + container((2, 90, 0))).cubins == (Arch(9, 0),)


def test_union() -> None:
    a = DeviceCode((Arch(12, 0),), ())
    b = DeviceCode((Arch(12, 0), Arch(12, 0, "f")), (Arch(9, 0),))
    assert union(a, b) == DeviceCode((Arch(12, 0), Arch(12, 0, "f")), (Arch(9, 0),))


def test_scan_fatbins_leaves_out_skipped_ranges() -> None:
    first = container((2, 120, 0))
    data = first + container((2, 121, 0x100000))
    assert scan_fatbins(data, skip=[(len(first), 8)]).cubins == (Arch(12, 0),)
    assert scan_fatbins(data).cubins == (Arch(12, 0), Arch(12, 1, "a"))
