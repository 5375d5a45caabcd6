"""A copy of the test matrix (tests/matrix/) whose fixture kernel cudakern is training-only
(`profile: train`), with the committed locks: the small cell that has a serving image without
the kernel and a `train` target with it (issue 47). Used by the unit and the Docker tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.paths import REPO

TEST_MATRIX_DIR = REPO / "tests" / "matrix"
TRAIN_CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm120"
CUDAKERN_ENTRY = "    cudakern:\n      package: cudakern\n"


def train_matrix(root: Path) -> Path:
    """tests/matrix/ copied under `root`, cudakern given `profile: train`; its matrix.yaml."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(TEST_MATRIX_DIR / "locks", root / "locks")
    text = (TEST_MATRIX_DIR / "matrix.yaml").read_text()
    text = text.replace("path: ../fixtures/cudakern", f"path: {REPO / 'tests/fixtures/cudakern'}")
    assert CUDAKERN_ENTRY in text, "tests/matrix/matrix.yaml: the cudakern entry moved"
    text = text.replace(CUDAKERN_ENTRY, CUDAKERN_ENTRY + "      profile: train\n", 1)
    (root / "matrix.yaml").write_text(text)
    return root / "matrix.yaml"
