"""`infermatrix pipeline`: the main job (what `nox -s build-matrix` runs)."""

from __future__ import annotations

import argparse

from ..pipeline import console, run_pipeline
from ..state import run_lock
from ..stages import Run
from . import common_options, load_run, run_options, selection_options
from .views import Line, pipeline_summary, print_lines


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "pipeline", help="the main job: plan, lock, render, base, build, audit, smoke, tag, "
        "publish, train, report",
        description="Run every step over the selected cells. A failed cell does not stop the "
        "others (unless --fail-fast); a rerun resumes from the journal.")
    common_options(parser)
    selection_options(parser)
    run_options(parser, "fail_fast", "levels", "smoke_on", "max_jobs", "nvcc_threads",
                "timeout_min",
                "force", "ca_bundle", "wait", "publish", "builders", "registry", "images_lock",
                "allow_retag")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    pipeline_run = load_run(args)
    with run_lock(pipeline_run.ctx.state, wait=pipeline_run.options.wait):
        forecast_first(pipeline_run)
        require_engine(pipeline_run)
        code, _ = run_pipeline(pipeline_run)
        console.rule("[bold]summary")
        print_lines(closing_lines(pipeline_run), console)
    return code


def require_engine(run: Run) -> None:
    """The Docker engine answers before any step (issue 47): an unreachable one is
    EngineUnavailable (exit 4, README), with the journal untouched; found by a step, it would
    turn a tagged cell into "failed at base"."""
    run.docker.sdk()  # connects and pings; EngineUnavailable when it cannot


def forecast_first(run: Run) -> None:
    """Before the first step: what the run will take on this host (issue 47)."""
    from ..stages.forecast import print_forecast
    from ..stages.steps import echo

    console.rule("[bold]forecast")
    print_forecast(run.ctx, run.cells(), run.options, echo)


def closing_lines(run: Run) -> list[Line]:
    """The main job's last table, from the journal: each cell's outcome, step times and image
    size, and for each cell not done its reason and the command that moves it on."""
    from ..journal import load_records
    from ..stages.report import build_report, fill_image_sizes

    records = load_records(run.ctx.state)
    fill_image_sizes(records, run.docker)
    registry_set = bool(run.options.registry or run.ctx.matrix.publish.get("registry"))
    return pipeline_summary(build_report(records, run.plans, run.ctx.state).cells,
                            registry_set)
