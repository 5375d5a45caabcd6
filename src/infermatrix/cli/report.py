"""`infermatrix report`: HTML, Markdown and JSON views of the journal and the plan."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from ..errors import ConfigError, InfermatrixError, UsageError
from ..report import (build_report, image_size, load_journal, load_plan_file, print_summary,
                      stage_results, write_report)
from ..state import DEFAULT_STATE_DIR, StatePaths
from . import common_options

PLAN_FILE = "plan.json"  # where `infermatrix plan --json` output may be saved in the state dir


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="write the HTML/Markdown/JSON report of the matrix",
        description="Write report.html (self-contained), report.md and report.json from the "
                    "journal and the plan.")
    common_options(parser)
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where to write the report (default: <state-dir>/reports)")
    parser.add_argument("--plan", default=None, metavar="FILE",
                        help="plan JSON (`infermatrix plan --json` output) instead of planning "
                             "the matrix again")
    parser.add_argument("--no-docker", action="store_true",
                        help="do not ask the local Docker engine for the size of built images "
                             "the journal does not record")
    parser.set_defaults(func=run)


def _state(args: argparse.Namespace) -> StatePaths:
    return StatePaths.at(args.state_dir or Path(args.matrix).resolve().parent / DEFAULT_STATE_DIR)


def _read_plan_file(path: Path) -> list[dict[str, Any]]:
    try:
        return load_plan_file(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: plan file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not a plan JSON file: {exc}", path) from None


def _plan_from_matrix(args: argparse.Namespace) -> list[Any] | None:
    """Plan the matrix (plan.plan_matrix); None when the planner is not available here."""
    try:
        plan = importlib.import_module("infermatrix.plan")
    except ModuleNotFoundError:
        return None
    from ..context import Context
    ctx = Context.load(args.matrix, args.state_dir, args.offline)
    return list(plan.plan_matrix(ctx))


def resolve_plans(args: argparse.Namespace, state: StatePaths) -> list[Any]:
    """--plan FILE; else a fresh plan of the matrix; else <state>/plan.json; else none (the
    report then shows only the cells of the journal)."""
    if args.plan:
        return _read_plan_file(Path(args.plan))
    saved = state.root / PLAN_FILE
    if Path(args.matrix).is_file():
        try:
            plans = _plan_from_matrix(args)
        except ConfigError:
            raise
        except InfermatrixError as exc:  # e.g. offline without cached metadata
            print(f"infermatrix report: warning: could not plan the matrix ({exc}); "
                  f"{'using ' + str(saved) if saved.is_file() else 'journal cells only'}",
                  file=sys.stderr)
            plans = None
        if plans is not None:
            return plans
    if saved.is_file():
        return _read_plan_file(saved)
    return []


def fill_image_sizes(records: dict[str, dict[str, Any]]) -> int:
    """Set `image_size_bytes` (in memory) from `docker image inspect` for built cells whose
    journal has no size; without a Docker engine, nothing. Returns how many were filled."""
    wanting = {cid: r["image_id"] for cid, r in records.items()
               if isinstance(r.get("image_id"), str) and not report_image_size(r)}
    if not wanting:
        return 0
    from .. import engine  # the only module that talks to Docker
    if not engine.engine_available():
        return 0
    filled = 0
    for cell_id, image_id in wanting.items():
        try:
            info = engine.inspect_image(image_id)
        except Exception as exc:  # noqa: BLE001 - a size is a nicety, never a reason to fail
            print(f"infermatrix report: warning: cannot inspect {image_id}: {exc}",
                  file=sys.stderr)
            continue
        if info and isinstance(info.get("Size"), int):
            records[cell_id]["image_size_bytes"] = info["Size"]
            filled += 1
    return filled


def report_image_size(record: dict[str, Any]) -> int | None:
    return image_size(record, stage_results(record))


def run(args: argparse.Namespace) -> int:
    state = _state(args)
    plans = resolve_plans(args, state)
    records = load_journal(state)
    if not args.no_docker:
        fill_image_sizes(records)
    report = build_report(records, plans, state)
    out = Path(args.out) if args.out else state.reports
    files = write_report(report, out)
    console = Console()
    print_summary(report, files.html, console)
    console.print(f"wrote {files.html}, {files.markdown.name}, {files.json.name}",
                  markup=False, highlight=False)
    return 0
