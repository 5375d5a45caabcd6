"""Sessions: `build-matrix` (the main job), `plan`, `tests`, `bench`, `lock-deps`.

`nox -s build-matrix -- --select 'cpu-*'` passes everything after `--` to the pipeline.
Every session installs the toolkit exactly as uv.lock pins it (`uv sync --frozen`: never
re-resolved); `nox -s lock-deps` is the one way the pins move (`uv lock --upgrade`).
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

# uv must trust the system CA bundle (TLS-intercepting proxies) and never download a Python.
os.environ.setdefault("UV_SYSTEM_CERTS", "1")
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")

PYTHON = "3.11"
ROOT = Path(__file__).parent


def _install(session: nox.Session, dev: bool = False) -> None:
    """The checkout (editable) and its dependencies at uv.lock's pins, into the session's venv."""
    extras = ["--extra", "dev"] if dev else []
    session.run_install("uv", "sync", "--frozen", "--no-python-downloads", *extras,
                        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
                        external=True)


def _provision(session: nox.Session) -> None:
    """Docker engine, debootstrap, registry, chromium: installed and started when missing
    (a second or two when they are there already)."""
    session.run("bash", str(ROOT / ".ci" / "provision"), external=True)


@nox.session(name="build-matrix", python=PYTHON)
def build_matrix(session: nox.Session) -> None:
    """The main job: plan → lock check → render → build → audit → smoke → tag → publish → report."""
    _provision(session)
    _install(session)
    session.run("infermatrix", "pipeline", *session.posargs)


@nox.session(python=PYTHON)
def plan(session: nox.Session) -> None:
    """Show the planned and pruned cells of matrix.yaml."""
    _install(session)
    session.run("infermatrix", "plan", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Lint and types (ruff, mypy: 0 findings), the drift check of images/ against a fresh
    render, then the whole test suite in lanes
    (tests/lanes.py: the bases, then unit, Docker and real-cell lanes side by side, timed, with
    JUnit XML under .state/ci/). `nox -s tests -- ARGS` runs one plain `pytest ARGS` instead."""
    _provision(session)
    _install(session, dev=True)
    # uv.lock must match pyproject.toml (a dependency edited without `nox -s lock-deps` fails)
    session.run("uv", "lock", "--check", external=True)
    # the static gates (issue 49): a new finding fails the session before any test runs;
    # pyproject.toml's [tool.ruff.lint] and [tool.mypy] name the rules and the strictness
    session.run("ruff", "check", "--no-cache", ".")
    session.run("mypy")
    session.run("infermatrix", "render", "--check")
    if session.posargs:
        session.run("pytest", *session.posargs)
    else:
        session.run("python", "-m", "tests.lanes")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: print figures (no pass/fail). `nox -s bench -- plan` runs bench/plan*.py."""
    _install(session, dev=True)
    pattern = f"{session.posargs[0]}*.py" if session.posargs else "*.py"
    for script in sorted((ROOT / "bench").glob(pattern)):
        session.log(f"== {script.name}")
        session.run("python", str(script))


@nox.session(name="lock-deps", python=False)
def lock_deps(session: nox.Session) -> None:
    """Move the toolkit's pins: `uv lock --upgrade` (or `-- --upgrade-package NAME`); commit
    the new uv.lock."""
    session.run("uv", "lock", *(session.posargs or ["--upgrade"]), external=True)
