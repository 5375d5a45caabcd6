"""The run-level rules of tests/lanes.py (issue 48): every collected test ran, the floor, the
time guard, the JUnit reading. The JUnit XML and the collection output are pytest's own (a real
pytest on generated test files); the time guard interrupts a real child process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import lanes

SAMPLE = """
import pytest

@pytest.fixture
def breaks_at_teardown():
    yield
    raise RuntimeError("teardown broke")

def test_passes():
    pass

def test_fails():
    assert False

def test_skips():
    pytest.skip("not here")

def test_teardown_error(breaks_at_teardown):
    pass

def test_fails_then_teardown_error(breaks_at_teardown):  # two <testcase> entries in the XML
    assert False

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    pass

class TestGroup:
    def test_in_class(self):
        pass

@pytest.mark.docker
def test_needs_docker():
    pass
"""
SAMPLE_TESTS = 9  # passes, fails, skips, 2 teardown errors, param[1], param[2], in_class, docker


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "CI"}


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    docker: needs docker\n")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    return tmp_path


def _pytest(sample: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-c", str(sample / "pytest.ini"), "--rootdir", str(sample),
                           *args, str(sample)],
                          capture_output=True, text=True, cwd=sample, env=_env(), timeout=300)


def test_read_junit_counts_pytests_own_xml_and_a_teardown_error_once(sample: Path) -> None:
    junit = sample / "junit.xml"
    _pytest(sample, f"--junitxml={junit}")
    counts = lanes.read_junit(junit)
    assert counts.tests == SAMPLE_TESTS == len(counts.node_ids)
    assert (counts.failed, counts.errors, counts.skipped) == (2, 1, 1)
    assert any(node.endswith("TestGroup::test_in_class") for node in counts.node_ids)
    assert sum(node.endswith("::test_fails_then_teardown_error") for node in counts.node_ids) == 1
    assert len(counts.durations) == SAMPLE_TESTS


def test_read_junit_of_a_lane_that_never_wrote_one_counts_nothing(tmp_path: Path) -> None:
    counts = lanes.read_junit(tmp_path / "absent.xml")
    assert (counts.tests, counts.node_ids) == (0, set())


def test_collected_count_reads_pytests_collect_only_output(sample: Path) -> None:
    log = sample / "collect.log"
    found = _pytest(sample, "--collect-only", "-q")
    log.write_text(found.stdout + found.stderr)
    assert lanes.collected_count(log) == SAMPLE_TESTS
    assert lanes.collected_count(sample / "absent.log") is None
    log.write_text("ERROR collecting test_x.py\n")
    assert lanes.collected_count(log) is None


def _phase(name: str, returncode: int | None = 0) -> lanes.Phase:
    phase = lanes.Phase(name, ["true"])
    phase.returncode = returncode
    return phase


def _counts(*nodes: str) -> lanes.LaneCounts:
    return lanes.LaneCounts(tests=len(nodes), node_ids=set(nodes))


def test_a_clean_run_has_no_problem() -> None:
    counts = {"unit": _counts("a::1", "a::2"), "docker": _counts("b::1")}
    assert lanes.run_problems([_phase("collect"), _phase("unit"), _phase("docker")], counts,
                              collected=3, guard_fired=False, floor=3) == []


def test_lanes_that_leave_a_collected_test_out_fail_the_run() -> None:
    counts = {"unit": _counts("a::1", "a::2"), "docker": _counts("a::2")}  # one ran twice
    problems = lanes.run_problems([_phase("unit")], counts, collected=3, guard_fired=False,
                                  floor=1)
    assert problems == ["the lanes ran 2 distinct tests of 3 collected: a lane's marker "
                        "expression leaves some out"]


def test_fewer_than_the_floor_fails_even_when_every_collected_test_ran() -> None:
    counts = {"unit": _counts("a::1", "a::2")}
    problems = lanes.run_problems([_phase("unit")], counts, collected=2, guard_fired=False,
                                  floor=3)
    assert problems == ["2 tests ran, fewer than the floor 3"]


def test_an_unreadable_collection_count_fails_the_run() -> None:
    problems = lanes.run_problems([_phase("unit")], {"unit": _counts("a::1")}, collected=None,
                                  guard_fired=False, floor=1)
    assert problems == ["the collection count could not be read"]


def test_a_failed_or_never_started_phase_fails_the_run() -> None:
    phases = [_phase("collect"), _phase("bases-test", 1), _phase("docker", None)]
    problems = lanes.run_problems(phases, {"unit": _counts("a::1")}, collected=1,
                                  guard_fired=False, floor=1)
    assert problems == ["bases-test: exit 1", "docker: exit None"]


def test_the_time_guard_having_fired_fails_the_run() -> None:
    problems = lanes.run_problems([_phase("unit")], {"unit": _counts("a::1")}, collected=1,
                                  guard_fired=True, floor=1)
    assert problems == ["the time guard interrupted the lanes"]


def test_a_lane_whose_marker_leaves_a_test_out_fails_the_whole_run(sample, monkeypatch,
                                                                   capsys) -> None:
    """End to end on real pytest processes: the collect phase finds 9 tests, the one lane
    (`-m "not docker"`) runs 8; report() says so and returns 1."""
    monkeypatch.setattr(lanes, "ROOT", sample)
    monkeypatch.setattr(lanes.ci_rules, "MIN_COLLECTED", 1)
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c",
            str(sample / "pytest.ini"), "--rootdir", str(sample)]
    collect = lanes.Phase("collect", [*base, "--collect-only", "-q", str(sample)],
                          log=sample / "collect.log")
    unit = lanes.Phase("unit", [*base, "-m", "not docker", f"--junitxml={sample / 'u.xml'}",
                                str(sample)], junit=sample / "u.xml", log=sample / "u.log")
    monkeypatch.delenv("CI", raising=False)
    runner = lanes.Runner([collect, unit], time.monotonic(), budget_s=3600)
    runner.run()
    assert collect.returncode == 0 and unit.returncode == 1  # test_fails / teardown error
    assert lanes.report(runner) == 1
    out = capsys.readouterr().out
    assert "the lanes ran 8 distinct tests of 9 collected" in out
    assert "== CI FAILED" in out


GUARDED = """
import signal, sys, time
from pathlib import Path
def on_int(*_):
    Path(sys.argv[1]).write_text("SIGINT")
    sys.exit(2)
signal.signal(signal.SIGINT, on_int)
Path(sys.argv[2]).write_text("ready")
time.sleep(120)
sys.exit(0)
"""


def test_the_time_guard_interrupts_a_running_lane_with_sigint(tmp_path, monkeypatch,
                                                              capsys) -> None:
    """A runner whose budget ends a second after its start (less the guard's margin): the lane
    gets SIGINT (it writes its report and exits), the run is marked interrupted and fails."""
    marker, ready = tmp_path / "got", tmp_path / "ready"
    script = tmp_path / "lane.py"
    script.write_text(GUARDED)
    lane = lanes.Phase("unit", [sys.executable, str(script), str(marker), str(ready)])
    start = time.monotonic()
    runner = lanes.Runner([lane], start, budget_s=lanes.GUARD_MARGIN_S + 1)
    # the guard may only fire once the lane has installed its handler
    real_fire = runner.fire_guard

    def fire_when_ready(running):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        real_fire(running)

    monkeypatch.setattr(runner, "fire_guard", fire_when_ready)
    runner.run()
    assert runner.guard_fired
    assert marker.read_text() == "SIGINT" and lane.returncode == 2
    assert "the time guard interrupted the lanes" in lanes.run_problems(
        [lane], {}, collected=0, guard_fired=runner.guard_fired, floor=0)
    assert "TIME GUARD" in capsys.readouterr().out


def test_the_guard_counts_from_ci_start_when_given(monkeypatch) -> None:
    """INFERMATRIX_CI_START (epoch seconds, .ci/run): provisioning counts against the budget."""
    monkeypatch.setenv("INFERMATRIX_CI_START", str(time.time() - 600))
    assert time.monotonic() - lanes.ci_start() == pytest.approx(600, abs=5)
    monkeypatch.delenv("INFERMATRIX_CI_START")
    assert time.monotonic() - lanes.ci_start() == pytest.approx(0, abs=5)


PRINT_DOCKER_HOST = """
import os, sys
from pathlib import Path
Path(sys.argv[1]).write_text(os.environ.get("DOCKER_HOST", "unset"))
"""


def test_the_unit_lane_runs_on_an_engine_endpoint_nobody_answers(tmp_path) -> None:
    """CI's unit lane gets a DOCKER_HOST on a socket that does not exist: a unit test that
    talks to the engine without its `docker` mark fails there instead of passing on CI's
    engine. The lane's process (started by the runner, as CI does) sees it; the SDK's ping on
    it fails."""
    import docker

    unit = next(p for p in lanes.phases_of(tmp_path) if p.name == "unit")
    endpoint = unit.env["DOCKER_HOST"]
    assert endpoint.startswith("unix://") and not Path(endpoint[len("unix://"):]).exists()
    script, seen = tmp_path / "lane.py", tmp_path / "seen"
    script.write_text(PRINT_DOCKER_HOST)
    lane = lanes.Phase("unit", [sys.executable, str(script), str(seen)], env=unit.env)
    lanes.Runner([lane], time.monotonic(), budget_s=3600).run()
    assert lane.returncode == 0 and seen.read_text() == endpoint
    with pytest.raises(docker.errors.DockerException):
        docker.DockerClient(base_url=endpoint, timeout=5).ping()
    assert all(not p.env for p in lanes.phases_of(tmp_path) if p.name != "unit")
