"""`infermatrix smoke --image`: a given image is recorded as such and never tagged (the smoke and
tag CLIs' usage errors: tests/unit/stages/test_smoke_cli.py)."""

from __future__ import annotations

import pytest

from infermatrix.cli import main
from tests.conftest import TEST_MATRIX


@pytest.mark.docker
def test_smoke_of_a_given_image_is_recorded_as_such_and_never_tagged(docker_available,
                                                                     built_base, tmp_path,
                                                                     capsys):
    """`smoke --image` tests an image made elsewhere as the cell's (the H200 run of
    docs/h200-gpu-level-container.txt): the journal says where the image came from, a missing
    image is a usage error naming the engine, and `tag` refuses the cell (no build of its own)."""
    import json

    cell = "cu130-torch2.13.0-kernel-fixture1.0-sm90"
    args = ["--matrix", str(TEST_MATRIX), "--state-dir", str(tmp_path), "--offline"]
    assert main(["smoke", *args, cell, "--image", "infermatrix-test/no-such:image",
                 "--levels", "gpu"]) == 2
    assert "no such image in engine" in capsys.readouterr().err
    assert main(["smoke", *args, cell, "--image", built_base, "--levels", "gpu"]) == 0
    said = capsys.readouterr()
    assert "gpu    skip" in said.out + said.err  # no GPU on this machine: the level says so
    smoke = json.loads((tmp_path / "journal" / f"{cell}.json").read_text())["stages"]["smoke"]
    assert smoke["details"]["image_source"] == f"--image {built_base}"
    assert main(["tag", *args, cell]) == 1
    said = capsys.readouterr()
    assert "not tagged: not built" in said.out + said.err
