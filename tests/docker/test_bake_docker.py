"""The exported bake file, run for real by `docker buildx bake` (issue 19): it builds the
same images as `infermatrix build`.

buildx is Debian trixie's docker-buildx 0.13.1, which .ci/provision unpacks into
/opt/infermatrix-buildx/cli-plugins (INFERMATRIX_BUILDX overrides); it runs here through a
Docker config of the test's own whose cli-plugins/ links to it, on the machine's engine
(buildx's `docker` driver: the daemon's BuildKit). The cells are the fault matrix's
(tests/support/fault_support.py). bake builds first, from nothing (fresh tokens), under tags of its
own; then `infermatrix build` builds the same cells: same image ids, or, where they differ,
the same config (labels, env, command) and the same files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from infermatrix.cli import main
from infermatrix.engine import docker as engine
from infermatrix.scale import export
from infermatrix.stages import plan_cells
from infermatrix.stages.render import render_cells

from tests.support.export_support import SM121, context_with_pruned_cell, copy_matrix
from tests.support.fault_support import cell_id, remove_images, write_fault_matrix

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BUILDX = Path(os.environ.get("INFERMATRIX_BUILDX", "/opt/infermatrix-buildx")) / "cli-plugins" \
    / "docker-buildx"
CONFIG_KEYS = ("Labels", "Env", "Cmd", "Entrypoint", "WorkingDir", "User")


def infermatrix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infermatrix", *args], capture_output=True,
                          text=True, timeout=900)


def files_of(image: str) -> list[tuple[str, int, int, str]]:
    """(path, mode, size, link target) of every file in the image (times left out)."""
    with DOCKER.exported_filesystem(image) as stream, \
            tarfile.open(fileobj=_Reader(stream), mode="r|") as archive:
        return sorted((m.name, m.mode, m.size, m.linkname) for m in archive)


class _Reader:
    """A file object over the export's chunks (tarfile's stream mode reads from it)."""

    def __init__(self, chunks) -> None:
        self.chunks, self.buffer = iter(chunks), b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.buffer) < size:
            chunk = next(self.chunks, None)
            if chunk is None:
                break
            self.buffer += chunk
        data, self.buffer = (self.buffer, b"") if size < 0 else \
            (self.buffer[:size], self.buffer[size:])
        return data


def test_bake_builds_the_images_infermatrix_build_builds(built_base, tmp_path: Path) -> None:
    if not BUILDX.is_file():
        pytest.fail(f"{BUILDX} missing: run .ci/provision (docker-buildx from Debian trixie)")
    config = tmp_path / "docker-config"
    (config / "cli-plugins").mkdir(parents=True)
    (config / "cli-plugins" / "docker-buildx").symlink_to(BUILDX)
    names = ["golf", "hotel"]
    cells = [cell_id(n) for n in names]
    repository = f"im19-bake-{uuid.uuid4().hex[:8]}"
    matrix = write_fault_matrix(tmp_path / "m", {n: {"FAULT_TOKEN": uuid.uuid4().hex}
                                                 for n in names}, repository=repository)
    state = tmp_path / "state"
    common = ["--matrix", str(matrix), "--state-dir", str(state)]
    baked = {c: f"{repository}:{c}-bake" for c in cells}
    try:
        assert infermatrix("render", *common).returncode == 0
        bake_file = tmp_path / "bake" / "docker-bake.json"
        exported = infermatrix("export", "bake", *common, "--out", str(bake_file))
        assert exported.returncode == 0, exported.stderr
        targets = json.loads(bake_file.read_text())["target"]
        assert sorted(t["tags"][0] for t in targets.values()) == \
            sorted(f"infermatrix-local/{c}:build" for c in cells)
        overrides = [a for name, target in targets.items() for a in (
            "--set", f"{name}.tags={baked[target['tags'][0].split('/')[1].split(':')[0]]}")]
        bake = subprocess.run(["/usr/bin/docker", "buildx", "bake", "--progress=plain", "-f",
                               bake_file.name, *overrides], cwd=bake_file.parent,
                              capture_output=True, text=True, timeout=900,
                              env={**os.environ, "DOCKER_CONFIG": str(config)})
        print(bake.stderr[-1500:])
        assert bake.returncode == 0, bake.stderr[-4000:]
        build = infermatrix("build", *common)
        assert build.returncode == 0, build.stderr[-3000:]
        journal = {c: json.loads((state / "journal" / f"{c}.json").read_text()) for c in cells}
        for cell in cells:
            from_bake = DOCKER.inspect_image(baked[cell])
            from_build = DOCKER.inspect_image(journal[cell]["image_id"])
            assert from_bake and from_build
            same_id = from_bake["Id"] == from_build["Id"]
            print(f"{cell}: bake {from_bake['Id'][:19]} build {from_build['Id'][:19]} "
                  f"({'the same image' if same_id else 'two images'})")
            if not same_id:
                for key in CONFIG_KEYS:
                    assert from_bake["Config"].get(key) == from_build["Config"].get(key), key
                assert files_of(from_bake["Id"]) == files_of(from_build["Id"])
            labels = from_bake["Config"]["Labels"]
            assert labels["io.infermatrix.cell"] == cell
            assert labels["io.infermatrix.input-hash"] == \
                journal[cell]["stages"]["build"]["details"]["input_hash"]
    finally:
        remove_images(engine.Engine(), cells, [repository])
        for ref in baked.values():
            DOCKER.remove_image(ref, force=True)


def test_cli_bake_sizes_args_as_build_and_leaves_out_unrendered(tmp_path, monkeypatch,
                                                               capsys) -> None:
    """`export bake` sizes each target's build args as `build` does (the flags given here) and
    leaves out a planned cell with no rendered Dockerfile. Here and not in tests/unit: the
    bake's input-hash label reads the base images' ids from the engine, as `build` does."""
    matrix = copy_matrix(tmp_path)
    ctx = context_with_pruned_cell(matrix, offline=True)
    plans = plan_cells(ctx)
    render_cells(ctx, plans)
    shutil.rmtree(ctx.images_dir / SM121)
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    out = tmp_path / "bake" / "docker-bake.json"
    code = main(["export", "bake", "--offline", "--matrix", str(matrix), "--state-dir",
                 str(ctx.state.root), "--out", str(out), "--max-jobs", "3",
                 "--nvcc-threads", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"{SM121} left out: not rendered" in captured.err
    targets = json.loads(out.read_text())["target"]
    cells = {p.id for p in plans if p.planned} - {SM121}
    assert set(targets) == {export.bake_target_name(c) for c in cells}
    for name, target in targets.items():
        assert target["args"] == {"MAX_JOBS": "3", "NVCC_THREADS": "1"}
        assert target["secret"] == [f"id=ca_bundle,src={bundle.resolve()}"]
        assert (out.parent / target["context"]).resolve() == \
            (ctx.images_dir / target["tags"][0].split("/")[1].split(":")[0]).resolve()
