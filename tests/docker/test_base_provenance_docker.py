"""Provenance true to the build (issue 44) on the real Docker engine: the base a Dockerfile
builds FROM is read from the engine as the build sees it; a base rebuilt under the same tag
(another image id) changes the cell's input hash, so `build` does not call the cell unchanged.
The bases are tiny rootfs imports (`docker import`), removed at the end."""

from __future__ import annotations

import tarfile
import uuid
from pathlib import Path

import pytest

from infermatrix.engine import docker as engine
from infermatrix.stages import build

DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker]


def import_base(work: Path, ref: str, content: str) -> str:
    rootfs = work / uuid.uuid4().hex
    rootfs.mkdir(parents=True)
    (rootfs / "BASE").write_text(content)
    tar_path = rootfs.with_suffix(".tar")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(rootfs, arcname=".")
    return DOCKER.import_rootfs(tar_path, ref)


def test_a_base_rebuilt_under_its_tag_changes_the_input_hash(docker_available, tmp_path):
    ref = f"infermatrix-test/h44-base:{uuid.uuid4().hex[:8]}"
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {ref} AS toolchain\nFROM toolchain AS runtime\n")
    text = (context / "Dockerfile").read_text()
    made: list[str] = []
    try:
        made.append(import_base(tmp_path, ref, "first build of the base\n"))
        first = build.base_images(text, DOCKER)
        assert first == {ref: {"id": made[0], "digest": None}}
        hash_first = build.input_hash(context, {}, {}, first)
        assert build.input_hash(context, {}, {}, build.base_images(text, DOCKER)) == hash_first

        made.append(import_base(tmp_path, ref, "the base rebuilt: other packages\n"))
        assert made[1] != made[0]
        second = build.base_images(text, DOCKER)
        assert second[ref]["id"] == made[1]
        assert build.input_hash(context, {}, {}, second) != hash_first

        DOCKER.remove_image(ref, force=True)  # gone from the engine: BuildKit would pull it
        assert build.base_images(text, DOCKER) == {ref: {"id": None, "digest": None}}
    finally:
        for image_id in made:
            if DOCKER.inspect_image(image_id) is not None:
                DOCKER.remove_image(image_id, force=True)
