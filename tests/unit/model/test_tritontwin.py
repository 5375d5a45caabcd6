"""The native twin of a foreign-CPU cell (model/tritontwin.py, issue 27): pure logic, no Docker."""

from __future__ import annotations

import copy

import pytest

from infermatrix.model.cell import Cell, CellPlan, CellSettings
from infermatrix.model.tritontwin import (adopt, digest_mismatch, natives_first,
                                          restrict_to_archs, twin_archs_for)

AMD64, ARM64 = "linux/amd64", "linux/arm64"


def plan(arch: str, platform: str, engine: str = "vllm", version: str = "0.33.0",
         torch: str = "2.14.0") -> CellPlan:
    return CellPlan(Cell("13.0", torch, engine, version, arch), "planned",
                    settings=CellSettings(python="3.11", base="bookworm", engine_package=engine,
                                          platform=platform))


SM120, GB10 = plan("sm_120", AMD64), plan("sm_121", ARM64)
SGLANG_GB10 = plan("sm_121", ARM64, engine="sglang", version="0.5.23", torch="2.14.1")


def test_a_native_cell_is_the_twin_of_its_foreign_sibling_only():
    plans = [SM120, GB10, SGLANG_GB10]
    assert twin_archs_for(SM120, plans, AMD64) == ["sm_121"]
    assert twin_archs_for(GB10, plans, AMD64) == []  # foreign itself
    # on an arm64 build machine the roles swap: the GB10 cell is native, sm_120 foreign
    assert twin_archs_for(GB10, plans, ARM64) == ["sm_120"]
    other_torch = plan("sm_121", ARM64, torch="2.13.0")
    assert twin_archs_for(SM120, [SM120, other_torch], AMD64) == []


def test_natives_are_audited_first():
    assert [p.id for p in natives_first([GB10, SM120], AMD64)] == [SM120.id, GB10.id]


def harness(*archs: tuple[str, str]) -> dict:
    return {"check": "triton-smem", "status": "pass", "archs": [
        {"arch": arch, "status": status, "reason": None if status == "pass" else "over",
         "families": []} for arch, status in archs]}


def test_restricting_a_result_recomputes_its_status_over_the_kept_archs():
    both = harness(("sm_120", "pass"), ("sm_121", "fail"))
    assert restrict_to_archs(both, ["sm_120"])["status"] == "pass"
    kept = restrict_to_archs(both, ["sm_121"])
    assert kept["status"] == "fail" and kept["reason"] == "sm_121: over"
    assert restrict_to_archs(both, ["sm_100"])["status"] == "skip"


DIGESTS = {"vllm": {"version": "0.33.0", "sha256": "a" * 64, "files": 2100},
           "triton": {"version": "3.8.0", "sha256": "b" * 64, "files": 300},
           "torch": {"version": "2.14.0", "sha256": "c" * 64, "files": 4000}}


def native_audit(digests=DIGESTS, archs=(("sm_120", "pass"), ("sm_121", "pass")),
                 python="3.11.2") -> dict:
    return {"image": "sha256:twin", "checks": [
        {"name": "kernels", "status": "pass"},
        {"name": "triton-smem", "status": "pass", "harness": harness(*archs),
         "python": python, "py_digests": copy.deepcopy(digests)}]}


def test_a_twin_with_identical_sources_is_adopted_for_the_foreign_arch_only():
    match, why = adopt(GB10.id, "3.11.2", DIGESTS, ["sm_121"], {SM120.id: native_audit()})
    assert match is not None and why == []
    assert match.cell_id == SM120.id and match.image == "sha256:twin"
    assert [a["arch"] for a in match.result["archs"]] == ["sm_121"]
    assert match.result["status"] == "pass"


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d["vllm"].update(sha256="f" * 64), "vllm 0.33.0: its .py files differ"),
    (lambda d: d["triton"].update(version="3.7.1"), "triton 3.8.0 here, 3.7.1 in the twin"),
    (lambda d: d.pop("torch"), "torch is in this image only"),
])
def test_a_twin_whose_sources_differ_is_passed_over_with_the_reason(change, said):
    theirs = copy.deepcopy(DIGESTS)
    change(theirs)
    match, why = adopt(GB10.id, "3.11.2", DIGESTS, ["sm_121"],
                       {SM120.id: native_audit(theirs)})
    assert match is None and len(why) == 1 and said in why[0], why


def test_a_twin_that_did_not_compile_the_arch_or_another_python_is_passed_over():
    only_own = native_audit(archs=(("sm_120", "pass"),))
    match, why = adopt(GB10.id, "3.11.2", DIGESTS, ["sm_121"], {SM120.id: only_own})
    assert match is None and "not sm_121" in why[0]
    match, why = adopt(GB10.id, "3.11.2", DIGESTS, ["sm_121"],
                       {SM120.id: native_audit(python="3.11.9")})
    assert match is None and "Python 3.11.9 there" in why[0]


def test_a_failing_twin_arch_is_adopted_as_a_failure():
    failing = native_audit(archs=(("sm_120", "pass"), ("sm_121", "fail")))
    match, _ = adopt(GB10.id, "3.11.2", DIGESTS, ["sm_121"], {SM120.id: failing})
    assert match is not None and match.result["status"] == "fail"


def test_cells_of_other_versions_are_never_twins():
    other = plan("sm_120", AMD64, version="0.32.0")
    match, why = adopt(GB10.id, "3.11.2", DIGESTS, ["sm_121"], {other.id: native_audit()})
    assert match is None and why == []


def test_unhashed_sources_never_prove_a_twin():
    assert digest_mismatch({}, DIGESTS) == "this image's Python sources were not hashed"
