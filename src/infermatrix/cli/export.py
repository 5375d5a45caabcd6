"""`infermatrix export github|gitlab|bake`: write the plan as CI jobs or a bake file."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import common_options, compile_options, load_run, run_options, selection_options

if TYPE_CHECKING:
    from ..stages.steps import Run

DEFAULT_OUT = {"github": ".github/workflows/infermatrix.yml",
               "gitlab": ".gitlab-ci.infermatrix.yml", "bake": "docker-bake.json",
               "github-watch": ".github/workflows/infermatrix-watch.yml",
               "gitlab-watch": ".gitlab-ci.infermatrix-watch.yml"}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export", help="write the plan as GitHub/GitLab CI jobs or a `docker buildx bake` file",
        description="github: a workflow with one job per planned cell (runner by platform), "
        "each running `infermatrix pipeline --select <cell>` and uploading its journal and "
        "report fragment. gitlab: the same as `parallel:matrix`. bake: a docker-bake.json "
        "with one target per rendered cell (run `docker buildx bake` beside it). "
        "github-watch / gitlab-watch: a scheduled job that runs `infermatrix watch` and, when "
        "a release bump is due, opens a change with the new locks and rendered Dockerfiles "
        "for CI to prove.")
    parser.add_argument("target", choices=sorted(DEFAULT_OUT), help="what to write")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--out", metavar="PATH", default=None,
                        help="file to write, `-` for stdout (default, beside the matrix: "
                             + ", ".join(f"{k}: {v}" for k, v in DEFAULT_OUT.items()) + ")")
    parser.add_argument("--runner", action="append", default=[], metavar="PLATFORM=LABEL",
                        help="runner label (github) or tag (gitlab) of a platform, e.g. "
                             "linux/arm64=my-arm-runner; repeatable")
    parser.add_argument("--settle-days", type=float, default=None, metavar="N",
                        help="github-watch / gitlab-watch: how old a release must be before "
                        "its bump is opened (default 7)")
    compile_options(parser)
    run_options(parser, "ca_bundle")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..scale import export

    if args.target.endswith("-watch"):
        return _watch(args)
    export_run = load_run(args)
    ctx = export_run.ctx
    out = _out_path(args, ctx.root)
    matrix = _relative_to_cwd(ctx.matrix.path)
    if args.target == "github":
        runners = export.parse_label_overrides(args.runner, export.GITHUB_RUNNERS)
        cells = export.export_cells(ctx, export_run.plans)
        text = export.to_yaml(export.github_workflow(cells, runners, matrix),
                              "infermatrix export github: one job per planned cell.")
    elif args.target == "gitlab":
        tags = export.parse_label_overrides(args.runner, export.GITLAB_TAGS)
        cells = export.export_cells(ctx, export_run.plans)
        text = export.to_yaml(export.gitlab_pipeline(cells, tags, matrix), "infermatrix export "
                              "gitlab: one parallel:matrix job per planned cell.")
    else:
        text, cells = _bake(args, export_run, out)
    _write(out, text)
    print(f"export {args.target}: {len(cells)} cells -> {out or 'stdout'}", file=sys.stderr)
    return 0


def _watch(args: argparse.Namespace) -> int:
    """The scheduled release watch (needs the matrix only, not a plan of its cells)."""
    from ..errors import UsageError
    from ..scale import export
    from . import load_context

    ctx = load_context(args, log=False)
    settle = export.WATCH_DEFAULT_SETTLE_DAYS if args.settle_days is None else args.settle_days
    if settle < 0:
        raise UsageError(f"--settle-days {settle:g}: a delay is 0 days or more")
    out = _out_path(args, ctx.root)
    matrix = _relative_to_cwd(ctx.matrix.path)
    if args.target == "github-watch":
        text = export.to_yaml(export.github_watch_workflow(matrix, settle),
                              "infermatrix export github-watch: the release watch, daily.")
    else:
        text = export.to_yaml(export.gitlab_watch_pipeline(matrix, settle),
                              "infermatrix export gitlab-watch: the release watch; run it from "
                              "a pipeline schedule (CI/CD > Schedules).")
    _write(out, text)
    print(f"export {args.target}: settle delay {settle:g} days -> {out or 'stdout'}",
          file=sys.stderr)
    return 0


def _bake(args: argparse.Namespace, export_run: Run, out: Path | None) -> tuple[str, list[Any]]:
    """The bake file, its args from the compile planner as `build` sizes them."""
    from ..scale import export
    from ..stages.build import compile_plan_for_cells, secrets_for

    options = export_run.options
    compile = compile_plan_for_cells(export_run.ctx, export_run.cells(), options)
    out_dir = out.parent if out else Path.cwd()
    data, unrendered = export.bake_file(export_run.ctx, export_run.plans, compile.build_args(),
                                        secrets_for(options), out_dir, export_run.docker)
    for cell_id in unrendered:
        print(f"export bake: {cell_id} left out: not rendered (run `infermatrix render "
              f"--select {cell_id}`)", file=sys.stderr)
    return json.dumps(data, indent=2) + "\n", data["target"]


def _out_path(args: argparse.Namespace, root: Path) -> Path | None:
    if args.out == "-":
        return None
    return Path(args.out) if args.out else root / DEFAULT_OUT[args.target]


def _relative_to_cwd(path: Path) -> str:
    """The matrix path the CI job passes (a job runs at the repository root, as `export` does)."""
    relative = os.path.relpath(path.resolve(), Path.cwd())
    return path.resolve().as_posix() if relative.startswith("..") else Path(relative).as_posix()


def _write(out: Path | None, text: str) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
