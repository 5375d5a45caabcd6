"""Serve profiles (issue 46): the profile expansion, the prune rules and the FP8 path verdicts,
on wheel facts recorded from the real wheels (tests/fixtures/wheels/profile-paths-*.json)."""

from __future__ import annotations

import fnmatch
import json
import struct

import pytest
import yaml

from infermatrix.config import Matrix, load_matrix  # noqa: F401
from infermatrix.model import capacity
from infermatrix.model.cell import Cell
from infermatrix.model.coverage import DeviceCode, FATBIN_MAGIC
from infermatrix.model.kernelsyms import (CannotDecompress, KernelCode, ZSTD_MAGIC,
                                          elf_function_names, kernel_code, lz4_block)
from infermatrix.model.profiles import (GemmRead, ProfileSpec, judge_fp8_gemm, judge_fp8_kv,
                                        judge_profile, load_paths, path_entry, profile_specs)
from infermatrix.model.rules import EngineFacts, backend_choice, engine_env
from infermatrix.model.wheelcode import ObjectCode, WheelRef
from infermatrix.stages.plan import profile_plans
from infermatrix.model.cell import CellSettings
from tests.paths import TESTS

ROOT = TESTS.parent

RECORDED = json.loads((TESTS / "fixtures" / "wheels" / "profile-paths-2026-12-06.json")
                      .read_text())["wheels"]
VLLM_GEMM = path_entry("vllm", "0.33.0")["fp8-gemm"]
SGLANG_GEMM = path_entry("sglang", "0.5.23")["fp8-gemm"]
PINS = {"flashinfer-python": "0.7.2"}


def cell(engine: str = "vllm", version: str = "0.33.0", arch: str = "sm_120",
         cuda: str = "13.0") -> Cell:
    return Cell(cuda, "2.14.0", engine, version, arch)


def machine_of(arch: str) -> str:
    return "aarch64" if arch == "sm_121" else "x86_64"


class RecordedCode:
    """The wheel reader's answers, from the recorded facts (duck-typed WheelCodeCache)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []

    def _wheel(self, package: str, version: str, machine: str) -> dict:
        return RECORDED[f"{package} {version} {machine}"]

    def _ref(self, package: str, version: str, machine: str) -> WheelRef:
        wheel = self._wheel(package, version, machine)
        return WheelRef(wheel["wheel"], f"https://files.pythonhosted.org/{wheel['wheel']}", 1,
                        wheel.get("sha256", ""))

    def objects(self, package, version, machine, patterns):
        wheel = self._wheel(package, version, machine)
        names = [n for n in wheel["names"] if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        return self._ref(package, version, machine), [
            ObjectCode(n, DeviceCode.from_dict(wheel["objects"][n]), None)
            for n in names if n in wheel["objects"]]

    def kernels(self, package, version, machine, member, patterns):
        self.asked.append((package, version, machine, member))
        known = self._wheel(package, version, machine)["kernels"].get(member)
        return self._ref(package, version, machine), None if known is None else {
            p: KernelCode.from_dict(known[p]) for p in patterns}

    def has_member(self, package, version, machine, member):
        self.asked.append((package, version, machine, member))
        return self._ref(package, version, machine), \
            self._wheel(package, version, machine)["present"].get(member, False)


def recorded_kernel(arch: str) -> KernelCode:
    member = VLLM_GEMM["member"]
    facts = RECORDED[f"vllm 0.33.0 {machine_of(arch)}"]["kernels"][member]
    return KernelCode.from_dict(facts[VLLM_GEMM["kernel"]])


# --- the profile expansion ----------------------------------------------------------------------

def shipped() -> Matrix:
    return load_matrix(ROOT / "matrix.yaml")


def test_the_shipped_matrix_names_three_profiles_with_their_checkpoints_and_flags():
    specs = {s.key: s for s in profile_specs(shipped().data)}
    assert list(specs) == ["bf16", "fp8", "bf16-kv-fp8"]
    assert specs["fp8"].checkpoint == "Qwen/Qwen3.6-27B-FP8"
    assert specs["bf16"].checkpoint == specs["bf16-kv-fp8"].checkpoint == "Qwen/Qwen3.6-27B"
    assert specs["fp8"].needs == ("fp8-gemm", "fp8-kv")
    assert specs["bf16-kv-fp8"].needs == ("fp8-kv",)
    assert specs["fp8"].args_for("vllm") == ["--kv-cache-dtype", "fp8"]
    assert specs["fp8"].args_for("sglang") == ["--kv-cache-dtype", "fp8_e4m3"]
    assert specs["fp8"].args_for("vllm-cpu") == ["--kv-cache-dtype", "fp8"]  # the vllm flags
    assert specs["bf16"].args_for("vllm") == []


def test_every_matrix_profile_has_the_capacity_models_bytes_and_the_same_checkpoint():
    data = capacity.spec()["profiles"]
    for spec in profile_specs(shipped().data):
        assert spec.key in data, f"data/capacity.yaml has no profile {spec.key}"
        assert data[spec.key]["checkpoint"] == spec.checkpoint
        assert list(data[spec.key].get("vllm_flags") or []) == spec.args_for("vllm")
        assert (data[spec.key]["kv_bytes"] == 1) == ("fp8-kv" in spec.needs)
        assert (data[spec.key]["weight_bytes"] == 1) == ("fp8-gemm" in spec.needs)


def test_a_matrix_without_profiles_has_the_baseline_only():
    specs = profile_specs({"model": {"name": "org/model"}})
    assert [(s.key, s.checkpoint, s.needs) for s in specs] == [("bf16", "org/model", ())]


def test_every_profile_need_is_defined_and_every_path_entry_names_its_source():
    paths = load_paths()
    needs = set(paths["needs"])
    for spec in profile_specs(shipped().data):
        assert set(spec.needs) <= needs
    for engine, entries in paths["engines"].items():
        for entry in entries:
            for need in needs & set(entry):
                assert entry[need]["source"].strip(), (engine, entry["versions"], need)


# --- the FP8 GEMM verdicts on the recorded wheels ----------------------------------------------

@pytest.mark.parametrize("arch,coverage", [("sm_120", "exact"), ("sm_121", "family")])
def test_vllm_0_33_fp8_gemm_runs_on_both_arches_from_its_sm120f_cubins(arch, coverage):
    verdict = judge_fp8_gemm(cell(arch=arch), VLLM_GEMM, GemmRead("u", recorded_kernel(arch)))
    assert not verdict.pruned and not verdict.unverified
    assert verdict.path["member"] == "vllm/_C_stable_libtorch.abi3.so"
    assert verdict.path["kernel"] == "cutlass_3x_gemm_fp8_blockwise"
    assert (verdict.path["coverage"], verdict.path["by"]) == (coverage, "sm_120f")


def test_a_kernel_without_code_for_the_arch_prunes_the_profile_naming_object_and_kernel():
    datacenter = KernelCode("cutlass_3x_gemm_fp8_blockwise",
                            DeviceCode.from_dict({"cubins": ["sm_90a", "sm_100f"]}), 12)
    verdict = judge_fp8_gemm(cell(), VLLM_GEMM, GemmRead("https://w", datacenter))
    (pruned,) = verdict.pruned
    assert pruned.rule == "profile-fp8-gemm-code" and pruned.source == "https://w"
    assert "vllm/_C_stable_libtorch.abi3.so" in pruned.reason
    assert "cutlass_3x_gemm_fp8_blockwise" in pruned.reason and "sm_90a, sm_100f" in pruned.reason


def test_an_arch_specific_cubin_of_sm_120a_does_not_cover_gb10():
    only_120a = KernelCode("k", DeviceCode.from_dict({"cubins": ["sm_120a"]}), 1)
    assert judge_fp8_gemm(cell(arch="sm_121"), VLLM_GEMM, GemmRead("u", only_120a)).pruned
    assert not judge_fp8_gemm(cell(arch="sm_120"), VLLM_GEMM, GemmRead("u", only_120a)).pruned


def test_a_wheel_without_the_object_prunes_and_an_unread_wheel_is_unverified():
    missing = judge_fp8_gemm(cell(), VLLM_GEMM, GemmRead("u", None))
    assert [v.rule for v in missing.pruned] == ["profile-fp8-gemm-missing"]
    unread = judge_fp8_gemm(cell(), VLLM_GEMM, GemmRead(error="offline: not read yet"))
    assert not unread.pruned and [v.rule for v in unread.unverified] == ["profile-unread"]


def test_the_sglang_jit_gemm_needs_its_source_in_the_wheel_and_cuda_12_8():
    present = RECORDED["sglang 0.5.23 x86_64"]["present"][SGLANG_GEMM["member"]]
    ok = judge_fp8_gemm(cell("sglang", "0.5.23"), SGLANG_GEMM, GemmRead("u", present=present))
    assert not ok.pruned and ok.path["coverage"] == "jit" and "nvcc 13.0" in ok.notes[0]
    gone = judge_fp8_gemm(cell("sglang", "0.5.23"), SGLANG_GEMM, GemmRead("u", present=False))
    assert [v.rule for v in gone.pruned] == ["profile-jit-source"]
    old = judge_fp8_gemm(cell("sglang", "0.5.23", cuda="12.6"), SGLANG_GEMM,
                         GemmRead("u", present=True))
    assert [v.rule for v in old.pruned] == ["profile-jit-cuda"]
    assert "CUDA >= 12.8" in old.pruned[0].reason


def test_a_gemm_the_engine_selects_only_on_other_arches_prunes():
    datacenter = dict(VLLM_GEMM, archs=["sm_100"])
    verdict = judge_fp8_gemm(cell(), datacenter, GemmRead("u", recorded_kernel("sm_120")))
    assert [v.rule for v in verdict.pruned] == ["profile-fp8-gemm-arch"]


# --- the FP8 KV backend --------------------------------------------------------------------------

def test_vllm_moves_an_fp8_kv_cache_to_flashinfer_which_jit_compiles_its_modules():
    kv = path_entry("vllm", "0.33.0")["fp8-kv"]
    verdict = judge_fp8_kv(cell(arch="sm_121"), kv, PINS,
                           {"FLASHINFER_CUDA_ARCH_LIST": "12.1a"})
    assert not verdict.pruned and verdict.path["backend"] == "flashinfer"
    assert any("from flash-attn to flashinfer" in n for n in verdict.notes)
    assert any("FLASHINFER_CUDA_ARCH_LIST=12.1a" in n for n in verdict.notes)


def test_an_fp8_kv_backend_the_engine_does_not_install_or_that_cannot_run_prunes():
    kv = path_entry("vllm", "0.33.0")["fp8-kv"]
    assert [v.rule for v in judge_fp8_kv(cell(), kv, {}, {}).pruned] == \
        ["profile-kv-backend-package"]
    hopper_only = dict(kv, backend="fa3")
    assert [v.rule for v in judge_fp8_kv(cell(), hopper_only, PINS, {}).pruned] == \
        ["profile-kv-backend-arch"]


# --- whole profiles ------------------------------------------------------------------------------

FP8 = ProfileSpec("fp8", "Qwen/Qwen3.6-27B-FP8", ("fp8-gemm", "fp8-kv"),
                  {"vllm": ("--kv-cache-dtype", "fp8")})


def test_a_release_whose_path_is_not_recorded_is_unverified_never_guessed():
    assert path_entry("vllm", "0.34.0") is None
    plan = judge_profile(cell(version="0.34.0"), FP8, path_entry("vllm", "0.34.0"), None, PINS,
                         {}, None)
    assert plan.status == "unverified"
    assert {v.rule for v in plan.reasons} == {"profile-path-unread"}
    assert "vllm 0.33.0" in plan.reasons[0].reason  # says which releases were read


def test_a_pruned_need_prunes_the_profile_and_keeps_its_flags_and_checkpoint():
    bad = KernelCode("k", DeviceCode.from_dict({"cubins": ["sm_90a"]}), 1)
    plan = judge_profile(cell(), FP8, path_entry("vllm", "0.33.0"), GemmRead("u", bad), PINS,
                         {}, None)
    assert plan.status == "pruned" and plan.reasons[0].rule == "profile-fp8-gemm-code"
    record = plan.as_dict()
    assert record["engine_args"] == ["--kv-cache-dtype", "fp8"]
    assert record["checkpoint"] == "Qwen/Qwen3.6-27B-FP8"
    assert record["status"] == "pruned"


def test_vllm_0_19_on_gb10_is_pruned_its_blockwise_kernel_is_sm_120a_only():
    """The floor release: the CUTLASS gate (capability >= 100) sends GB10 to a kernel the
    wheel builds for sm_120a alone, so FP8 weights cannot run there; sm_120 can."""
    entry = path_entry("vllm", "0.19.0")
    for arch, status in (("sm_120", "planned"), ("sm_121", "pruned")):
        facts = RECORDED[f"vllm 0.19.0 {machine_of(arch)}"]["kernels"]["vllm/_C.abi3.so"]
        kernel = KernelCode.from_dict(facts["cutlass_3x_gemm_fp8_blockwise"])
        plan = judge_profile(cell(version="0.19.0", arch=arch, cuda="12.9"), FP8, entry,
                             GemmRead("u", kernel), PINS, {}, None)
        assert plan.status == status, plan.reasons
        assert plan.fp8_gemm["cubins"] == ["sm_90a", "sm_100a", "sm_120a"]


def test_unreadable_entries_that_could_hold_the_arch_make_it_unverified_not_pruned():
    kernel = KernelCode("k", DeviceCode.from_dict({"cubins": ["sm_90a"]}), 3, "", 2,
                        DeviceCode.from_dict({"cubins": ["sm_120"]}))
    plan = judge_profile(cell(arch="sm_121"), FP8, path_entry("vllm", "0.33.0"),
                         GemmRead("u", kernel), PINS, {}, None)
    assert plan.status == "unverified" and plan.reasons[0].rule == "profile-unread"
    hopper_only = KernelCode("k", kernel.code, 3, "", 2, DeviceCode.from_dict({"cubins": ["sm_90"]}))
    assert judge_profile(cell(arch="sm_121"), FP8, path_entry("vllm", "0.33.0"),
                         GemmRead("u", hopper_only), PINS, {}, None).status == "pruned"


# --- the shipped matrix: the newest engines on both arches ---------------------------------------

NEWEST = [("vllm", "0.33.0", "2.14.0"), ("sglang", "0.5.23", "2.14.1")]


@pytest.mark.parametrize("engine,version,torch", NEWEST)
@pytest.mark.parametrize("arch", ["sm_120", "sm_121"])
def test_the_shipped_matrix_plans_bf16_and_fp8_for_the_newest_engines(engine, version, torch,
                                                                      arch):
    m = shipped()
    the_cell = Cell("13.0", torch, engine, version, arch)
    facts = EngineFacts("", (f"torch=={torch}",), torch, "13.0", exact_pins=tuple(PINS.items()))
    settings = CellSettings(python="3.11", base="bookworm", engine_package=engine,
                            env=engine_env(the_cell, m, facts),
                            attention_backend=backend_choice(the_cell, m).backend)
    code = RecordedCode()
    plans = {p.profile: p for p in profile_plans(the_cell, m, facts, code,
                                                 machine_of(arch), settings)}
    assert plans["bf16"].status == "planned"
    fp8 = plans["fp8"]
    assert fp8.status == "planned", fp8.reasons
    assert fp8.attention_backend == "flashinfer"
    assert fp8.fp8_gemm["member"] and fp8.fp8_gemm["selected"]
    assert fp8.fp8_gemm["coverage"] in ("exact", "family", "jit")
    assert code.asked == [(engine, version, machine_of(arch), fp8.fp8_gemm["member"])]
    assert fp8.capacity["tokens_per_s"] > plans["bf16"].capacity["tokens_per_s"]
    assert plans["bf16-kv-fp8"].status == "planned"


# --- reading kernels out of fat binaries ---------------------------------------------------------

def cubin(*functions: str) -> bytes:
    """A minimal ELF64 object whose .symtab defines `functions` (STT_FUNC)."""
    strtab = b"\0" + b"".join(f.encode() + b"\0" for f in functions)
    symtab = b"\0" * 24
    offset = 1
    for name in functions:
        symtab += struct.pack("<IBBHQQ", offset, 0x12, 0, 1, 0, 0)
        offset += len(name) + 1
    header_size, body = 64, strtab + symtab
    shoff = header_size + len(body)
    header = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 0)
    sections = b"\0" * 64
    sections += struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, header_size, len(strtab), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 0, 2, 0, 0, header_size + len(strtab), len(symtab),
                            1, 0, 8, 24)
    return bytes(header) + body + sections


def fatbin(*entries: tuple[int, int, int, bytes]) -> bytes:
    body = b""
    for kind, sm, flags, payload in entries:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
        struct.pack_into("<I", header, 28, sm)
        struct.pack_into("<Q", header, 40, flags)
        body += bytes(header) + payload
    return FATBIN_MAGIC + struct.pack("<Q", len(body)) + body


FAMILY = 0x200000


def test_elf_function_names_reads_a_cubins_symbol_table():
    assert elf_function_names(cubin("kernel_a", "_Z3fooPf")) == ["kernel_a", "_Z3fooPf"]
    assert elf_function_names(b"not an elf") == []


def test_kernel_code_keeps_the_arches_whose_entries_define_the_kernel():
    blob = b"\0" * 32 + fatbin(
        (2, 90, 0x100000, cubin("cutlass_3x_gemm_fp8_blockwise_sm90", "other")),
        (2, 120, FAMILY, cubin("x_cutlass_3x_gemm_fp8_blockwise_sm120")),
        (2, 80, 0, cubin("unrelated")),
        (1, 80, 0, b"//\n.version 8.8\n.target sm_80\n.visible .entry cutlass_3x_gemm_fp8_"
                   b"blockwise_ptx(\n"))
    found = kernel_code(blob, ["cutlass_3x_gemm_fp8_blockwise", "absent"])
    code = found["cutlass_3x_gemm_fp8_blockwise"]
    assert [a.sm for a in code.code.cubins] == ["sm_90a", "sm_120f"]
    assert [a.compute for a in code.code.ptx] == ["compute_80"]
    assert code.kernels == 3 and found["absent"].code.empty


def test_compressed_entries_are_decompressed_and_unknown_ones_counted_with_their_arch():
    packed = ZSTD_MAGIC + b"packed"
    blob = fatbin((2, 120, FAMILY, packed), (2, 100, FAMILY, b"\x91unknown bytes" * 4))
    found = kernel_code(blob, ["gemm"], decompress=lambda raw: cubin("gemm_sm120"))
    assert [a.sm for a in found["gemm"].code.cubins] == ["sm_120f"]
    assert found["gemm"].unreadable == 1
    assert [a.sm for a in found["gemm"].unreadable_code.cubins] == ["sm_100f"]
    with pytest.raises(CannotDecompress):
        kernel_code(blob, ["gemm"], decompress=None)


def lz4_literals(data: bytes) -> bytes:
    """An LZ4 block of one literal run (a valid block any decoder reads)."""
    n = len(data)
    if n < 15:
        return bytes([n << 4]) + data
    extra, rest = b"", n - 15
    while rest >= 255:
        extra, rest = extra + b"\xff", rest - 255
    return b"\xf0" + extra + bytes([rest]) + data


def test_lz4_blocks_decode_literals_and_overlapping_matches():
    # "abc", then a match of 7 at offset 3 (overlapping), then the literal "x"
    block = bytes([0x33]) + b"abc" + b"\x03\x00" + bytes([0x10]) + b"x"
    assert lz4_block(block, 11) == b"abcabcabcax"
    assert lz4_block(lz4_literals(b"q" * 300), 300) == b"q" * 300


def test_an_lz4_compressed_cubin_entry_is_read_from_its_header_sizes():
    elf = cubin("cutlass_3x_gemm_fp8_blockwise_sm120")
    payload = lz4_literals(elf)
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, 2, 0x101, 64, len(payload) + 3)
    struct.pack_into("<Q", header, 16, len(payload))  # compressed size
    struct.pack_into("<I", header, 28, 120)
    struct.pack_into("<Q", header, 40, 0x2011)  # LZ4
    struct.pack_into("<Q", header, 56, len(elf))  # uncompressed size
    body = bytes(header) + payload + b"\0\0\0"  # padded
    blob = FATBIN_MAGIC + struct.pack("<Q", len(body)) + body
    found = kernel_code(blob, ["fp8_blockwise"])["fp8_blockwise"]
    assert [a.sm for a in found.code.cubins] == ["sm_120"] and found.unreadable == 0


def test_the_recorded_facts_are_what_the_reader_wrote():
    """The fixture holds reader output (KernelCode dicts), so the round trip must hold."""
    for key, wheel in RECORDED.items():
        for member, patterns in wheel.get("kernels", {}).items():
            for pattern, data in patterns.items():
                assert KernelCode.from_dict(data).as_dict() == data, (key, member)
    assert yaml.safe_load((ROOT / "matrix.yaml").read_text())["profiles"]
