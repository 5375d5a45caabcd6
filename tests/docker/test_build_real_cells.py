"""The newest shipped vLLM and SGLang sm_120 cells, built for real (tests/real/matrix.yaml).

Real engine wheels, real torch 2.14 (CUDA 13.0 runtime), the real CUDA 13.0 toolkit from
NVIDIA's PyPI wheels, the shipped debootstrap base and templates; the compiled kernel is the
fixture tests/fixtures/cudakern (the real flash-attn / FlashInfer compiles are the main job's).
One cell at a time: built, checked (labels, versions inside the image, the audit on its real
objects), then its image removed, so that CI holds one 10-15 GB image at most.

They run on a private engine of their own (a disk-backed dockerd, tests/support/dockerd_support.py,
with NAT to PyPI), CI's `real` lane (tests/lanes.py), so that what the build's disk guard prunes
there never touches another test's cache. Between cells nothing else is pruned: the uv cache
mount (the sm_120 cells' locks share 30 of 32 nvidia pins, and triton) and the shared
toolchain layers stay for the next cell. The bases are built on the machine's engine (CI's
bases phase builds them before this lane starts) and copied in.

The GB10 cell (sm_121) is the shipped one, linux/arm64, built for real under QEMU (qemu-user,
binfmt_misc, .ci/provision): its aarch64 wheels, its arm64 base, and the audit of its aarch64
objects, whose probe runs emulated too.
"""

from __future__ import annotations

from tests.paths import TESTS

from collections.abc import Iterator
from pathlib import Path

import pytest

from infermatrix.options import RunOptions
from infermatrix import journal
from infermatrix.context import Context
from infermatrix.engine import docker as engine
from infermatrix.model.coverage import Arch, Coverage
from infermatrix.model.tritontwin import twin_archs_for
from infermatrix.stages import audit, render, smoke, tagging
from infermatrix.stages.build import build_cells, local_ref
from infermatrix.stages.plan import plan_matrix
from tests.support.dockerd_support import PrivateDockerd
from tests.support.real_audit_checks import CHECKS, check_kernel_list

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow, pytest.mark.realcell,
              pytest.mark.timeout(45 * 60)]

REAL_MATRIX = TESTS / "real" / "matrix.yaml"
CELLS = {
    "cu130-torch2.14.0-vllm0.33.0-sm120": ("vllm", "0.33.0", "2.14.0"),
    "cu130-torch2.14.1-sglang0.5.23-sm120": ("sglang", "0.5.23", "2.14.1"),
}


@pytest.fixture(scope="module")
def real_ctx(shared_state_dir: Path) -> Context:
    return Context.load(REAL_MATRIX, shared_state_dir / "real")


@pytest.fixture(scope="module")
def real_engine(docker_available) -> Iterator[engine.Engine]:
    """A private, disk-backed dockerd (NAT to PyPI) that this module's builds talk to."""
    # nice -3: CI's two cores are saturated and this lane ends last (measured: 8 min after
    # the next one), so its builds and containers get a larger share of them
    daemon = PrivateDockerd("imreal", "10.231.0.1/24", nat=True, niceness=-3)
    try:
        daemon.start()
        yield engine.Engine(engine.Endpoint(name="real-lane", host=daemon.host))
    finally:
        daemon.stop(background_removal=True)  # the lane's last step: it need not wait


def base_on(private: engine.Engine, ctx: Context, platform: str | None = None) -> str:
    """The real matrix's base for `platform`, built on the machine's engine when it lacks it
    (CI's bases phase has built it) and copied into the private one."""
    from infermatrix.stages import base

    machine = engine.Engine()
    ref = base.build_base(ctx.matrix, "bookworm", ctx.state, platform=platform,
                          docker=machine).ref
    if not private.image_exists(ref):
        machine.copy_image_to(ref, private)
    return ref


@pytest.fixture(scope="module")
def real_base(real_engine, real_ctx) -> str:
    return base_on(real_engine, real_ctx)


ARM64_CELL = "cu130-torch2.14.0-vllm0.33.0-sm121"


def free_the_cells_disk(ref: str, private: engine.Engine) -> None:
    """Remove the cell's image. Its layers stay in BuildKit's cache for the next cell (the
    shared toolchain, the uv cache mount); the build's disk guard (build.disk.min_free_gib of
    tests/real/matrix.yaml) prunes this private engine's cache when the next cell would not
    fit, as it does in the main job."""
    private.remove_image(ref, force=True)


def plan_render_build(ctx: Context, cell_id: str, private: engine.Engine):
    """(plan, build result) of one real cell, planned, rendered and built on `private`."""
    [plan] = plan_matrix(ctx, select=[cell_id])
    assert plan.planned, plan.verdicts
    render.render_cells(ctx, [plan])
    return plan, build_cells(ctx, ctx.specs([plan]), RunOptions(), echo=lambda _: None,
                             docker=private)[cell_id]


@pytest.mark.parametrize("cell_id", sorted(CELLS))
def test_real_cell_builds_from_its_engine_wheels_and_is_audited(real_ctx, real_engine, real_base,
                                                                cell_id, tmp_path):
    engine_name, version, torch_version = CELLS[cell_id]
    plan, result = plan_render_build(real_ctx, cell_id, real_engine)
    ref = local_ref(cell_id)
    try:
        assert result.status == "pass", result.summary()
        labels = real_engine.image_labels(ref)
        assert labels["io.infermatrix.engine.version"] == version
        assert labels["io.infermatrix.kernel.cudakern.consumer"].startswith("fixture")
        record = journal.load(real_ctx.state, cell_id)["stages"]["build"]
        compiled = record["details"]["kernels"]["cudakern"]["compile"]
        assert compiled["exit"] == 0 and compiled["seconds"] >= 0 and compiled["peak_rss_bytes"] > 0
        # the vLLM cell is the GB10 cell's native twin: its Triton check compiles for sm_121
        # too, for the GB10 test (below, run after it) to adopt
        verdict = audit.audit_cell(real_ctx, real_ctx.spec(plan), result.image_id, ["sm_120"],
                                   twin_archs=twin_archs_for(plan, plan_matrix(real_ctx),
                                                             engine.host_platform()),
                                   docker=real_engine)
        checks = {c.name: c.status for c in verdict.checks}
        # torch 2.14 from PyPI is the CUDA 13.0 build, and the image's CUDA major is 13
        assert checks["torch-cuda"] == audit.PASS, verdict.reason
        assert checks["cuda-major"] == audit.PASS, verdict.reason
        assert verdict.versions[engine_name].startswith(version)
        assert verdict.versions["torch"].startswith(torch_version)
        fixture = next(o for o in verdict.objects if o.package == "cudakern")
        assert [d.coverage for d in fixture.decisions] == [Coverage.EXACT]
        assert any(o.path == "torch/lib/libtorch_cuda.so" for o in verdict.objects)
        CHECKS[engine_name](verdict)  # the loaded set, PTX JIT and Triton verdicts (issue 13)
        triton = verdict.check("triton-smem")
        assert {r["arch"] for r in triton.data["summary"]} == {"sm_120"}  # judged on its own
        compiled = {a["arch"] for a in triton.data["harness"]["archs"]}
        assert compiled == ({"sm_120", "sm_121"} if engine_name == "vllm" else {"sm_120"})
        assert {"triton", "torch", engine_name} <= set(triton.data["py_digests"])
        check_the_short_view(verdict)
        if engine_name == "vllm":  # a serve flag that switches the GDN backend changes the path
            args = [*plan.settings.engine_args, "--gdn-prefill-backend", "triton"]
            paths = audit.serve_paths(result.image_id, real_engine, "vllm", [Arch(12, 0)],
                                      real_ctx.matrix.model["name"], args)
            assert paths["sm_120"]["gdn_prefill"]["chosen"] == "triton", paths
            assert "importable" not in paths["sm_120"]["gdn_prefill"]  # no FlashInfer kernel
        else:  # SGLang: an explicit FlashInfer GDN prefill is its sm120 CuTe DSL kernel
            args = [*plan.settings.engine_args, "--linear-attn-prefill-backend", "flashinfer"]
            paths = audit.serve_paths(result.image_id, real_engine, "sglang", [Arch(12, 0)],
                                      real_ctx.matrix.model["name"], args)
            prefill = paths["sm_120"]["gdn_prefill"]
            assert (prefill["chosen"], prefill["kernel"]) == (
                "flashinfer", "flashinfer.gdn_kernels.chunk_gated_delta_rule_sm120"), paths
            assert prefill["importable"] is True, prefill
    finally:
        free_the_cells_disk(ref, real_engine)


def check_the_short_view(verdict: audit.AuditResult) -> None:
    """The terminal's audit of the real image (issue 31): under 40 lines at 100 columns, every
    waived object named on a line of its own with a reason key other than the fallback."""
    import io

    from rich.console import Console

    from infermatrix.cli.views import audit_lines, print_lines

    out = io.StringIO()
    print_lines(audit_lines(verdict.as_dict()),
                Console(file=out, width=100, force_terminal=True, color_system=None))
    shown = out.getvalue().splitlines()
    assert len(shown) < 40, "\n".join(shown)
    for target, group in verdict.groups().items():
        for item in group["not-loaded"]:
            [line] = [line for line in shown if line.endswith(item["object"])]
            assert "not loaded" in line and "waived" not in line, line
            assert item["key"] in line, (item, line)


def test_real_gb10_cell_builds_as_linux_arm64_under_emulation_and_is_audited(real_engine,
                                                                             real_ctx):
    """The shipped vLLM 0.33 GB10 cell: wheels only (no kernel compile), an arm64 image."""
    assert base_on(real_engine, real_ctx, platform="linux/arm64")
    # the build machine's base too: the installer and bytecode stages run on its CPU
    assert base_on(real_engine, real_ctx, platform=engine.host_platform())
    plan, result = plan_render_build(real_ctx, ARM64_CELL, real_engine)
    ref = local_ref(ARM64_CELL)
    try:
        assert result.status == "pass", result.summary()
        info = real_engine.inspect_image(ref)
        assert (info["Os"], info["Architecture"]) == ("linux", "arm64")
        assert real_engine.image_labels(ref)["io.infermatrix.engine.version"] == "0.33.0"
        verdict = audit.audit_cell(real_ctx, real_ctx.spec(plan), result.image_id, ["sm_121"],
                                   docker=real_engine)
        checks = {c.name: c for c in verdict.checks}
        # the aarch64 wheels' objects: vLLM's custom ops run on 12.1 by their sm_120f cubins,
        # its bundled FA2 by PTX JIT, FA3 and FlashMLA are not loaded there
        assert verdict.objects and checks["kernels"].status == audit.PASS, verdict.reason
        by_path = {o.path: o for o in verdict.objects}
        ops = by_path["vllm/_C_stable_libtorch.abi3.so"]
        assert [d.coverage for d in ops.decisions] == [Coverage.FAMILY]
        assert [d.coverage for d in by_path["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
                .decisions] == [Coverage.PTX_JIT]
        groups = verdict.groups()["sm_121"]
        assert {g["entry"] for g in groups["not-loaded"]} >= {"vllm-fa3", "vllm-flashmla"}
        assert checks["cuda-major"].status == audit.PASS, checks["cuda-major"].detail
        # Triton cannot start under qemu-user: the check is the native twin's (the vLLM sm_120
        # cell, audited above with sm_121 added), adopted because the .py files of vllm,
        # triton, torch and flashinfer-python hash the same in both images
        triton = checks["triton-smem"]
        assert triton.status == audit.PASS, triton.detail
        twin = triton.data["twin"]
        assert twin["cell"] == "cu130-torch2.14.0-vllm0.33.0-sm120", twin
        assert {"vllm", "triton", "torch", "flashinfer-python"} <= set(twin["digests"])
        assert twin["digests"] == triton.data["py_digests"]
        rows = [r for r in triton.data["summary"] if r["arch"] == "sm_121"]
        assert {r["arch"] for r in triton.data["summary"]} == {"sm_121"} and len(rows) >= 10
        # autotune honoured: some GDN chunk kernel has configs over the limit but not all
        assert any(0 < r["over"] < r["configs"] for r in rows), rows
        assert "native twin cu130-torch2.14.0-vllm0.33.0-sm120" in triton.detail
        # the twin's sm_121 kernels held against vLLM 0.33.0's list, chunk_o's tiles included
        check_kernel_list(triton, "vllm", "0.33.0", arch="sm_121")
        # `import torch` cannot run under qemu-user (oneDNN reads MIDR_EL1 from sysfs): the
        # CUDA build is read from torch/version.py and the check says so
        torch_check = checks["torch-cuda"]
        assert torch_check.status == audit.PASS, torch_check.detail
        assert torch_check.data["emulated"] == "linux/arm64 under QEMU on linux/amd64"
        # NVIDIA's cuSPARSELt wheel says `manylinux2014_sbsa` in its WHEEL file
        assert checks["pip-check"].status == audit.PASS, checks["pip-check"].detail
        assert checks["pins"].status == audit.PASS, checks["pins"].detail
        assert verdict.versions["vllm"] == "0.33.0"
        assert verdict.versions["torch"].startswith("2.14.0")
        assert verdict.passed, verdict.reason
        # its smoke here: the audit just recorded is the static level's; the imports would
        # crash under QEMU (measured: a 600-s timeout), so they are refused at once with
        # where they can run, and the tag stage does not tag the cell
        smoked = smoke.smoke_cell(real_ctx, real_ctx.spec(plan),
                                  RunOptions(levels=["static", "gpu", "model"]),
                                  docker=real_engine)
        static = smoked.levels["static"]
        assert static.status == "skip", static.reason
        assert static.details["audit"]["status"] == "pass" and static.details["audit"]["reused"]
        assert "on a linux/arm64 engine: --smoke-on NAME" in static.reason, static.reason
        assert static.details["imports"]["emulated"] == "linux/arm64 under QEMU on linux/amd64"
        decision = tagging.tag_cell(real_ctx, plan.cell, docker=real_engine)
        assert not decision.allowed and "not verified" in decision.reason, decision.reason
    finally:
        free_the_cells_disk(ref, real_engine)
