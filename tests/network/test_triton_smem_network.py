"""The Triton shared-memory check for real (harness/triton_smem.py, with triton from PyPI): a
kernel tuned too large fails on sm_120 and passes on sm_90, an engine not installed is said
so, autotune and import-time limit queries see the target (the rest:
tests/unit/stages/test_triton_smem.py). It needs triton only (no torch): a venv with
triton==3.8.0 is made once from PyPI under ~/.cache/infermatrix-tests and reused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from infermatrix.harness import _result
from infermatrix.stages import audit
from infermatrix.stages.audit import FAIL, PASS, SKIP
from tests.paths import TESTS

TESTS = TESTS


FIXTURE = TESTS / "fixtures" / "tritonkern" / "kernel.py"


HARNESS_PARENT = TESTS.parent / "src" / "infermatrix"


TRITON = "triton==3.8.0"


@pytest.fixture(scope="module")
def triton_python() -> str:
    from infermatrix.stages.lock import uv_bin

    venv = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
        "infermatrix-tests" / f"venv-{TRITON.replace('==', '-')}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        env = dict(os.environ, UV_SYSTEM_CERTS="1", UV_PYTHON_DOWNLOADS="never")
        subprocess.run([uv_bin(), "venv", "-q", "--clear", str(venv)], check=True, env=env)
        subprocess.run([uv_bin(), "pip", "install", "-q", "--python", str(python), TRITON],
                       check=True, env=env, timeout=900)
        (venv / ".complete").write_text(TRITON)
    return str(python)


def run_harness(python: str, tmp_path: Path, *args: str) -> dict:
    # the harness runs as `harness.triton_smem` with only the harness package on the path,
    # as in an image (/opt/infermatrix/harness)
    root = tmp_path / "opt"
    root.mkdir(exist_ok=True)
    link = root / "harness"
    if not link.exists():
        link.symlink_to(HARNESS_PARENT / "harness")
    done = subprocess.run([python, "-m", "harness.triton_smem", *args], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path, check=False,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(root),
                               "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")})
    parsed = _result.parse(done.stdout)
    assert parsed is not None, done.stdout[-2000:] + done.stderr[-2000:]
    return parsed


AUTOTUNED = TESTS / "fixtures" / "tritonkern" / "autotuned.py"


@pytest.mark.network
@pytest.mark.slow
def test_a_kernel_tuned_too_large_fails_on_sm120_and_passes_on_sm90(triton_python, tmp_path):
    limits, _ = audit.shared_memory_limits()
    result = run_harness(triton_python, tmp_path, "--fixture", str(FIXTURE),
                         "--arch", f"sm_120={limits['sm_120']}",
                         "--arch", f"sm_90={limits['sm_90']}")
    assert result["status"] == "fail"
    by_arch = {a["arch"]: a for a in result["archs"]}
    [sm120] = by_arch["sm_120"]["families"][0]["kernels"]
    [sm90] = by_arch["sm_90"]["families"][0]["kernels"]
    assert sm120["kernel"] == "tuned_for_hopper_matmul" and sm120["num_stages"] == 5
    assert sm120["shared"] > 101376 and not sm120["fits"]
    assert 101376 < sm90["shared"] <= 232448 and sm90["fits"]
    assert by_arch["sm_120"]["status"] == "fail" and by_arch["sm_90"]["status"] == "pass"
    reason = by_arch["sm_120"]["reason"]
    assert f"needs {sm120['shared']} bytes" in reason and "the limit is 101376" in reason
    check = audit.judge_triton(result, "triton")
    assert check.status == FAIL and "tuned_for_hopper_matmul" in check.detail
    # compiled for a twin's foreign arch too (model/tritontwin.py), the result is judged per
    # cell: the sm_90 cell passes on its own arch, the foreign cell adopting sm_120 fails
    from infermatrix.model.tritontwin import restrict_to_archs
    assert audit.judge_triton(restrict_to_archs(result, ["sm_90"]), "triton").status == PASS
    assert audit.judge_triton(restrict_to_archs(result, ["sm_120"]), "triton").status == FAIL
    only90 = run_harness(triton_python, tmp_path, "--fixture", str(FIXTURE),
                         "--arch", f"sm_90={limits['sm_90']}")
    assert only90["status"] == "pass" and audit.judge_triton(only90, "triton").status == PASS


@pytest.mark.network
@pytest.mark.slow
def test_an_engine_that_is_not_installed_is_reported_as_not_driven(triton_python, tmp_path):
    result = run_harness(triton_python, tmp_path, "--engine", "sglang", "--arch", "sm_120=101376")
    families = result["archs"][0]["families"]
    assert result["status"] == "skip" and families and not any(f["driven"] for f in families)
    assert "not driven" in result["reason"]
    # the cell's backend is triton: unverified kernels fail the check; another backend: skip
    assert audit.judge_triton(result, "triton").status == FAIL
    assert audit.judge_triton(result, "flashinfer").status == SKIP


@pytest.mark.network
@pytest.mark.slow
def test_autotune_is_honoured_and_an_import_time_limit_query_sees_the_target(triton_python,
                                                                              tmp_path):
    """As the runtime's autotuner: a kernel fails only when every config overflows; one with
    some configs over passes with the note; a tile list chosen at import from the device's
    shared memory gets the target's limit (sm_90's 232,448 B gives 128-wide tiles, sm_120's
    101,376 B gives 64), never this host's."""
    limits, _ = audit.shared_memory_limits()
    result = run_harness(triton_python, tmp_path, "--fixture", str(AUTOTUNED),
                         "--arch", f"sm_120={limits['sm_120']}",
                         "--arch", f"sm_90={limits['sm_90']}")
    by_arch = {a["arch"]: a for a in result["archs"]}
    rows = {arch: {r["kernel"]: r for f in a["families"] for r in f["summary"]}
            for arch, a in by_arch.items()}
    some, every = rows["sm_120"]["some_configs_too_big"], rows["sm_120"]["every_config_too_big"]
    assert some["configs"] == 3 and some["autotuned"] and some["over"] == 1 and some["fits"]
    assert some["min_shared"] <= 101376 < some["max_shared"]
    assert "1 of 3 autotune configs cannot run" in some["note"]
    assert every["configs"] == 2 and every["over"] == 2 and not every["fits"]
    assert by_arch["sm_120"]["status"] == "fail"
    assert "every_config_too_big" in by_arch["sm_120"]["reason"]
    assert "some_configs_too_big" not in by_arch["sm_120"]["reason"]
    assert any("some_configs_too_big" in n for n in by_arch["sm_120"]["notes"])
    # the import-time query: 64-wide tiles for sm_120's limit, 128-wide for sm_90's
    kernels = {arch: [k for f in a["families"] for k in f["kernels"]
                      if k["kernel"] == "tiles_from_the_device"] for arch, a in by_arch.items()}
    assert [k["constexprs"]["BLOCK"] for k in kernels["sm_120"]] == [64]
    assert [k["constexprs"]["BLOCK"] for k in kernels["sm_90"]] == [128]
    assert by_arch["sm_90"]["status"] == "pass"  # 232,448 B: every config of all three fits
    check = audit.judge_triton(result, "triton")
    assert check.status == FAIL and "every_config_too_big" in check.detail
    row = next(r for r in check.data["summary"] if r["kernel"] == "some_configs_too_big"
               and r["arch"] == "sm_120")
    assert row["over"] == 1 and row["configs"] == 3
