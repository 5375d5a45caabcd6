"""The kernel cache shared through a registry, for real: the real Docker engine builds a kernel
cell in state directory A, which compiles its kernel and pushes the wheel to a real registry
(Debian's docker-registry, distribution 2.8, htpasswd auth on loopback); state directory B's
build of the same cell takes the wheel from the registry and compiles nothing. And a registry
that does not answer costs a compile and a warning, never the build.

The cell is test_build.py's `mini` cell (a tiny "kernel" compiled by its `kernel-minik` stage on
the test matrix's debootstrap base): what build does around a kernel stage is the same for
flash-attn, in seconds. Pure logic and refusals: tests/unit/kernels/test_kernelregistry.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from infermatrix.options import RunOptions
from infermatrix import journal
from infermatrix.context import Context, setup_command_log
from infermatrix.engine import docker as engine
from infermatrix.kernels import kernelcache, kernelregistry
from infermatrix.stages.build import build_cells, local_ref
from infermatrix.stages.plan import plan_matrix
from tests.support.registry_support import free_port, start_registry
from tests.docker.test_build import MATRIX, MINI, write_cell

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.registry]

USER, PASSWORD = "kernels", "pw-" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    server = start_registry(tmp_path_factory.mktemp("kernel-registry"), USER, PASSWORD)
    yield server.host
    server.stop()


@pytest.fixture
def credentials(monkeypatch):
    monkeypatch.setenv("INFERMATRIX_REGISTRY_USER", USER)
    monkeypatch.setenv("INFERMATRIX_REGISTRY_PASSWORD", PASSWORD)


def mini_matrix(root: Path, base_definition: dict, registry: str) -> Path:
    """test_build.py's matrix with one `mini` cell and the kernel cache on `registry`."""
    data = yaml.safe_load(MATRIX.replace("BASE_DEFINITION", json.dumps(base_definition)))
    data["axes"]["engine"] = ["mini==1.0"]
    data["build"]["disk"] = {"min_free_gib": 0}  # never prune a shared engine's cache
    data["build"]["kernel_cache"] = {"registry": registry, "repository": "t" + uuid.uuid4().hex}
    root.mkdir(parents=True)
    (root / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root / "matrix.yaml"


def build_in(ctx: Context):
    """Build the one cell in `ctx`'s state directory; (its result, its journal kernel record,
    the external commands it logged, what it printed)."""
    setup_command_log(ctx.state)
    plans = plan_matrix(ctx)
    echoed: list[str] = []
    result = build_cells(ctx, ctx.specs(plans), RunOptions(), echo=echoed.append)[plans[0].id]
    assert result.status == "pass", result.summary()
    record = journal.load(ctx.state, plans[0].id)["stages"]["build"]["details"]["kernels"]
    return result, record["minik"], ctx.state.commands_log.read_text(), echoed


def only_wheel(ctx: Context) -> Path:
    entries = list(ctx.state.kernels.glob(f"*/{kernelcache.ENTRY_FILE}"))
    assert len(entries) == 1
    return next(entries[0].parent.glob("*.whl"))


@pytest.fixture
def cell_root(built_base, test_ctx, tmp_path, registry):
    definition = test_ctx.matrix.bases["definitions"]["bookworm"]
    ctx = Context.load(mini_matrix(tmp_path / "matrix", definition, registry),
                       tmp_path / "state-a")
    cell_id = plan_matrix(ctx)[0].id
    write_cell(ctx, cell_id, MINI.format(base=built_base, token=uuid.uuid4().hex, cell=cell_id))
    yield ctx.matrix.path
    DOCKER.remove_image(local_ref(cell_id), force=True)


def test_a_second_state_takes_the_wheel_from_the_registry_without_compiling(
        cell_root, credentials, registry):
    a = Context.load(cell_root, cell_root.parent.parent / "state-a")
    built, kernel_a, commands_a, _ = build_in(a)
    assert kernel_a["cache"] == "miss" and kernel_a["source"] == "compiled"
    assert "--target kernel-minik" in commands_a
    reference = kernel_a["registry"]["pushed"]
    assert "not in the registry" in kernel_a["registry"]["miss"]  # A looked there first

    # The artifact: an OCI manifest whose config is the build record, the wheel its layer.
    repository, tag = reference.rsplit(":", 1)
    assert kernel_a["key"].endswith("-" + tag)  # the tag is the key's digest
    name = repository.split("/", 1)[1]
    manifest = requests.get(f"http://{registry}/v2/{name}/manifests/{tag}", auth=(USER, PASSWORD),
                            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
                            timeout=30).json()
    assert manifest["config"]["mediaType"] == kernelregistry.RECORD_TYPE
    assert [layer["mediaType"] for layer in manifest["layers"]] == [kernelregistry.WHEEL_TYPE]

    b = Context.load(cell_root, cell_root.parent.parent / "state-b")
    result, kernel_b, commands_b, echoed = build_in(b)
    assert kernel_b["cache"] == "registry" and kernel_b["source"] == "registry"
    assert kernel_b["compile"] == {} and kernel_b["key"] == kernel_a["key"]
    assert kernel_b["registry"]["pulled"] == reference
    assert "--target kernel-minik" not in commands_b  # no compile in B
    assert f"# registry: GET http://{registry}/v2/{name}/manifests/{tag}" in commands_b
    assert PASSWORD not in commands_a + commands_b
    assert any("taken from the registry" in line for line in echoed)
    assert only_wheel(b).read_bytes() == only_wheel(a).read_bytes()
    assert json.loads((only_wheel(b).parent / kernelcache.ENTRY_FILE).read_text())[
        "details"]["source"] == "registry"
    assert DOCKER.image_labels(local_ref(result.cell_id))["io.infermatrix.cell"] == built.cell_id


def test_an_unreachable_registry_compiles_and_warns(cell_root, credentials):
    data = yaml.safe_load(cell_root.read_text())
    data["build"]["kernel_cache"]["registry"] = f"127.0.0.1:{free_port()}"  # nothing listens
    cell_root.write_text(yaml.safe_dump(data, sort_keys=False))
    c = Context.load(cell_root, cell_root.parent.parent / "state-c")
    _, kernel, commands, echoed = build_in(c)
    assert kernel["cache"] == "miss" and "--target kernel-minik" in commands
    assert "registry unreachable" in kernel["registry"]["miss"]
    assert kernel["registry"]["push_warning"].startswith("warning: kernel minik not pushed")
    assert sum("registry" in line for line in echoed) == 2  # one line each, pull and push

