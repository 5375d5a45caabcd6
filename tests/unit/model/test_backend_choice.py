"""The full-attention backend of a cell: the engine's own default on the arch (rules.yaml
engine_default, read from its released code) unless matrix.yaml overrides it with a reason;
`plan` shows which and why (#45)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from infermatrix.model import rules
from infermatrix.model.cell import Cell
from infermatrix.model.rules import backend_choice, backend_runs_on

MODEL = "Qwen/Qwen3.6-27B"


def matrix(engine: str = "sglang", flag: str | None = "--attention-backend", **engine_data):
    data = {"attention_flag": flag} if flag else {}
    data.update(engine_data)
    return SimpleNamespace(model={"name": MODEL}, engines={engine: data})


@pytest.mark.parametrize("version, arch, where", [
    ("0.5.10", "sm_120", "server_args.py"), ("0.5.10", "sm_121", "server_args.py"),
    ("0.5.23", "sm_120", "model_override_base.py"), ("0.5.23", "sm_121", "model_override_base.py")])
def test_sglang_serves_with_its_own_default_flashinfer(version, arch, where):
    choice = backend_choice(Cell("13.0", "2.14.1", "sglang", version, arch), matrix())
    assert choice.backend == "flashinfer" and not choice.verdicts
    assert choice.why.startswith("sglang's own default on " + arch)
    assert where in choice.source and "checked 2026-12-06" in choice.source


def test_a_version_whose_default_is_not_recorded_passes_no_flag():
    choice = backend_choice(Cell("13.0", "2.13.0", "sglang", "0.5.15", "sm_120"), matrix())
    assert choice.backend is None and not choice.verdicts
    assert "not recorded" in choice.why


def test_an_override_needs_no_default_and_shows_its_reason():
    m = matrix(attention_backends=["triton", "flashinfer"],
               attention_backends_reason="measured faster on this card")
    choice = backend_choice(Cell("13.0", "2.14.1", "sglang", "0.5.23", "sm_120"), m)
    assert choice.backend == "triton"
    assert choice.why.endswith("measured faster on this card")
    bare = backend_choice(Cell("13.0", "2.14.1", "sglang", "0.5.23", "sm_120"),
                          matrix(attention_backends=["triton"]))
    assert bare.why.endswith("no reason given")


def test_a_flagless_engine_records_its_default_but_passes_nothing():
    for version in ("0.19.0", "0.33.0"):
        choice = backend_choice(Cell("13.0", "2.14.0", "vllm", version, "sm_120"),
                                matrix("vllm", flag=None))
        assert choice.backend is None and not choice.verdicts
        assert "FLASH_ATTN" in choice.why and "_get_backend_priorities" in choice.source


def test_trtllm_mha_runs_on_sm120_from_sglang_0_5_23_and_fa4_never_on_12x():
    assert backend_runs_on("trtllm_mha", "sm_120", Cell("13.0", "2.14.1", "sglang", "0.5.23",
                                                         "sm_120"))
    assert not backend_runs_on("trtllm_mha", "sm_120", Cell("12.8", "2.9.1", "sglang", "0.5.10",
                                                             "sm_120"))
    assert not backend_runs_on("trtllm_mha", "sm_120")
    for arch in ("sm_90", "sm_100", "sm_110"):
        assert backend_runs_on("fa4", arch)
    assert not backend_runs_on("fa4", "sm_120") and not backend_runs_on("fa4", "sm_121")


def test_a_default_the_engines_own_hybrid_gate_refuses_prunes(monkeypatch):
    data = copy.deepcopy(rules.load_rules())
    data["attention-backend-arch"]["engine_default"]["sglang"][1]["backend"] = "fa4"
    monkeypatch.setattr(rules, "load_rules", lambda *a: data)
    choice = backend_choice(Cell("13.0", "2.14.1", "sglang", "0.5.23", "sm_120"), matrix())
    assert choice.backend is None
    assert "accepts only triton, trtllm_mha, flashinfer" in choice.verdicts[0].reason
