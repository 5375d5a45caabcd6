"""Render with PyPI: the committed images/ match a fresh render of the shipped matrix, and the
hash-checked sdist command fetches only the pinned file (render's unit tests:
tests/unit/stages/test_render.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infermatrix.stages import render
from tests.paths import REPO

SIX_SDIST_SHA256 = "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926"


@pytest.mark.network
def test_committed_images_match_a_fresh_render_of_the_shipped_matrix() -> None:
    result = subprocess.run([sys.executable, "-m", "infermatrix", "render", "--check",
                             "--matrix", str(REPO / "matrix.yaml")],
                            capture_output=True, text=True, cwd=REPO, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.network
def test_hash_checked_sdist_command_builds_only_the_pinned_file(tmp_path: Path) -> None:
    """The kernel stages' `pip wheel --require-hashes` line (macro sdist_wheel), run for real
    with a small PyPI sdist: the pinned file builds (the same bytes twice, with the fixed
    SOURCE_DATE_EPOCH), a wrong hash is refused."""
    from infermatrix.stages import lock

    venv = tmp_path / "venv"
    env = {**os.environ, **lock.uv_env()}
    subprocess.run([lock.uv_bin(), "venv", "-q", "--python", sys.executable, str(venv)],
                   check=True, env=env)
    subprocess.run([lock.uv_bin(), "pip", "install", "-q", "-p", str(venv),
                    *render.KERNEL_BUILD_TOOLS[:3]], check=True, env=env)
    macros = render.make_environment(render.TEMPLATES_DIR).get_template("blocks/macros.j2")

    def build(sha: str, run: str) -> subprocess.CompletedProcess:
        kernel = render.KernelSpec(name="six", package="six", version="1.16.0", recipe="wheel",
                                   source_dir=None, env={}, build_requires=(),
                                   wheel_glob="six-*.whl", sdist_sha256=sha)
        line = macros.module.sdist_wheel(kernel)
        assert "--require-hashes" in line and f"--hash=sha256:{sha}" in line
        line = (line.replace("/tmp/", f"{tmp_path}/{run}-").replace("/wheels", f"{tmp_path}/{run}")
                .replace("with-secrets pip ", f"{venv}/bin/pip "))
        return subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=False,
                              env={**env, "SOURCE_DATE_EPOCH": "1747699200"})

    for run in ("a", "b"):
        result = build(SIX_SDIST_SHA256, run)
        assert result.returncode == 0, result.stdout + result.stderr
    wheels = [sorted((tmp_path / run).glob("six-1.16.0-*.whl")) for run in ("a", "b")]
    assert len(wheels[0]) == 1 and wheels[0][0].read_bytes() == wheels[1][0].read_bytes()
    refused = build("0" * 64, "c")
    assert refused.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr
    assert not list((tmp_path / "c").glob("*.whl"))
