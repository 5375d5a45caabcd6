"""The main job end to end on the CPU cell of the test matrix: plan, render, base, build,
smoke (static + model with a real vLLM), tag, report — through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]


def run_pipeline(state: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infermatrix", "pipeline", "--matrix",
         str(ROOT / "tests" / "matrix" / "matrix.yaml"), "--state-dir", str(state),
         "--select", "cpu-*", *extra],
        capture_output=True, text=True, timeout=3600, cwd=ROOT)


def test_main_job_takes_the_cpu_cell_to_a_tag_and_a_report(docker_available, tmp_path):
    state = tmp_path / "state"
    first = run_pipeline(state)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    record = json.loads((state / "journal" / f"{CPU_CELL}.json").read_text())
    stages = record["stages"]
    for stage in ("plan", "build", "smoke", "tag"):
        assert stages[stage]["status"] == "pass", (stage, stages[stage])
    levels = stages["smoke"]["details"]["levels"]
    assert levels["static"]["status"] == "pass" and levels["model"]["status"] == "pass"
    assert stages["tag"]["details"]["image_id"] == record["image_id"]
    html = (state / "reports" / "report.html").read_text()
    assert CPU_CELL in html and "tagged" in html
    # A rerun resumes: the build is reused, not redone.
    second = run_pipeline(state, "--levels", "static")
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert "unchanged, reused" in second.stdout + second.stderr
