"""rules.yaml flashinfer-jit-arch: FlashInfer 0.6.7 to 0.7.1 refuse to JIT-compile for SM 12.x
with nvcc < 12.9 unless FLASHINFER_CUDA_ARCH_LIST names a suffixed target (#45). The runtime
image sets the suffixed value for every cell whose engine pins flashinfer-python."""

from __future__ import annotations

import pytest

from infermatrix.model.cell import Cell
from infermatrix.model.index import ReleaseMetadata
from infermatrix.model.rules import (EngineFacts, flashinfer_arch_value, flashinfer_jit_arch)
from infermatrix.stages.plan import plan_matrix
from infermatrix.stages.render import flashinfer_arch

from tests.support.planning_support import (DATA, mini_context, recorded_metadata,
                                            recorded_releases)

MINI = (DATA / "mini_matrix.yaml").read_text()


def facts(flashinfer: str | None) -> EngineFacts:
    pins = (("flashinfer-python", flashinfer),) if flashinfer else ()
    return EngineFacts("https://pypi.org/simple/sglang/", ("torch==2.9.1",), "2.9.1", "12.8",
                       exact_pins=pins)


@pytest.mark.parametrize("cuda, arch", [("12.8", "sm_120"), ("12.9", "sm_120"),
                                        ("13.0", "sm_120"), ("12.9", "sm_121"),
                                        ("13.0", "sm_121")])
def test_runtime_value_is_what_the_kernel_stage_compiles_for(cuda, arch):
    cell = Cell(cuda, "2.9.1", "sglang", "0.5.10", arch)
    value = flashinfer_arch_value(cell)
    assert value == flashinfer_arch(cell)
    assert value[-1].isalpha()  # suffixed: FlashInfer uses it as-is


def _matrix(env_line: str = ""):
    text = MINI
    if env_line:
        text = text.replace("        env: {TRITON_PTXAS_PATH: /usr/local/cuda/bin/ptxas}",
                            "        env: {TRITON_PTXAS_PATH: /usr/local/cuda/bin/ptxas}\n"
                            "      sm_120:\n" + env_line)
    return text


@pytest.mark.parametrize("version, cuda, env, prunes", [
    ("0.6.7.post2", "12.8", "", False),        # the plan sets 12.0a itself
    ("0.6.7.post2", "12.8", "12.0", True),     # an unsuffixed override: normalised, refused
    ("0.6.7.post2", "12.9", "12.0", False),    # nvcc 12.9: normalised to 12.0f, accepted
    ("0.6.6", "12.8", "12.0", False),          # before the check
    ("0.7.2", "12.8", "12.0", False),          # 0.7.2 accepts SM 12.0 on 12.8 (120a)
])
def test_rule(tmp_path, version, cuda, env, prunes):
    line = f"        env: {{FLASHINFER_CUDA_ARCH_LIST: '{env}'}}\n" if env else ""
    m = mini_context(tmp_path, _matrix(line)).matrix
    cell = Cell(cuda, "2.9.1", "sglang", "0.5.10", "sm_120")
    verdicts = flashinfer_jit_arch(cell, m, facts(version))
    assert bool(verdicts) is prunes, verdicts
    if prunes:
        assert "SM 12.x requires CUDA >= 12.9" in verdicts[0].reason
        assert "compilation_context.py" in verdicts[0].source and "checked" in verdicts[0].source


def test_sm121_below_12_9_is_refused_even_by_0_7_2(tmp_path):
    text = MINI.replace("        env: {TRITON_PTXAS_PATH: /usr/local/cuda/bin/ptxas}",
                        "        env: {FLASHINFER_CUDA_ARCH_LIST: '12.1'}")
    m = mini_context(tmp_path, text).matrix
    cell = Cell("12.8", "2.9.1", "sglang", "0.5.10", "sm_121")
    assert flashinfer_jit_arch(cell, m, facts("0.7.2"))
    assert not flashinfer_jit_arch(cell, m, facts(None))  # no FlashInfer pinned: no rule


def test_planned_cell_image_env_carries_the_arch_list(tmp_path):
    def source(name, version, machine="x86_64"):
        meta = recorded_metadata(name, version, machine)
        if name == "sglang":
            return ReleaseMetadata(meta.name, meta.version, meta.wheel, meta.url,
                                   meta.requires_dist + ("flashinfer-python==0.6.7.post2",))
        return meta
    ctx = mini_context(tmp_path)
    plans = {p.id: p for p in plan_matrix(ctx, source=source, releases=recorded_releases,
                                          exists=lambda url: True)}
    env = plans["cu130-torch2.11.0-sglang0.5.11-sm121"].settings.env
    assert env["FLASHINFER_CUDA_ARCH_LIST"] == "12.1a"
    assert "FLASHINFER_CUDA_ARCH_LIST" not in plans["cu130-torch2.11.0-vllm0.20.1-sm121"].settings.env


def test_the_shipped_aot_scope_covers_the_cascade_module_sglangs_backend_calls():
    """SGLang's flashinfer backend calls flashinfer.cascade.merge_state on every extend with a
    cached prefix: the shipped model scope compiles it ahead of time."""
    import yaml

    from infermatrix.model.kernelscope import flashinfer_scope
    from tests.paths import TESTS

    model = yaml.safe_load((TESTS.parent / "matrix.yaml").read_text())["model"]
    scope = flashinfer_scope(model, "0.6.7.post2", "linux/amd64")
    assert {"attention", "sampling", "cascade"} <= set(scope["families"])
    assert scope["summary"].endswith("; sampling; cascade")
    aot = (TESTS.parent / "templates" / "files" / "flashinfer-aot.py.j2").read_text()
    assert 'if "cascade" in SCOPE["families"]:' in aot and "gen_cascade_module()" in aot
