"""Shared fixtures for tests that use the real Docker engine.

- `docker_available`: the engine answers and a BuildKit-capable client exists. Without them a
  test is skipped on a developer machine, but FAILS under CI=true (CI provisions the engine in
  .ci/run, so a missing one is a broken CI, not a reason to skip).
- `test_matrix_path` / `test_ctx`: the shared test matrix tests/matrix/matrix.yaml, with a state
  directory of the test session (never the repository's).
- `built_base`: the debootstrap base of the test matrix, built through `base.build_base` (a
  no-op when .ci/run or an earlier run made it already). Returns its image reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import ci_rules

TESTS = Path(__file__).resolve().parent
TEST_MATRIX = TESTS / "matrix" / "matrix.yaml"


_in_ci = ci_rules.in_ci


@pytest.fixture(scope="session")
def docker_available() -> None:
    from infermatrix.engine import docker as engine
    from infermatrix.errors import UsageError

    problem = None
    try:
        engine.build_client()
        if not engine.Engine().available():
            problem = "the Docker engine does not answer (is dockerd running? DOCKER_HOST?)"
    except UsageError as exc:
        problem = str(exc)
    if problem:
        if _in_ci():
            pytest.fail(f"CI=true but Docker is not usable: {problem}", pytrace=False)
        pytest.skip(f"Docker is not usable here: {problem}")


@pytest.fixture(scope="session")
def test_matrix_path() -> Path:
    return TEST_MATRIX


@pytest.fixture(scope="session")
def shared_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state directory for the session (kernel cache and journal shared by tests)."""
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="session")
def test_ctx(shared_state_dir: Path):
    from infermatrix.context import Context

    return Context.load(TEST_MATRIX, shared_state_dir)


@pytest.fixture(scope="session")
def built_base(docker_available, test_ctx) -> str:
    """The test matrix's debootstrap base image reference (built once, then reused)."""
    from infermatrix.engine.docker import Engine
    from infermatrix.stages import base

    result = base.build_base(test_ctx.matrix, test_ctx.matrix.bases["default"], test_ctx.state,
                             docker=Engine())
    return result.ref


# What a CI run may skip or expect to fail, and the floor on the collected count:
# tests/ci_rules.py.


@pytest.fixture(scope="session")
def session_registry(tmp_path_factory: pytest.TempPathFactory):
    """One real registry (docker-registry, htpasswd auth, loopback) for the publishing tests of
    a session (registry_support.SESSION_USER/_PASSWORD): the main job's test publishes the CPU
    cell there first, so the consumer test's push of the same layers from the same engine is
    a cross-repository blob mount instead of compressing ~7 GB again. Stopped at the end, or
    by a test that stops it on purpose (the consumer's "registry stopped" case, last)."""
    from tests.support.registry_support import SESSION_PASSWORD, SESSION_USER, start_registry

    server = start_registry(tmp_path_factory.mktemp("registry"), SESSION_USER, SESSION_PASSWORD)
    yield server
    server.stop()


def _skip_reason(report) -> str:
    return str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)


def _fails_in_ci(report) -> bool:
    if not (_in_ci() and report.skipped and not hasattr(report, "wasxfail")):
        return False
    # by node id, as xfails are: a phrase of the reason would let any test that says it skip
    return report.nodeid not in ci_rules.SKIPS_ALLOWED


def _unlisted_xfail(report) -> bool:
    return (_in_ci() and hasattr(report, "wasxfail")
            and report.nodeid not in ci_rules.XFAILS_ALLOWED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skipped test is a failure (CI provisions Docker, the registry, chromium,
    nvcc...): a missing part must not turn into a green run that tested nothing. So is an
    xfail (or xpass) not listed in ci_rules.XFAILS_ALLOWED: `xfail` must not hide a failure."""
    outcome = yield
    report = outcome.get_result()
    if _fails_in_ci(report):
        report.outcome = "failed"
        report.longrepr = ("skipped under CI=true, which provisions everything: "
                           f"{_skip_reason(report)}")
    elif _unlisted_xfail(report):
        reason = report.wasxfail
        del report.wasxfail  # else pytest reports it as xfailed/xpassed again
        report.outcome = "failed"
        report.longrepr = (f"xfail under CI=true, not listed in tests/ci_rules.py "
                           f"XFAILS_ALLOWED: {reason or '(no reason)'}")


def _whole_suite(config: pytest.Config) -> bool:
    """No selection narrowed the run: the default test paths, no -m, -k or --deselect."""
    option = config.option
    narrowed = option.markexpr or option.keyword or getattr(option, "deselect", None)
    default = {(Path(config.rootpath) / p).resolve() for p in config.getini("testpaths")}
    given = {(Path(config.invocation_params.dir) / a).resolve() for a in config.args}
    return not narrowed and given <= default | {Path(config.rootpath).resolve()}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under CI=true a whole-suite run that collected fewer tests than the floor fails."""
    if (_in_ci() and _whole_suite(session.config)
            and len(session.items) < ci_rules.MIN_COLLECTED):
        raise pytest.UsageError(
            f"CI=true: collected {len(session.items)} tests, fewer than the floor of "
            f"{ci_rules.MIN_COLLECTED} (tests/ci_rules.py MIN_COLLECTED): tests went missing")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI=true a run that collected nothing fails (pytest's exit 5 is not a pass)."""
    if _in_ci() and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\nCI=true: no tests were collected, which is a failure here", flush=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same rule for skips at collection (a module-level `pytest.importorskip` or
    `pytest.skip(allow_module_level=True)`): under CI=true the module is a collection error."""
    outcome = yield
    report = outcome.get_result()
    if _fails_in_ci(report):
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid}: skipped at collection under CI=true, which "
                           f"provisions everything: {_skip_reason(report)}")
