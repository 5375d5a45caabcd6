"""`infermatrix report`: HTML, Markdown and JSON views of the journal and the plan."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from ..engine.docker import Engine
from ..errors import ConfigError, InfermatrixError, UsageError
from ..journal import load_records
from ..model.cell import CellPlan
from ..stages.report import (build_report, fill_image_sizes, load_plan_file,
                             print_summary, write_report)
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
    parser.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                        help="merge the journal/report fragments of many runners (state "
                             "directories, or folders of CI job artifacts): one report, one "
                             "images.lock and one journal/ in --out; a tag pinned to two "
                             "digests is refused (exit 1)")
    parser.set_defaults(func=run)


def _state(args: argparse.Namespace) -> StatePaths:
    return StatePaths.at(args.state_dir or Path(args.matrix).resolve().parent / DEFAULT_STATE_DIR)


def _read_plan_file(path: Path) -> list[CellPlan]:
    try:
        return load_plan_file(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: plan file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not a plan JSON file: {exc}", path) from None
    except RecursionError:  # issue 48's fuzz: `[[[[...` deeper than the decoder goes
        raise ConfigError("not a plan JSON file: nested too deep", path) from None


def _plan_from_matrix(args: argparse.Namespace) -> list[CellPlan]:
    """The plan every command works from (stages.plan_cells: the lock's verdicts included)."""
    from ..context import Context
    from ..stages import plan_cells

    return list(plan_cells(Context.load(args.matrix, args.state_dir, args.offline)))


def resolve_plans(args: argparse.Namespace, state: StatePaths) -> list[CellPlan]:
    """The typed plans the report reads: --plan FILE; else a fresh plan of the matrix; else
    <state>/plan.json; else none (the report then shows only the cells of the journal)."""
    if args.plan:
        return _read_plan_file(Path(args.plan))
    saved = state.root / PLAN_FILE
    if Path(args.matrix).is_file():
        try:
            return _plan_from_matrix(args)
        except ConfigError:
            raise
        except InfermatrixError as exc:  # e.g. offline without cached metadata
            print(f"infermatrix report: warning: could not plan the matrix ({exc}); "
                  f"{'using ' + str(saved) if saved.is_file() else 'journal cells only'}",
                  file=sys.stderr)
    if saved.is_file():
        return _read_plan_file(saved)
    return []


def run_merge(args: argparse.Namespace, state: StatePaths) -> int:
    """One report, images.lock and journal from the fragments (scale/merge.py); nothing is
    written when two fragments pin one tag to different digests."""
    from ..scale.merge import describe, merge_dirs, write_merged_journal
    from ..imageslock import IMAGES_LOCK_NAME, write_images_lock

    merged = merge_dirs(args.merge)
    plans = resolve_plans(args, state)
    if not args.no_docker:
        fill_image_sizes(merged.records, Engine())
    logs = {cell: StatePaths.at(root) for cell, root in merged.sources.items()}
    report = build_report(merged.records, plans, logs)
    out = Path(args.out) if args.out else state.reports
    files = write_report(report, out)
    write_images_lock(out / IMAGES_LOCK_NAME, merged.lock)
    write_merged_journal(merged, StatePaths.at(out))
    console = Console()
    print_summary(report, files.html, console)
    console.print(f"{describe(merged)}; wrote {files.html}, {files.markdown.name}, "
                  f"{files.json.name}, {IMAGES_LOCK_NAME}, journal/ in {out}",
                  markup=False, highlight=False)
    return 0


def run(args: argparse.Namespace) -> int:
    state = _state(args)
    if args.merge:
        return run_merge(args, state)
    plans = resolve_plans(args, state)
    records = load_records(state)
    if not args.no_docker:
        fill_image_sizes(records, Engine())
    report = build_report(records, plans, state)
    out = Path(args.out) if args.out else state.reports
    files = write_report(report, out)
    console = Console()
    print_summary(report, files.html, console)
    console.print(f"wrote {files.html}, {files.markdown.name}, {files.json.name}",
                  markup=False, highlight=False)
    return 0
