"""`infermatrix export`: the plan as jobs of the engines users already run (issue 19).

Pure: the planned cells (the same plan every command works from, the lock's verdicts in it)
and their resolved CellSpec go in, a data structure comes out that the command writes as
YAML (GitHub Actions, GitLab CI) or JSON (`docker buildx bake`). Nothing is scheduled here:
each CI job runs `infermatrix pipeline --select <cell>` in its own state directory and
uploads that directory's journal and report fragment.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..context import Context
from ..errors import UsageError
from ..model.cell import CellPlan

# Runner labels by image platform (flags override them). GitHub: the hosted Ubuntu runners,
# the `-arm` one an Arm machine. GitLab: the hosted Linux runners' tags.
GITHUB_RUNNERS = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}
GITLAB_TAGS = {"linux/amd64": "saas-linux-medium-amd64", "linux/arm64": "saas-linux-medium-arm64"}
# Most jobs one workflow run / one parallel:matrix may hold (the services' own limits).
GITHUB_MAX_JOBS = 256
GITLAB_MAX_JOBS = 200
STATE_ROOT = ".state"  # per-cell state directories of the CI jobs: .state/<cell-id>
# What a job hands on (journal + report fragment), relative to its state directory.
FRAGMENT_PATHS = ("journal", "reports")
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]+")  # cell ids go into shell lines and artifact names
_BAKE_NAME = re.compile(r"[^A-Za-z0-9_-]")  # bake target names allow only [a-zA-Z0-9_-]


@dataclass(frozen=True)
class ExportCell:
    id: str
    platform: str


def export_cells(ctx: Context, plans: list[CellPlan]) -> list[ExportCell]:
    """The planned cells (pruned and unresolved ones left out), each once, with the platform
    of its resolved CellSpec."""
    cells: dict[str, ExportCell] = {}
    for plan in plans:
        if not plan.planned or plan.id in cells:
            continue
        if not _SAFE_ID.fullmatch(plan.id):
            raise UsageError(f"cell id {plan.id!r} has characters a CI job name cannot carry")
        cells[plan.id] = ExportCell(plan.id, ctx.spec(plan).platform)
    return list(cells.values())


def parse_label_overrides(items: list[str], defaults: Mapping[str, str]) -> dict[str, str]:
    """`--runner PLATFORM=LABEL` flags over the defaults; a malformed one is a usage error."""
    labels = dict(defaults)
    for item in items:
        platform, sep, label = item.partition("=")
        if not sep or not platform.startswith("linux/") or not label.strip():
            raise UsageError(f"--runner {item!r}: expected PLATFORM=LABEL, e.g. "
                             "linux/arm64=my-arm-runner")
        labels[platform] = label.strip()
    return labels


def label_for(cell: ExportCell, labels: Mapping[str, str]) -> str:
    try:
        return labels[cell.platform]
    except KeyError:
        raise UsageError(f"{cell.id}: no runner label for platform {cell.platform}; give one "
                         f"with --runner {cell.platform}=LABEL") from None


def pipeline_command(cell: str, matrix: str) -> str:
    """The one command each CI job runs (`cell` may be a CI variable reference)."""
    return (f'infermatrix pipeline --select "{cell}" --state-dir "{STATE_ROOT}/{cell}" '
            f'--matrix "{matrix}"')


def _check_count(cells: list[ExportCell], limit: int, system: str) -> None:
    if not cells:
        raise UsageError("no planned cell to export (see `infermatrix plan`)")
    if len(cells) > limit:
        raise UsageError(f"{len(cells)} cells exceed {system}'s {limit} jobs per matrix; "
                         "export parts of the plan with --select/--skip")


_INSTALL = "python3 -m venv .venv && .venv/bin/pip install ."


def github_workflow(cells: list[ExportCell], runners: Mapping[str, str], matrix: str
                    ) -> dict[str, Any]:
    """A GitHub Actions workflow, runnable by hand and reusable (`workflow_call`): one job
    per cell on the runner of its platform."""
    _check_count(cells, GITHUB_MAX_JOBS, "GitHub Actions")
    cell_ref = "${{ matrix.cell }}"  # in the shell lines as $CELL (env), not substituted
    include = [{"cell": c.id, "runner": label_for(c, runners)} for c in cells]
    steps = [
        {"uses": "actions/checkout@v4"},
        {"uses": "actions/setup-python@v5", "with": {"python-version": "3.11"}},
        {"name": "install infermatrix",
         "run": f'{_INSTALL}\necho "$PWD/.venv/bin" >> "$GITHUB_PATH"'},
        {"name": "pipeline", "env": {"CELL": cell_ref}, "run": pipeline_command("$CELL", matrix)},
        {"name": "upload journal and report fragment", "if": "always()",
         "uses": "actions/upload-artifact@v4",
         "with": {"name": f"infermatrix-{cell_ref}",
                  "path": "\n".join(f"{STATE_ROOT}/{cell_ref}/{p}/" for p in FRAGMENT_PATHS),
                  "if-no-files-found": "warn"}},
    ]
    return {
        "name": "infermatrix",
        "on": {"workflow_dispatch": {}, "workflow_call": {}},
        "jobs": {"cell": {
            "name": cell_ref,
            "runs-on": "${{ matrix.runner }}",
            "strategy": {"fail-fast": False, "matrix": {"include": include}},
            "steps": steps,
        }},
    }


def gitlab_pipeline(cells: list[ExportCell], tags: Mapping[str, str], matrix: str
                    ) -> dict[str, Any]:
    """A GitLab CI file: one `parallel:matrix` job per cell, on runners tagged by platform."""
    _check_count(cells, GITLAB_MAX_JOBS, "GitLab CI")
    state = f"{STATE_ROOT}/$CELL"
    return {
        "stages": ["infermatrix"],
        "infermatrix": {
            "stage": "infermatrix",
            "parallel": {"matrix": [{"CELL": c.id, "RUNNER_TAG": label_for(c, tags)}
                                    for c in cells]},
            "tags": ["$RUNNER_TAG"],
            "script": [_INSTALL, 'export PATH="$PWD/.venv/bin:$PATH"',
                       pipeline_command("$CELL", matrix)],
            "artifacts": {"when": "always", "name": "infermatrix-$CELL",
                          "paths": [f"{state}/{p}/" for p in FRAGMENT_PATHS]},
        },
    }


# --- the release watch on a schedule (#45) -------------------------------------------------------
WATCH_CRON = "17 5 * * *"  # daily; a release is due only once its settle delay has passed
WATCH_BRANCH = 'infermatrix/bump-$(date -u +%Y%m%d)'
WATCH_DEFAULT_SETTLE_DAYS = 7.0


def watch_bump_script(matrix: str, settle_days: float, open_change: str) -> str:
    """The scheduled job's shell: `infermatrix watch`; when a bump is due (exit 1), new locks
    and rendered Dockerfiles on a branch, and `open_change` opens the change for CI to prove.
    Nothing due: the job ends green; a watch error (exit 2) fails it."""
    return "\n".join([
        "set +e",
        f'infermatrix watch --matrix "{matrix}" --settle-days {settle_days:g} > watch.txt',
        "due=$?",
        "set -e",
        "cat watch.txt",
        'if [ "$due" -eq 0 ]; then exit 0; fi',
        'if [ "$due" -ne 1 ]; then exit "$due"; fi',
        f'infermatrix lock --matrix "{matrix}"',
        f'infermatrix render --matrix "{matrix}"',
        'if git diff --quiet -- locks images; then echo "watch: nothing to commit"; exit 0; fi',
        f'branch="{WATCH_BRANCH}"',
        'git switch -c "$branch"',
        'git add locks images',
        'git -c user.name="infermatrix watch" -c user.email="infermatrix-watch@users.noreply" '
        'commit -m "infermatrix: engine release bump" -m "$(cat watch.txt)"',
        open_change,
    ])


def github_watch_workflow(matrix: str, settle_days: float = WATCH_DEFAULT_SETTLE_DAYS,
                          cron: str = WATCH_CRON) -> dict[str, Any]:
    """A scheduled GitHub Actions workflow: the watch, and a pull request with the bump."""
    open_change = ('git push origin "$branch"\n'
                   'gh pr create --head "$branch" --title "infermatrix: engine release bump" '
                   '--body-file watch.txt')
    return {
        "name": "infermatrix watch",
        "on": {"schedule": [{"cron": cron}], "workflow_dispatch": {}},
        "permissions": {"contents": "write", "pull-requests": "write"},
        "jobs": {"watch": {
            "runs-on": GITHUB_RUNNERS["linux/amd64"],
            "steps": [
                {"uses": "actions/checkout@v4"},
                {"uses": "actions/setup-python@v5", "with": {"python-version": "3.11"}},
                {"name": "install infermatrix",
                 "run": f'{_INSTALL}\necho "$PWD/.venv/bin" >> "$GITHUB_PATH"'},
                {"name": "watch and bump", "env": {"GH_TOKEN": "${{ github.token }}"},
                 "run": watch_bump_script(matrix, settle_days, open_change)},
            ],
        }},
    }


def gitlab_watch_pipeline(matrix: str, settle_days: float = WATCH_DEFAULT_SETTLE_DAYS
                          ) -> dict[str, Any]:
    """A GitLab CI job for a pipeline schedule (CI/CD > Schedules): the watch, and a merge
    request with the bump (push options; the job's token needs write access to the
    repository, e.g. a project access token in INFERMATRIX_PUSH_TOKEN)."""
    open_change = ('git push "https://oauth2:${INFERMATRIX_PUSH_TOKEN}@${CI_SERVER_HOST}/'
                   '${CI_PROJECT_PATH}.git" "$branch" -o merge_request.create '
                   '-o merge_request.title="infermatrix: engine release bump"')
    return {
        "infermatrix-watch": {
            "rules": [{"if": '$CI_PIPELINE_SOURCE == "schedule"'}],
            "image": "python:3.11",
            "script": [_INSTALL, 'export PATH="$PWD/.venv/bin:$PATH"',
                       watch_bump_script(matrix, settle_days, open_change)],
            "artifacts": {"when": "always", "paths": ["watch.txt"]},
        },
    }


def bake_target_name(cell_id: str) -> str:
    return _BAKE_NAME.sub("_", cell_id)


def bake_file(ctx: Context, plans: list[CellPlan], build_args: Mapping[str, str],
              secrets: Mapping[str, Path], out_dir: Path, docker: Any = None
              ) -> tuple[dict[str, Any], list[str]]:
    """(a `docker buildx bake` JSON file, the planned cells left out because images/<cell>/
    holds no rendered Dockerfile). Contexts are relative to `out_dir`, where bake runs;
    secrets name their source file, never their content. `docker`: the engine that holds the
    base images (their ids are part of the input hash label, as `build` computes it)."""
    from ..stages.build import (INPUT_HASH_LABEL, base_images, cell_dir, input_hash,
                                kernel_keys_for, local_ref, serving_target, split_keys)

    targets: dict[str, Any] = {}
    unrendered = []
    secret_lines = [f"id={sid},src={Path(src).resolve()}" for sid, src in sorted(secrets.items())]
    by_id = {p.id: p for p in plans}
    for cell in export_cells(ctx, plans):
        directory = cell_dir(ctx, cell.id)
        if not (directory / "Dockerfile").is_file():
            unrendered.append(cell.id)
            continue
        dockerfile_text = (directory / "Dockerfile").read_text()
        spec = ctx.spec(by_id[cell.id])
        # the serving image, as `build` makes it: its kernels' keys, its target
        keys = split_keys(spec, kernel_keys_for(ctx, spec, dockerfile_text))[0]
        # the label `infermatrix build` puts on the image: a bake-built image is the same one
        bases = base_images(dockerfile_text, docker) if docker is not None else None
        digest = input_hash(directory, {**build_args, "platform": cell.platform}, keys, bases)
        name = bake_target_name(cell.id)
        if name in targets:
            raise UsageError(f"cells {cell.id} and another map to one bake target name {name}")
        targets[name] = {
            "context": os.path.relpath(directory, out_dir.resolve()),
            "dockerfile": "Dockerfile",
            "platforms": [cell.platform],
            "args": dict(build_args),
            "secret": secret_lines,
            "tags": [local_ref(cell.id)],
            "labels": {INPUT_HASH_LABEL: digest},
            **({"target": target} if (target := serving_target(dockerfile_text)) else {}),
        }
    if not targets:
        raise UsageError("no rendered cell to export: run `infermatrix render` first")
    return {"group": {"default": {"targets": list(targets)}}, "target": targets}, unrendered


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (shell lines, artifact paths) as `|` blocks, as people write them."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _string)


def to_yaml(data: Mapping[str, Any], header: str) -> str:
    body = yaml.dump(dict(data), Dumper=_BlockDumper, sort_keys=False, width=1000,
                     default_flow_style=False)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body
