"""The planner against the real package index: engine torch pins come from real metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermatrix.context import Context
from infermatrix.index import MetadataCache
from infermatrix.plan import plan_matrix

from .planning_support import RECORDED

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def live_cache(tmp_path_factory) -> MetadataCache:
    return MetadataCache(tmp_path_factory.mktemp("index"))


@pytest.mark.parametrize("name, version", sorted(RECORDED))
def test_recorded_answers_match_the_live_index(live_cache, name, version):
    live = live_cache.release(name, version)
    wanted = "torch" if name != "torch" else None
    if wanted:
        assert [str(r) for r in live.pins_for("torch")][0].split(";")[0].replace(" ", "") == \
            RECORDED[(name, version)][0].split(";")[0].replace(" ", "")
    else:
        runtime = [r for r in live.requires_dist if "cuda-runtime" in r or "cudart" in r]
        assert runtime and runtime[0].split("==")[1][:4] == RECORDED[(name, version)][0].split("==")[1][:4]


def test_shipped_matrix_plan_uses_real_pins(tmp_path, live_cache):
    ctx = Context.load(ROOT / "matrix.yaml", tmp_path / "state")
    plans = {p.id: p for p in plan_matrix(ctx, source=live_cache.release)}
    planned = {i for i, p in plans.items() if p.planned}
    assert "cu130-torch2.11.0-sglang0.5.11-sm121" in planned
    assert "cu128-torch2.10.0-vllm0.19.1-sm120" in planned
    assert "cpu-torch2.13.0-vllm-cpu0.32.0-cpu" in planned
    pin = plans["cu130-torch2.10.0-sglang0.5.11-sm120"]
    assert [v.rule for v in pin.verdicts] == ["engine-torch-pin"]
    assert "torch==2.11.0" in pin.verdicts[0].reason and "sglang" in pin.verdicts[0].source


def test_offline_mode_answers_from_the_cache(tmp_path):
    state = tmp_path / "state"
    online = Context.load(ROOT / "matrix.yaml", state)
    first = [p.as_dict() for p in plan_matrix(online, select=["*vllm0.19.1*"])]
    offline = Context.load(ROOT / "matrix.yaml", state, offline=True)
    assert [p.as_dict() for p in plan_matrix(offline, select=["*vllm0.19.1*"])] == first
    cold = Context.load(ROOT / "matrix.yaml", tmp_path / "cold", offline=True)
    statuses = {p.status for p in plan_matrix(cold, select=["*vllm0.19.1*-sm120"])}
    assert "unresolved" in statuses and "planned" not in statuses
