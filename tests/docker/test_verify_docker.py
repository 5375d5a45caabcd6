"""`infermatrix verify` of an image the engine does not hold: exit 2, and the fix is to pull it
(verify's usage errors: tests/unit/consumer/test_verify.py)."""

from __future__ import annotations

import pytest

from infermatrix.cli import main
from tests.unit.consumer.test_verify import CELL, lock_of_an_image_nobody_pulled


@pytest.mark.docker
def test_an_image_not_pulled_says_to_pull_it(docker_available, tmp_path, capsys):
    lock = lock_of_an_image_nobody_pulled(tmp_path)
    assert main(["verify", CELL, "--lock", str(lock), "--model-dir", str(tmp_path),
                 "--out", str(tmp_path / "v.json"), "--skip-verify"]) == 2
    assert f"run `infermatrix pull {CELL}` first" in capsys.readouterr().err
    assert not (tmp_path / "v.json").exists()
