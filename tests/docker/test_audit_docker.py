"""audit against the real Docker engine: images that hold the test fixture kernel package
(tests/fixtures/cudakern, compiled by this host's nvcc 13.0) for sm_120 and for sm_120a only.

Real files, real cuobjdump, the real probe in a container of the test matrix's debootstrap base.
These tiny images carry no torch, so the torch checks fail in them on purpose; what is held here
is the kernel coverage verdict, the naming of the uncovered object, the journal record, the
cache and the command line. The full cell images (torch included) are audited by the pipeline.
"""

from __future__ import annotations

from tests.paths import TESTS

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from infermatrix.options import RunOptions
from infermatrix.stages import audit
from infermatrix.engine import docker as engine
from infermatrix import journal
from infermatrix.stages.audit import FAIL, PASS
from infermatrix.model.coverage import Arch, Coverage
from infermatrix.model.cell import Cell, CellPlan, CellSettings
from tests.support.cuda_tools import NO_NVCC, NVCC

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = pytest.mark.docker

FIXTURE = TESTS / "fixtures" / "cudakern"
SITE = "/usr/lib/python3/dist-packages"  # on Debian's python3 sys.path
OBJECT = "cudakern/libcudakern.so"

nvcc = NVCC


def plan_for(arch: str) -> CellPlan:
    cell = Cell("13.0", "2.13.0", "kernel-fixture", "1.0", arch)
    return CellPlan(cell, "planned", settings=CellSettings(
        python="3.11", base="bookworm", engine_package=None, kernels=["cudakern"]))


def compile_fixture(out: Path, arch_code: str) -> None:
    """libcudakern.so from the fixture's sources, as its setup.py builds it, for one target."""
    sources = sorted(str(p) for p in (FIXTURE / "src").glob("*.cu"))
    subprocess.run([nvcc, "-O2", "-shared", "-Xcompiler", "-fPIC", "-gencode",
                    f"arch=compute_{arch_code},code=sm_{arch_code}", "-o", str(out), *sources],
                   check=True, capture_output=True, timeout=600)


def input_digest(base_ref: str, arch_code: str) -> str:
    """What the tiny image is made from (nvcc output differs run to run: key on the inputs)."""
    digest = hashlib.sha256(f"{base_ref} {arch_code} {nvcc}".encode())
    for path in sorted((FIXTURE / "src").glob("*")) + [FIXTURE / "cudakern" / "__init__.py",
                                                       Path(__file__)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def fixture_image(base_ref: str, workdir: Path, arch_code: str, cell_id: str) -> str:
    """A tiny image: the base plus cudakern installed (package, .so, dist-info)."""
    tag = f"infermatrix-audit-test:sm{arch_code}-{input_digest(base_ref, arch_code)}"
    if DOCKER.image_exists(tag):
        return tag
    context = workdir / f"ctx-{arch_code}"
    package = context / "site" / "cudakern"
    package.mkdir(parents=True)
    shutil.copy(FIXTURE / "cudakern" / "__init__.py", package / "__init__.py")
    compile_fixture(package / "libcudakern.so", arch_code)
    info = context / "site" / "cudakern-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cudakern\nVersion: 0.1.0\n")
    (info / "INSTALLER").write_text("infermatrix-test\n")
    (info / "RECORD").write_text("cudakern/__init__.py,,\ncudakern/libcudakern.so,,\n"
                                 "cudakern-0.1.0.dist-info/METADATA,,\n"
                                 "cudakern-0.1.0.dist-info/RECORD,,\n")
    (context / "Dockerfile").write_text(f"FROM {base_ref}\nCOPY site/ {SITE}/\n")
    DOCKER.build_image(engine.BuildRequest(context, tag=tag,
                                           labels={"io.infermatrix.cell": cell_id}),
                       timeout=600)
    return tag


@pytest.fixture(scope="module")
def images(built_base: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if nvcc is None:
        pytest.skip(f"{NO_NVCC} (the fixture is compiled on the host)")
    workdir = tmp_path_factory.mktemp("audit-images")
    return {"120": fixture_image(built_base, workdir, "120", plan_for("sm_120").id),
            "120a": fixture_image(built_base, workdir, "120a", plan_for("sm_121").id)}


def test_fixture_built_for_sm120_covers_sm120_and_sm121(test_ctx, images) -> None:
    plan = plan_for("sm_120")
    result = audit.audit_cell(test_ctx, test_ctx.spec(plan), images["120"], ["sm_120", "sm_121"],
                              docker=DOCKER)
    kernels = result.check("kernels")
    assert kernels is not None and kernels.status == PASS, kernels
    [obj] = result.objects
    assert (obj.path, obj.package) == (OBJECT, "cudakern")
    assert obj.code.cubins == (Arch(12, 0),)
    assert [d.coverage for d in obj.decisions] == [Coverage.EXACT, Coverage.COMPATIBLE]
    # the pins: cudakern is at its pin; this tiny image has no torch, which the audit says
    assert result.versions["cudakern"] == "0.1.0"
    pins = result.check("pins")
    assert pins.status == FAIL and "torch==2.13.0 (cell axis torch)" in pins.data["missing"]
    assert result.check("torch-cuda").detail == "torch is not installed"
    assert result.check("pip-check").status == PASS, result.check("pip-check")
    # recorded in the journal, with the table the report reads
    stage = journal.load(test_ctx.state, plan.id)["stages"]["audit"]
    assert stage["details"]["coverage"][0]["object"] == OBJECT
    assert stage["details"]["coverage"][0]["sm_121"] == "compatible (sm_120)"


def test_fixture_built_only_as_sm120a_fails_for_sm121_and_names_the_object(test_ctx,
                                                                           images) -> None:
    plan = plan_for("sm_121")
    result = audit.audit_cell(test_ctx, test_ctx.spec(plan), images["120a"], docker=DOCKER)
    assert result.targets == [Arch(12, 1)]
    assert not result.passed
    assert result.check("kernels").status == FAIL
    assert result.uncovered == [f"{OBJECT} (sm_121)"]
    assert OBJECT in result.check("kernels").detail and "sm_120a" in result.check("kernels").detail
    record = journal.load(test_ctx.state, plan.id)["stages"]["audit"]
    assert record["status"] == "fail"
    assert OBJECT in record["reason"]
    assert record["details"]["uncovered"] == [f"{OBJECT} (sm_121)"]
    # the same object on its own arch is covered (an `a` cubin runs on exactly its CC)
    again = audit.audit_cell(test_ctx, test_ctx.spec(plan), images["120a"], ["sm_120"],
                             record=False, docker=DOCKER)
    assert again.check("kernels").status == PASS


def test_cuobjdump_results_are_cached_by_content(test_ctx, images) -> None:
    cache = test_ctx.state.root / "cache" / "cuobjdump"
    audit.audit_cell(test_ctx, test_ctx.spec(plan_for("sm_120")), images["120"], record=False,
                     docker=DOCKER)
    entries = sorted(cache.glob("*.json"))
    assert len(entries) >= 1
    before = {p: p.stat().st_mtime_ns for p in entries}
    audit.audit_cell(test_ctx, test_ctx.spec(plan_for("sm_120")), images["120"], record=False,
                     docker=DOCKER)
    assert {p: p.stat().st_mtime_ns for p in sorted(cache.glob("*.json"))} == before


def test_cli_audit_of_an_image_exits_1_and_names_the_object(test_ctx, images, capsys) -> None:
    from infermatrix.cli import main

    cell_id = plan_for("sm_121").id
    code = main(["audit", images["120a"], "--matrix", str(test_ctx.matrix.path),
                 "--state-dir", str(test_ctx.state.root), "--select", cell_id, "--no-record"])
    out = capsys.readouterr().out
    assert code == 1
    # the short view: the failing object on its own line, first, with its key
    [line] = [line for line in out.splitlines() if line.strip().startswith("FAIL ")
              and line.endswith("libcudakern.so")]
    assert line.split()[1] == "sm_120a-only" or line.split()[1].startswith("built-for-"), out
    assert "sm_121: 0 covered · 0 PTX-JIT · 0 not loaded · 1 failing" in out


def test_cli_json_with_a_target(test_ctx, images, capsys) -> None:
    import json

    from infermatrix.cli import main

    cell_id = plan_for("sm_120").id
    code = main(["audit", images["120"], "--matrix", str(test_ctx.matrix.path),
                 "--state-dir", str(test_ctx.state.root), "--select", cell_id,
                 "--target", "sm_121", "--json", "--no-record"])
    [result] = json.loads(capsys.readouterr().out)
    assert code == 1  # no torch in the tiny image
    kernels = next(c for c in result["checks"] if c["name"] == "kernels")
    assert kernels["status"] == "pass"
    assert result["coverage"][0]["sm_121"] == "compatible (sm_120)"


# --- the test matrix's real cells (torch 2.13.0 + CUDA 13 wheels + the compiled fixture) ------

GOOD_CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm120"
ARCH_SPECIFIC_CELL = "cu130-torch2.13.0-arch-specific-fixture1.0-sm121"


@pytest.fixture(scope="module")
def real_cells(test_ctx, built_base) -> dict[str, tuple[CellPlan, str]]:
    """Render and build the two cells through build.build_cells (a no-op when this session or
    an earlier one with the same state built them already)."""
    from infermatrix.stages import build, render
    from infermatrix.stages.plan import plan_matrix
    from tests.support.planning_support import recorded_metadata

    plans = plan_matrix(test_ctx, select=[GOOD_CELL, ARCH_SPECIFIC_CELL],
                        source=recorded_metadata)
    render.render_cells(test_ctx, plans)
    results = build.build_cells(test_ctx, test_ctx.specs(plans), RunOptions(wait=True),
                                docker=DOCKER)
    for result in results.values():
        assert result.status == "pass", result.summary()
    return {p.id: (p, results[p.id].image_id) for p in plans}


@pytest.mark.slow
@pytest.mark.network
def test_real_cell_compiled_for_sm120_passes_every_check_for_sm120_and_sm121(test_ctx,
                                                                            real_cells) -> None:
    plan, image = real_cells[GOOD_CELL]
    result = audit.audit_cell(test_ctx, test_ctx.spec(plan), image, ["sm_120", "sm_121"],
                              docker=DOCKER)
    assert result.passed, result.reason
    assert {c.name: c.status for c in result.checks} == {
        "kernels": PASS, "cuda-major": PASS, "torch-cuda": PASS, "pins": PASS,
        "pip-check": PASS, "engine-floor": "skip", "triton-smem": "skip", "loaded-set": "skip"}
    fixture = next(o for o in result.objects if o.package == "cudakern")
    assert [d.coverage for d in fixture.decisions] == [Coverage.EXACT, Coverage.COMPATIBLE]
    assert any(o.path == "torch/lib/libtorch_cuda.so" for o in result.objects)
    assert result.versions["torch"].startswith("2.13.0")


@pytest.mark.slow
@pytest.mark.network
def test_real_cell_with_only_an_sm120a_cubin_fails_for_sm121(test_ctx, real_cells) -> None:
    plan, image = real_cells[ARCH_SPECIFIC_CELL]
    result = audit.audit_cell(test_ctx, test_ctx.spec(plan), image, docker=DOCKER)
    assert not result.passed
    assert result.uncovered == [f"{OBJECT} (sm_121)"]
    assert [c.name for c in result.checks if c.status == FAIL] == ["kernels"]
    # the fixture image's object is loaded (no loaded.yaml entry): its failure names the target
    assert "do not run on sm_121:" in result.check("kernels").detail
    record = journal.load(test_ctx.state, ARCH_SPECIFIC_CELL)["stages"]["audit"]
    assert record["status"] == "fail" and OBJECT in record["reason"]


def test_missing_image_fails_the_audit_with_a_reason(test_ctx, docker_available) -> None:
    result = audit.audit_cell(test_ctx, test_ctx.spec(plan_for("sm_120")),
                              "infermatrix-audit-test:no-such-tag", record=False, docker=DOCKER)
    assert not result.passed
    [probe] = result.checks
    assert probe.name == "probe" and "no-such-tag" in probe.detail


# ---- an image whose programs run emulated here: its probe runs natively ----------------------

REAL_MATRIX = TESTS / "real" / "matrix.yaml"
DYNLOAD = "/usr/lib/python3.11/lib-dynload"


@pytest.fixture(scope="module")
def arm64_image(tmp_path_factory: pytest.TempPathFactory, docker_available) -> str:
    """The real matrix's arm64 base (CI's bases phase makes it) plus a package of aarch64
    objects taken from it: one plain, one carrying a fat binary's magic (GPU code to the
    probe, so it is hashed) and a .py file (the twin check's digests)."""
    from infermatrix.config import load_matrix
    from infermatrix.model.coverage import FATBIN_MAGIC
    from infermatrix.stages import base
    from infermatrix.state import StatePaths

    workdir = tmp_path_factory.mktemp("arm64-probe")
    ref = base.build_base(load_matrix(REAL_MATRIX), "bookworm",
                          StatePaths.at(workdir / "state"), platform="linux/arm64",
                          docker=DOCKER).ref
    if engine.host_platform() == "linux/arm64":
        pytest.skip("this host runs arm64 images natively: nothing is emulated")
    site = workdir / "ctx" / "site"
    package = site / "probefixture"
    package.mkdir(parents=True)
    plain, other = (f"{DYNLOAD}/{name}.cpython-311-aarch64-linux-gnu.so"
                    for name in ("_bz2", "_asyncio"))
    copied = DOCKER.copy_from_image(ref, [plain, other], workdir / "objects")
    shutil.copy(copied[plain], package / "_plain.so")
    (package / "_gpu.so").write_bytes(copied[other].read_bytes() + FATBIN_MAGIC)
    (package / "__init__.py").write_text("VALUE = 1\n")
    info = site / "probefixture-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: probefixture\nVersion: 1.0\n")
    (info / "RECORD").write_text("probefixture/__init__.py,,\nprobefixture/_plain.so,,\n"
                                 "probefixture/_gpu.so,,\nprobefixture-1.0.dist-info/METADATA,,\n"
                                 "probefixture-1.0.dist-info/RECORD,,\n")
    (workdir / "ctx" / "Dockerfile").write_text(f"FROM {ref}\nCOPY site/ {SITE}/\n")
    return DOCKER.build_image(engine.BuildRequest(
        workdir / "ctx", tag="infermatrix-audit-test:arm64-probe", platform="linux/arm64"),
        timeout=600)


def test_an_emulated_images_probe_runs_natively_and_sees_what_the_emulated_one_sees(
        arm64_image, tmp_path) -> None:
    """The GB10 cell's probe took ~3 min under QEMU: this machine's Python now reads the image
    inside its container. Both ways give the same facts; only `pip check` differs, which the
    emulated probe cannot run here (the host's uv needs the host's loader) and the native one
    can."""
    import time

    emulated = DOCKER.emulation_of(arm64_image)
    assert emulated and emulated.startswith("linux/arm64 under QEMU")
    native = audit.native_python()
    assert native is not None
    started = time.monotonic()
    code, native_output = audit._run_probe(arm64_image, ["probefixture"], 600, native, DOCKER)
    native_s = time.monotonic() - started
    assert code == 0, native_output[-3000:]
    started = time.monotonic()
    code, emulated_output = audit._run_probe(arm64_image, ["probefixture"], 600, None, DOCKER)
    emulated_s = time.monotonic() - started
    assert code == 0, emulated_output[-3000:]
    print(f"probe: native {native_s:.1f} s, emulated {emulated_s:.1f} s")
    fast, slow = (audit.parse_probe_output(native_output),
                  audit.parse_probe_output(emulated_output))
    assert {k: v for k, v in fast.items() if k != "pip_check"} == \
        {k: v for k, v in slow.items() if k != "pip_check"}
    by_path = {o["rel"]: o for o in fast["objects"] if o["dist"] == "probefixture"}
    assert by_path["probefixture/_gpu.so"]["gpu_code"] is True
    assert len(by_path["probefixture/_gpu.so"]["sha256"]) == 64
    assert by_path["probefixture/_plain.so"]["gpu_code"] is False
    assert fast["py_digests"]["probefixture"]["files"] == 1
    assert fast["python"].startswith("3.11") and fast["pip_check"]["machine"] == "aarch64"
    assert fast["pip_check"]["returncode"] == 0, fast["pip_check"]
    # probe_image takes the native way for it, and says so in the log
    log = tmp_path / "audit.log"
    facts = audit.probe_image(arm64_image, DOCKER, log, digest_dists=["probefixture"],
                              emulated=emulated)
    assert facts.objects == fast["objects"]
    assert f"with native {native.binary}: exit 0" in log.read_text()
