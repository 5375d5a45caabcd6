"""A cheap matrix for the fault tests (issue 17): fixture engines on the CPU lane, on the test
matrix's debootstrap base, rendered from tests/fixtures/fault-templates/ (one RUN that sleeps a
few seconds, optionally fills the disk). Every stage is real: plan, render, build on a real
engine, static smoke, tag, report; only the image content is tiny."""

from __future__ import annotations

from tests.paths import TESTS

import json
import shutil
from pathlib import Path

TESTS = TESTS
TEMPLATES = TESTS / "fixtures" / "fault-templates"
TEST_MATRIX = TESTS / "matrix" / "matrix.yaml"

MATRIX = """\
version: 1
model: {{name: fixture/none, card: "https://example.invalid/card", floors: {{}}, launch: {{}}}}
python: "3.11"
axes:
  cuda: [cpu]
  torch: ["2.13.0"]
  engine: [{engines}]
  arch: [cpu]
engines:
{definitions}
bases:
  default: bookworm
  definitions:
    bookworm: {base}
build:
  timeout_minutes: 10
  disk: {{min_free_gib: {min_free_gib}}}
smoke:
  levels: [static]
  timeouts: {{static: 120}}
tag_policy:
  require: [static]
  allow_static_only: true
publish:
  registry: {registry}
  repository: {repository}
  tag: "{{cell_id}}"
  aliases: []
"""


def write_fault_matrix(root: Path, engines: dict[str, dict[str, str]],
                       registry: str | None = None, repository: str = "im17-fault",
                       min_free_gib: float = 0.1) -> Path:
    """matrix.yaml + templates/ under `root`; `engines`: name -> env (FAULT_SLEEP, ...);
    `min_free_gib`: build.disk's (a tiny cell: 0.1; the fault tests' tmpfs holds 900 MB).
    Each engine has one cell, `cpu-torch2.13.0-<name>1.0-cpu`, tagged `<repository>:<cell>`
    (tags are never moved: a test that changes a cell's image changes the repository)."""
    from infermatrix.config import load_matrix

    base = load_matrix(TEST_MATRIX).bases["definitions"]["bookworm"]
    definitions = "\n".join(
        f"  {name}: {json.dumps({'package': None, 'platform': 'cpu', 'kernels': [], 'serve': ['true'], 'env': env})}"
        for name, env in engines.items())
    root.mkdir(parents=True, exist_ok=True)
    (root / "matrix.yaml").write_text(MATRIX.format(
        engines=", ".join(f'"{n}==1.0"' for n in engines), definitions=definitions,
        base=json.dumps(base), registry=json.dumps(registry), repository=repository,
        min_free_gib=min_free_gib))
    shutil.copytree(TEMPLATES, root / "templates", dirs_exist_ok=True)
    locks = root / "locks"  # build refuses a cell without its committed lock
    locks.mkdir(exist_ok=True)
    for name in engines:
        (locks / f"{cell_id(name)}.txt").write_text(
            f"# infermatrix lock for cell {cell_id(name)}: a fault fixture; its Dockerfile installs "
            "nothing from it (it writes a stand-in torch of the pinned version)\ntorch==2.13.0\n",
            encoding="utf-8")
    return root / "matrix.yaml"


def cell_id(name: str) -> str:
    return f"cpu-torch2.13.0-{name}1.0-cpu"


def remove_images(docker, cells: list[str], repositories: list[str]) -> None:  # an Engine
    """Untag what a fault test made on the machine's engine (its build refs and tags)."""
    for cell in cells:
        docker.remove_image(f"infermatrix-local/{cell}:build", force=True)
        for repository in repositories:
            docker.remove_image(f"{repository}:{cell}", force=True)
