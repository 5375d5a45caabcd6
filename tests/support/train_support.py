"""A copy of the test matrix (tests/matrix/) with a cell of its own whose fixture kernel
cudakern is training-only (`profile: train`): the small cell that has a serving image without
the kernel and a `train` target with it (issue 47). Its own cell id (engine `train-fixture`, the
kernel-fixture engine under another name, with the kernel-fixture cell's lock) keeps its local
image tags apart from the test matrix's cells, which other tests build on the same engine.
Used by the unit and the Docker tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.paths import REPO

TEST_MATRIX_DIR = REPO / "tests" / "matrix"
SOURCE_CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm120"
TRAIN_CELL = "cu130-torch2.13.0-train-fixture1.0-sm120"
CUDAKERN_ENTRY = "    cudakern:\n      package: cudakern\n"
ENGINES = "engines:\n"
INCLUDE = "include:\n"
TRAIN_ENGINE = """\
  train-fixture:
    package: null
    platform: cuda
    kernels: [cudakern]
    serve: [python3, -c, "import cudakern; print(cudakern.library_path())"]
"""


def train_matrix(root: Path) -> Path:
    """tests/matrix/ copied under `root`, cudakern given `profile: train`, the train-fixture
    cell added with its lock; its matrix.yaml."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(TEST_MATRIX_DIR / "locks", root / "locks")
    lock = (root / "locks" / f"{SOURCE_CELL}.txt").read_text().replace(SOURCE_CELL, TRAIN_CELL)
    (root / "locks" / f"{TRAIN_CELL}.txt").write_text(lock)
    text = (TEST_MATRIX_DIR / "matrix.yaml").read_text()
    text = text.replace("path: ../fixtures/cudakern", f"path: {REPO / 'tests/fixtures/cudakern'}")
    for part in (CUDAKERN_ENTRY, ENGINES, INCLUDE):
        assert text.count(part) == 1, f"tests/matrix/matrix.yaml: {part!r} moved"
    text = text.replace(CUDAKERN_ENTRY, CUDAKERN_ENTRY + "      profile: train\n")
    text = text.replace(ENGINES, ENGINES + TRAIN_ENGINE)
    text = text.replace(INCLUDE, INCLUDE + '  - {cuda: "13.0", torch: "2.13.0", '
                        'engine: "train-fixture==1.0", arch: sm_120}\n')
    (root / "matrix.yaml").write_text(text)
    return root / "matrix.yaml"
