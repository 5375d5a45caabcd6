"""The suite's CI rules (tests/conftest.py, tests/ci_rules.py) run on generated test files with
pytester: under CI=true a skip, an unlisted xfail, an empty collection and a short whole-suite
collection fail; outside CI they are what pytest makes of them."""

from __future__ import annotations

from tests.paths import TESTS

import time
from pathlib import Path

import pytest

from tests import ci_rules

CONFTEST = (TESTS / "conftest.py").read_text()

SAMPLE = """
import pytest

def test_passes():
    pass

def test_skips():
    pytest.skip("no widget here")

@pytest.mark.xfail(reason="known widget bug")
def test_expected_to_fail():
    assert False
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A copy of the suite's conftest in a `tests` package of a fresh directory (it imports
    tests.ci_rules, which the generated package re-exports from the real one)."""
    package = pytester.mkpydir("tests")
    (package / "conftest.py").write_text(CONFTEST)
    (package / "ci_rules.py").write_text(
        "from importlib import util as _u\n"
        f"_spec = _u.spec_from_file_location('_real_ci_rules', {ci_rules.__file__!r})\n"
        "_m = _u.module_from_spec(_spec); _spec.loader.exec_module(_m)\n"
        "globals().update({k: v for k, v in vars(_m).items() if not k.startswith('__')})\n")
    pytester.makeini("[pytest]\ntestpaths = tests\n")
    return pytester


def run(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool, *args: str
        ) -> pytest.RunResult:
    monkeypatch.setenv("CI", "true" if ci else "")
    return suite.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_outside_ci_a_skip_and_an_xfail_are_what_pytest_says(suite, monkeypatch) -> None:
    (suite.path / "tests" / "test_sample.py").write_text(SAMPLE)
    result = run(suite, monkeypatch, False, "-m", "not nothing")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1)
    assert result.ret == 0


def test_under_ci_a_skip_and_an_unlisted_xfail_fail(suite, monkeypatch) -> None:
    (suite.path / "tests" / "test_sample.py").write_text(SAMPLE)
    result = run(suite, monkeypatch, True, "-m", "not nothing")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*skipped under CI=true, which provisions everything*",
                                 "*xfail under CI=true, not listed in tests/ci_rules.py*"])
    assert result.ret == 1


def test_under_ci_a_listed_xfail_passes_as_xfail(suite, monkeypatch) -> None:
    (suite.path / "tests" / "test_sample.py").write_text(SAMPLE.split("def test_skips")[0] + """
@pytest.mark.xfail(reason="known widget bug")
def test_expected_to_fail():
    assert False
""")
    rules = suite.path / "tests" / "ci_rules.py"
    rules.write_text(rules.read_text() + "XFAILS_ALLOWED = "
                     "{'tests/test_sample.py::test_expected_to_fail': 'widget bug #1'}\n")
    result = run(suite, monkeypatch, True, "-m", "not nothing")
    result.assert_outcomes(passed=1, xfailed=1)
    assert result.ret == 0


def test_under_ci_an_empty_collection_fails(suite, monkeypatch) -> None:
    (suite.path / "tests" / "test_sample.py").write_text("def helper():\n    pass\n")
    selection = "tests/test_sample.py"  # a selection: the floor does not apply, emptiness does
    assert run(suite, monkeypatch, False, selection).ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result = run(suite, monkeypatch, True, selection)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*CI=true: no tests were collected*"])


def test_under_ci_a_whole_suite_below_the_floor_fails_and_a_selection_does_not(
        suite, monkeypatch) -> None:
    (suite.path / "tests" / "test_sample.py").write_text("def test_one():\n    pass\n")
    result = run(suite, monkeypatch, True)  # the whole suite: 1 test, below the floor
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*collected 1 tests, fewer than the floor of "
                                 f"{ci_rules.MIN_COLLECTED}*"])
    assert run(suite, monkeypatch, True, "tests/test_sample.py").ret == 0  # a selection
    assert run(suite, monkeypatch, True, "-k", "one").ret == 0


def test_a_dead_private_engines_data_is_reclaimed_and_a_live_ones_kept(tmp_path: Path) -> None:
    """What a killed run leaves (tests/lanes.py's reclaim_disk): a data root no process names
    is removed; one a running process names, and any other directory, stay."""
    import subprocess
    import sys

    from tests.support.dockerd_support import reclaim_stale_engines

    dead, live, other = (tmp_path / "imreal-engine-ab12cd", tmp_path / "im19-engine-xy_9",
                         tmp_path / "imreal-notes")
    for directory in (dead, live, other):
        (directory / "docker" / "overlay2").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               f"--data-root={live}/docker"])
    try:
        # a loaded machine (this lane runs nice) may not have exec'd the holder yet: its
        # command line names the root only from then on
        cmdline = Path(f"/proc/{holder.pid}/cmdline")
        deadline = time.monotonic() + 60
        while str(live).encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reclaim_stale_engines(tmp_path) == [dead]
    finally:
        holder.kill()
        holder.wait()
    assert not dead.exists() and live.is_dir() and other.is_dir()


TORCH_SKIP = """
import pytest

def test_needs_torch():
    pytest.skip("could not import 'torch': No module named 'torch'")

def test_sneaks_past():
    pytest.skip("widget missing; could not import 'torch' either")
"""


def test_under_ci_a_skip_is_allowed_by_node_id_not_by_its_reason(suite, monkeypatch) -> None:
    """Issue 48: a skip whose reason merely contains an allowed phrase is still a failure; only
    the node ids listed in ci_rules.SKIPS_ALLOWED may skip under CI=true."""
    (suite.path / "tests" / "test_sample.py").write_text(TORCH_SKIP)
    rules = suite.path / "tests" / "ci_rules.py"
    rules.write_text(rules.read_text() + "SKIPS_ALLOWED = "
                     "{'tests/test_sample.py::test_needs_torch': 'no torch on the CI host'}\n")
    result = run(suite, monkeypatch, True, "tests/test_sample.py")
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines(["*test_sneaks_past*skipped under CI=true*"])
    assert result.ret == 1


def test_under_ci_an_unlisted_collection_skip_fails_whatever_its_reason(suite, monkeypatch
                                                                         ) -> None:
    (suite.path / "tests" / "test_sample.py").write_text(
        "import pytest\npytest.importorskip('torch_that_is_not_there')\n"
        "def test_x():\n    pass\n")
    rules = suite.path / "tests" / "ci_rules.py"
    rules.write_text(rules.read_text() + "SKIPS_ALLOWED = {}\n")
    result = run(suite, monkeypatch, True, "tests/test_sample.py")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*skipped at collection under CI=true*"])


def test_every_allowed_skip_names_a_real_test_and_says_why() -> None:
    """An allowance is a node id of a test that exists (a renamed test must not keep it)."""
    assert isinstance(ci_rules.SKIPS_ALLOWED, dict)
    for node, why in ci_rules.SKIPS_ALLOWED.items():
        path, _, name = node.partition("::")
        assert (TESTS.parent / path).is_file(), node
        assert f"def {name.split('[')[0]}(" in (TESTS.parent / path).read_text(), node
        assert why.strip(), node
