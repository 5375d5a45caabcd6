"""What the torch variant table may prune, and what it must leave to the index (#45): only a
variant recorded absent (with its source) prunes; one the table does not know is asked of the
index, whose answers are cached, and is "unverified" when the index cannot be reached."""

from __future__ import annotations

import json

from infermatrix.model.cell import Cell
from infermatrix.model.rules import torch_variant_known
from infermatrix.stages.plan import VariantAnswers, plan_matrix

from tests.support.planning_support import (DATA, mini_context, recorded_metadata,
                                            recorded_releases)
from infermatrix.model.index import ReleaseMetadata

MINI = (DATA / "mini_matrix.yaml").read_text()
CU128 = ('nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux" and '
         'platform_machine == "x86_64"',)


def source_with(extra: dict[tuple[str, str], tuple[str, ...]]):
    def source(name: str, version: str, machine: str = "x86_64") -> ReleaseMetadata:
        if (name, version) in extra:
            return ReleaseMetadata(name, version, f"{name}-{version}.whl",
                                   f"https://pypi.org/simple/{name}/", extra[(name, version)])
        return recorded_metadata(name, version, machine)
    return source


def plan(tmp_path, text, exists=None, source=recorded_metadata, select=()):
    ctx = mini_context(tmp_path, text)
    return {p.id: p for p in plan_matrix(ctx, source=source, releases=recorded_releases,
                                         exists=exists, select=list(select))}


def test_cu129_of_torch_2_9_to_2_11_is_listed_and_2_12_on_is_recorded_absent():
    assert torch_variant_known(Cell("12.9", "2.9.1", "sglang", "0.5.10", "sm_120")) is True
    assert torch_variant_known(Cell("12.9", "2.10.0", "vllm", "0.19.0", "sm_120")) is True
    assert torch_variant_known(Cell("12.9", "2.11.0", "vllm", "0.20.1", "sm_120")) is True
    assert torch_variant_known(Cell("12.9", "2.14.0", "vllm", "0.33.0", "sm_120")) is False
    # a minor the table does not have: the table cannot say
    assert torch_variant_known(Cell("12.9", "2.7.1", "vllm", "0.19.0", "sm_120")) is None


def test_a_listed_variant_is_planned_on_the_index_answer(tmp_path):
    text = MINI.replace("cuda: [\"12.8\", \"12.9\", \"13.0\"]", "cuda: [\"12.9\"]")
    found = plan(tmp_path, text, exists=lambda url: True)
    cell = "cu129-torch2.11.0-vllm0.20.1-sm120"
    assert found[cell].status == "planned", found[cell].verdicts
    assert found[cell].settings.torch_index.endswith("/cu129")
    down = plan(tmp_path, text, exists=lambda url: None)[cell]
    assert down.status == "unverified"
    assert "rules.yaml lists it" in down.verdicts[0].reason


def test_a_recorded_absent_variant_prunes_with_its_source_and_date(tmp_path):
    text = MINI.replace('torch: ["2.9.1", "2.11.0"]', 'torch: ["2.14.0"]').replace(
        "engine: [sglang==0.5.9, sglang==0.5.11, vllm==0.20.1]", "engine: [sglang==0.5.11]")
    extra = {("sglang", "0.5.11"): ("torch>=2.11",)}
    plans = plan(tmp_path, text, exists=lambda url: True, source=source_with(extra))
    pruned = plans["cu129-torch2.14.0-sglang0.5.11-sm120"]
    verdict = next(v for v in pruned.verdicts if v.rule == "torch-cuda-variant")
    assert "no cu129 wheel" in verdict.reason
    assert "checked 2026-12-06" in verdict.source and "2.12" in verdict.source


def test_a_variant_the_table_does_not_know_is_asked_of_the_index_never_pruned(tmp_path):
    text = MINI.replace('torch: ["2.9.1", "2.11.0"]', 'torch: ["2.7.1"]').replace(
        "engine: [sglang==0.5.9, sglang==0.5.11, vllm==0.20.1]", "engine: [sglang==0.5.11]")
    extra = {("torch", "2.7.1"): CU128, ("sglang", "0.5.11"): ("torch>=2.7",)}
    src = source_with(extra)
    cell = "cu129-torch2.7.1-sglang0.5.11-sm120"
    unknown = plan(tmp_path, text, exists=lambda url: None, source=src)[cell]
    assert unknown.status == "unverified", unknown.verdicts
    assert "not in the rules.yaml variant table" in unknown.verdicts[0].reason
    missing = plan(tmp_path, text, exists=lambda url: False, source=src)[cell]
    assert missing.status == "pruned"
    assert [v.rule for v in missing.verdicts] == ["variant-missing"]
    assert missing.verdicts[0].source == "https://download.pytorch.org/whl/cu129/torch/"


def test_pypi_build_range_installs_the_engine_from_pypi(tmp_path):
    """vLLM < 0.20's PyPI wheel is the CUDA 12.9 build: a 12.9 cell takes only torch from the
    torch index; 0.20.1 (outside the range) still takes the declared release asset."""
    text = MINI.replace(
        '"12.9": {source: https://docs.vllm.ai/, wheel: "https://example.invalid/vllm-{version}+cu129.whl"}',
        '"12.9": {source: https://docs.vllm.ai/, wheel: "https://example.invalid/vllm-{version}+cu129.whl",'
        ' pypi_build: {versions: "<0.20", source: vllm#34867}}').replace(
        "vllm==0.20.1]", "vllm==0.20.1, vllm==0.19.1]").replace('"2.11.0"]', '"2.11.0", "2.10.0"]')
    plans = plan(tmp_path, text, exists=lambda url: True, select=["cu129-*vllm*-sm120"])
    old = plans["cu129-torch2.10.0-vllm0.19.1-sm120"]
    assert old.status == "planned", old.verdicts
    assert old.settings.engine_index is None and old.settings.torch_index.endswith("/cu129")
    assert old.settings.source_urls["engine_variant"] == "vllm#34867"
    new = plans["cu129-torch2.11.0-vllm0.20.1-sm120"]
    assert new.settings.engine_index == "https://example.invalid/vllm-0.20.1+cu129.whl"


def test_variant_answers_are_cached_and_answer_offline(tmp_path, monkeypatch):
    from infermatrix.stages import plan as planmod
    calls: list[str] = []
    monkeypatch.setattr(planmod, "index_lists", lambda url, prefix: calls.append(url) or True)
    path = tmp_path / "answers.json"
    assert VariantAnswers(path)("https://idx/torch/", "torch-2.10.0+cu129-") is True
    assert json.loads(path.read_text())["https://idx/torch/ torch-2.10.0+cu129-"]["found"] is True
    offline = VariantAnswers(path, offline=True)
    assert offline("https://idx/torch/", "torch-2.10.0+cu129-") is True
    assert offline("https://idx/torch/", "torch-2.9.1+cu129-") is None  # never asked: unknown
    assert calls == ["https://idx/torch/"]
    # online but unreachable: the cached answer stands; with none, unknown
    monkeypatch.setattr(planmod, "index_lists", lambda url, prefix: None)
    assert VariantAnswers(path)("https://idx/torch/", "torch-2.10.0+cu129-") is True
    assert VariantAnswers(path)("https://idx/torch/", "torch-2.8.0+cu129-") is None
