"""Sessions: `build-matrix` (the main job), `plan`, `tests`, `bench`.

`nox -s build-matrix -- --select 'cpu-*'` passes everything after `--` to the pipeline.
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
    session.install("-e", ".[dev]" if dev else ".")


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
    """Drift check of images/ against a fresh render, then the whole test suite."""
    _provision(session)
    _install(session, dev=True)
    session.run("infermatrix", "render", "--check")
    session.run("pytest", *(session.posargs or ["-ra"]))


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: print figures (no pass/fail). `nox -s bench -- plan` runs bench/plan*.py."""
    _install(session, dev=True)
    pattern = f"{session.posargs[0]}*.py" if session.posargs else "*.py"
    for script in sorted((ROOT / "bench").glob(pattern)):
        session.log(f"== {script.name}")
        session.run("python", str(script))
