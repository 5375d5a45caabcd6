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

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TEST_MATRIX = TESTS / "matrix" / "matrix.yaml"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def docker_available() -> None:
    from infermatrix import engine
    from infermatrix.errors import UsageError

    problem = None
    try:
        engine.build_client()
        if not engine.engine_available():
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
    from infermatrix import base

    result = base.build_base(test_ctx.matrix, test_ctx.matrix.bases["default"], test_ctx.state)
    return result.ref
