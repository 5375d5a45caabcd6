"""A debootstrap base built for real and imported into the engine: python and its labels
(the unit tests of stages/base.py are tests/unit/stages/test_base.py)."""

from __future__ import annotations

import pytest

from infermatrix.engine import docker as engine
from infermatrix.stages import base

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()


@pytest.mark.docker
@pytest.mark.network
def test_built_base_has_python_and_its_labels(built_base, test_ctx, tmp_path):
    labels = DOCKER.image_labels(built_base)
    recipe = base.recipe_for(test_ctx.matrix, "bookworm")
    assert built_base == recipe.ref == base.image_ref(test_ctx.matrix, "bookworm")
    assert labels["io.infermatrix.base.suite"] == "bookworm"
    assert labels["io.infermatrix.base.mirror"] == recipe.mirror
    assert labels["io.infermatrix.base.recipe"] == recipe.digest
    assert "python3-venv" in labels["io.infermatrix.base.packages"].split(",")
    copied = DOCKER.copy_from_image(built_base, ["/usr/bin/python3", "/etc/debian_version"],
                                    tmp_path)
    assert "/usr/bin/python3" in copied
    assert (tmp_path / "debian_version").read_text().startswith("12.")
    # Building again finds the tag: nothing is done.
    again = base.build_base(test_ctx.matrix, "bookworm", test_ctx.state, docker=DOCKER)
    assert not again.built and again.ref == built_base
