"""`infermatrix export github-watch|gitlab-watch` (#45): a scheduled job that runs the release
watch and, when a bump is due, opens a change with the new locks and Dockerfiles. The job's
shell is run here with stand-ins for infermatrix, git and gh, one per watch outcome."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from infermatrix.scale import export


def stand_ins(tmp_path: Path, watch_rc: int, diff_rc: int = 1) -> tuple[Path, Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    scripts = {
        "infermatrix": f'echo "infermatrix $*" >> {log}\n'
                       f'if [ "$1" = watch ]; then echo "settled: vllm 0.34.0"; exit {watch_rc}; fi',
        "git": f'echo "git $*" >> {log}\nif [ "$1" = diff ]; then exit {diff_rc}; fi',
        "gh": f'echo "gh $*" >> {log}',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir, log


def run_job(tmp_path: Path, watch_rc: int, diff_rc: int = 1) -> tuple[int, list[str]]:
    bin_dir, log = stand_ins(tmp_path, watch_rc, diff_rc)
    workflow = export.github_watch_workflow("matrix.yaml", 7)
    script = workflow["jobs"]["watch"]["steps"][-1]["run"]
    done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    return done.returncode, log.read_text().splitlines() if log.exists() else []


def test_nothing_due_ends_green_without_a_bump(tmp_path):
    rc, calls = run_job(tmp_path, 0)
    assert rc == 0 and calls == ["infermatrix watch --matrix matrix.yaml --settle-days 7"]


def test_a_due_bump_locks_renders_commits_and_opens_a_pull_request(tmp_path):
    rc, calls = run_job(tmp_path, 1)
    assert rc == 0
    assert calls[1:3] == ["infermatrix lock --matrix matrix.yaml",
                          "infermatrix render --matrix matrix.yaml"]
    assert any(c.startswith("git switch -c infermatrix/bump-") for c in calls)
    assert "git add locks images" in calls
    assert any(c.startswith("gh pr create") for c in calls)
    assert (tmp_path / "watch.txt").read_text() == "settled: vllm 0.34.0\n"


def test_a_watch_error_fails_the_job_and_no_change_opens_nothing(tmp_path):
    (tmp_path / "a").mkdir()
    rc, calls = run_job(tmp_path / "a", 2)
    assert rc == 2 and len(calls) == 1
    (tmp_path / "b").mkdir()
    rc, calls = run_job(tmp_path / "b", 1, diff_rc=0)
    assert rc == 0 and not any(c.startswith(("git switch", "gh ")) for c in calls)


def test_the_workflow_is_scheduled_and_may_write():
    workflow = export.github_watch_workflow("matrix.yaml", 3)
    assert workflow["on"]["schedule"] == [{"cron": export.WATCH_CRON}]
    assert workflow["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert "--settle-days 3 " in workflow["jobs"]["watch"]["steps"][-1]["run"]
    gitlab = export.gitlab_watch_pipeline("matrix.yaml", 7)["infermatrix-watch"]
    assert gitlab["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "schedule"'}]
    assert "-o merge_request.create" in gitlab["script"][-1]


@pytest.mark.parametrize("target", ["github-watch", "gitlab-watch"])
def test_the_command_writes_the_file(tmp_path, target, monkeypatch):
    from infermatrix.cli import main
    from tests.support.planning_support import DATA

    (tmp_path / "matrix.yaml").write_text((DATA / "mini_matrix.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["export", target, "--settle-days", "5"]) == 0
    written = (tmp_path / export_path(target)).read_text()
    assert "--settle-days 5 " in written and "infermatrix watch" in written


def export_path(target: str) -> str:
    from infermatrix.cli.export import DEFAULT_OUT
    return DEFAULT_OUT[target]
