"""Harness pieces that run without a GPU or an image: arch matching, import-name discovery."""

from __future__ import annotations

from tests.paths import REPO

import importlib.metadata as md

import pytest

from infermatrix.harness import gpu_check, static_check


@pytest.mark.parametrize("arch, capability, expected", [
    ("sm_90", (9, 0), True),
    ("sm_120", (12, 0), True),
    ("sm_120", (12, 1), False),   # an exact target names one capability
    ("sm_120a", (12, 1), False),  # sm_120a cubins do not run on GB10
    ("sm_121a", (12, 1), True),
    ("sm_120f", (12, 1), True),   # family: same major, minor >= 0
    ("sm_121f", (12, 0), False),
    ("sm_120", (9, 0), False),
])
def test_arch_matches_capability(arch, capability, expected):
    assert gpu_check.arch_matches(arch, capability) is expected


def test_unknown_kernel_package_fails_the_gpu_level():
    result = gpu_check.check_kernel_package("some-new-kernels")
    assert result["status"] == "fail"
    assert "KERNEL_CHECKS" in result["reason"]


def test_import_names_come_from_distribution_metadata():
    assert "yaml" in static_check.import_names(md.distribution("PyYAML"))
    assert "jsonschema" in static_check.import_names(md.distribution("jsonschema"))


def test_static_check_reports_missing_and_mispinned_distributions():
    assert static_check.check_distribution("no-such-dist-xyz")["status"] == "fail"
    pinned = static_check.check_distribution("PyYAML==0.0.1")
    assert pinned["status"] == "fail" and "pins 0.0.1" in pinned["reason"]
    ok = static_check.check_distribution(f"PyYAML=={md.version('PyYAML')}")
    assert ok["status"] == "pass" and ok["imports"][0]["module"] == "yaml"


# ---- the GPU level's decision parts (no GPU, no torch needed) --------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402

from infermatrix.stages import render, smoke  # noqa: E402
from infermatrix.context import Context  # noqa: E402
from infermatrix.harness import _result  # noqa: E402
from infermatrix.stages.plan import plan_matrix  # noqa: E402
from tests.conftest import TEST_MATRIX  # noqa: E402
from tests.support.planning_support import recorded_metadata  # noqa: E402

SM90_CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm90"
NO_GPU_REASONS = ("torch is not installed", "is a CPU build", "no GPU visible")


def test_gpu_check_program_on_a_host_without_a_gpu_skips_with_the_reason(tmp_path):
    """The real program, laid out as smoke mounts it (/opt/infermatrix/harness on PYTHONPATH),
    run by the host's Python."""
    (tmp_path / "harness").symlink_to(smoke.HARNESS_ON_HOST)
    done = subprocess.run([sys.executable, "-m", "harness.gpu_check", "--arch", "sm_90",
                           "--kernels", "cudakern"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    result = _result.parse(done.stdout)
    assert result["check"] == "gpu" and result["status"] == "skip" and result["checks"] == []
    assert any(reason in result["reason"] for reason in NO_GPU_REASONS), result["reason"]
    status, reason, details = smoke.harness_level("gpu", done.returncode, result, done.stdout, 30)
    assert (status, details) == ("skip", {"arch": "sm_90", "checks": []})


def test_run_checks_order_and_how_a_failing_kernel_fails_the_level(monkeypatch):
    """Wiring only, with stand-in checks (a recording fake: the real ones need a GPU; they ran
    on the H200, docs/testing.md): device, torch, triton, then each kernel package in order;
    a check that raises is a fail with its exception and traceback, and fails the level."""
    ran: list[str] = []

    def stand_in(name, result):
        def check(*_args):
            ran.append(name)
            return result
        return check

    def crashing():
        ran.append("cudakern")
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")

    monkeypatch.setattr(gpu_check, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(gpu_check, "check_device", stand_in("device", {"status": "pass"}))
    monkeypatch.setattr(gpu_check, "check_torch_matmul", stand_in("torch", {"status": "pass"}))
    monkeypatch.setattr(gpu_check, "check_triton", stand_in("triton", {"status": "skip",
                                                                       "reason": "no triton"}))
    monkeypatch.setitem(gpu_check.KERNEL_CHECKS, "cudakern", crashing)
    result = gpu_check.run_checks("sm_90", ["cudakern", "unknown-kernels"], gdn="off")
    assert ran == ["device", "torch", "triton", "cudakern"]
    assert [c["check"] for c in result["checks"]] == ["device", "torch", "triton", "cudakern",
                                                     "unknown-kernels"]
    assert result["status"] == "fail"
    crashed = result["checks"][3]
    assert crashed["status"] == "fail" and crashed["reason"].startswith("RuntimeError: CUDA error")
    assert "raise RuntimeError" in crashed["traceback_tail"]
    assert result["reason"].startswith("cudakern: RuntimeError") and "unknown-kernels: " in \
        result["reason"]


def test_every_compiled_kernel_package_of_the_matrices_has_a_numeric_check():
    for matrix in (REPO / "matrix.yaml", TEST_MATRIX):
        kernels = Context.load(matrix).matrix.build.get("kernels", {})
        missing = {e["package"] for e in kernels.values()} - set(gpu_check.KERNEL_CHECKS)
        assert not missing, f"{matrix}: kernel packages without a gpu_check check: {missing}"


class RecordingHarness:
    """A recording fake of smoke.Harness: the argv the gpu level would run in the image."""

    image_id = "sha256:" + "e" * 64
    emulated = None  # the image runs natively

    def __init__(self):
        self.calls = []

    def run(self, program, args, timeout_s, **kwargs):
        self.calls.append((program, args, kwargs))
        return 0, {"check": "gpu", "status": "pass", "arch": args[1], "checks": []}, ""


def test_the_sm90_fixture_cell_runs_the_gpu_level_with_its_arch_and_kernels(tmp_path):
    ctx = Context.load(TEST_MATRIX, tmp_path / "state")
    (plan,) = plan_matrix(ctx, select=[SM90_CELL], source=recorded_metadata)
    assert plan.planned and plan.settings.platform == "linux/amd64"
    harness = RecordingHarness()
    assert smoke.run_gpu(ctx, ctx.spec(plan), harness, 30, gpu_here=False).reason == smoke.NO_GPU
    assert harness.calls == []
    result = smoke.run_gpu(ctx, ctx.spec(plan), harness, 30, gpu_here=True)
    assert result.status == "pass"
    # the fixture cell's engine is no vllm/sglang: `--engine none` (an engine image would be
    # named, and then a missing triton or GDN op fails the level)
    assert harness.calls == [("gpu_check", ["--arch", "sm_90", "--engine", "none", "--kernels",
                                            "cudakern"], {"gpu": True})]
    dockerfile = render.render_cell(ctx, ctx.spec(plan)).files["Dockerfile"][0].decode()
    assert 'TORCH_CUDA_ARCH_LIST="9.0"' in dockerfile  # the fixture compiles for Hopper


def _shared_object(tmp_path, name: str, constructor_body: str):
    """A real .so (gcc) whose static initializer runs `constructor_body`."""
    import subprocess

    source = tmp_path / f"{name}.c"
    source.write_text("__attribute__((constructor)) static void init(void) { "
                      f"{constructor_body} }}\n")
    library = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


def test_an_extension_for_an_isa_this_cpu_lacks_is_noted_not_failed(tmp_path) -> None:
    """vLLM's CPU _C (AVX512+BF16) dies of SIGILL at load on an AVX2-only CPU, where vLLM
    loads _C_AVX2: the static level notes it; a library that crashes otherwise still fails."""
    ill = static_check.check_extension(_shared_object(tmp_path, "isa", "__builtin_trap();"))
    assert ill["status"] == "pass" and "SIGILL" in ill["note"]
    crash = static_check.check_extension(
        _shared_object(tmp_path, "segv", "*(volatile int *)0 = 1;"))
    assert crash["status"] == "fail"
    assert static_check.check_extension(_shared_object(tmp_path, "fine", ""))["status"] == "pass"
