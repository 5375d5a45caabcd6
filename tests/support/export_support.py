"""The test matrix (tests/matrix/) copied for the export tests, unit and Docker alike, with one
cell pruned by its recorded lock."""

from __future__ import annotations

import shutil
from pathlib import Path

from infermatrix.context import Context
from infermatrix.stages import lock

from tests.paths import TESTS

SM121 = "cu130-torch2.13.0-kernel-fixture1.0-sm121"
LOCK_PRUNED = "cu130-torch2.13.0-kernel-fixture2.0-sm120"  # its last lock found no solution
AMD64_PLATFORMS = "platforms: {sm_121: linux/amd64}"


def copy_matrix(tmp_path: Path, sm121_platform: str = "linux/amd64") -> Path:
    """tests/matrix/ and its locks in a temp dir; `sm121_platform` as the matrix maps sm_121."""
    shutil.copytree(TESTS / "matrix", tmp_path / "matrix",
                    ignore=shutil.ignore_patterns("images"))
    (tmp_path / "fixtures").symlink_to(TESTS / "fixtures")  # kernel `path: ../fixtures/...`
    path = tmp_path / "matrix" / "matrix.yaml"
    text = path.read_text()
    assert AMD64_PLATFORMS in text  # the edit below must change something
    path.write_text(text.replace(AMD64_PLATFORMS, f"platforms: {{sm_121: {sm121_platform}}}"))
    return path


def context_with_pruned_cell(matrix: Path, offline: bool = False) -> Context:
    ctx = Context.load(matrix, matrix.parent.parent / "state", offline=offline)
    lock.record(ctx, lock.LockResult(LOCK_PRUNED, "unsatisfiable", explanation="no solution: x"))
    return ctx
