"""The kernel cache shared through a registry, for real: the real Docker engine builds a kernel
cell in state directory A, which compiles its kernel and pushes the wheel to a real registry
(Debian's docker-registry, distribution 2.8, htpasswd auth on loopback), signed with the
builder's key by the real cosign; state directory B's build of the same cell, trusting that
key, takes the wheel from the registry and compiles nothing. A wheel signed by another key, or
unsigned (a different wheel pushed under the key with a recomputed record by someone holding
only the registry password) is not taken: the build compiles and says why. And a registry
that does not answer costs a compile and a warning, never the build.

The cell is test_build.py's `mini` cell (a tiny "kernel" compiled by its `kernel-minik` stage on
the test matrix's debootstrap base): what build does around a kernel stage is the same for
flash-attn, in seconds. Pure logic and refusals: tests/unit/kernels/test_kernelregistry.py.
"""

from __future__ import annotations

import dataclasses
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
from infermatrix.engine import artifacts, cosign
from tests.support.registry_support import free_port, start_registry
from tests.docker.test_build import MATRIX, MINI, write_cell
from tests.docker.test_signing_registry import make_keys

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.registry]

USER, PASSWORD = "kernels", "pw-" + uuid.uuid4().hex[:12]
KEY_PASSWORD = "kernel-key-" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    server = start_registry(tmp_path_factory.mktemp("kernel-registry"), USER, PASSWORD)
    yield server.host
    server.stop()


@pytest.fixture
def credentials(monkeypatch):
    monkeypatch.setenv("INFERMATRIX_REGISTRY_USER", USER)
    monkeypatch.setenv("INFERMATRIX_REGISTRY_PASSWORD", PASSWORD)
    for name in (cosign.KEY_ENV, cosign.KEY_FILE_ENV, cosign.PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def builder_keys(tmp_path_factory):
    """The trusted builder's key pair and a stranger's (cosign generate-key-pair)."""
    root = tmp_path_factory.mktemp("kernel-keys")
    return {"builder": make_keys(root / "builder", KEY_PASSWORD),
            "stranger": make_keys(root / "stranger", KEY_PASSWORD)}


def signing_as(env, keys: tuple[Path, Path]) -> None:
    env.setenv(cosign.KEY_FILE_ENV, str(keys[0]))
    env.setenv(cosign.PASSWORD_ENV, KEY_PASSWORD)


def with_cache_settings(matrix: Path, name: str, **settings) -> Path:
    """A copy of `matrix` beside it (the same images/ directory) with kernel_cache settings."""
    data = yaml.safe_load(matrix.read_text())
    data["build"]["kernel_cache"].update(settings)
    path = matrix.with_name(name)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


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
    result = build_cells(ctx, ctx.specs(plans), RunOptions(), echo=echoed.append,
                         docker=DOCKER)[plans[0].id]
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
        cell_root, credentials, registry, builder_keys):
    cell_root = with_cache_settings(cell_root, "matrix-trusting.yaml",
                                    trusted_keys=[str(builder_keys["builder"][1])])
    signing_as(credentials, builder_keys["builder"])
    a = Context.load(cell_root, cell_root.parent.parent / "state-a")
    built, kernel_a, commands_a, _ = build_in(a)
    assert kernel_a["registry"]["signed"] is True and "cosign sign" in commands_a
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

    credentials.delenv(cosign.KEY_FILE_ENV)  # B needs no private key, only the public one
    b = Context.load(cell_root, cell_root.parent.parent / "state-b")
    result, kernel_b, commands_b, echoed = build_in(b)
    assert kernel_b["cache"] == "registry" and kernel_b["source"] == "registry"
    assert kernel_b["compile"] == {} and kernel_b["key"] == kernel_a["key"]
    assert kernel_b["registry"]["pulled"] == reference
    assert "--target kernel-minik" not in commands_b  # no compile in B
    assert "cosign verify --key " + str(builder_keys["builder"][1]) in commands_b
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



def test_only_a_wheel_signed_by_a_trusted_builder_is_taken(cell_root, credentials, registry,
                                                           builder_keys, tmp_path):
    """Builders push (matrix-builder.yaml); consumers only pull (matrix-consumer.yaml, push
    false, so what they compile does not replace what is under test). Both trust the builder's
    key alone."""
    trusted = [str(builder_keys["builder"][1])]
    builder = with_cache_settings(cell_root, "matrix-builder.yaml", trusted_keys=trusted)
    consumer = with_cache_settings(cell_root, "matrix-consumer.yaml", trusted_keys=trusted,
                                   push=False)
    state = cell_root.parent.parent

    def compiled_saying(matrix: Path, name: str, words: str) -> dict:
        _, kernel, commands, echoed = build_in(Context.load(matrix, state / name))
        assert kernel["cache"] == "miss" and "--target kernel-minik" in commands, kernel
        assert words in kernel["registry"]["miss"], kernel["registry"]
        assert any(words in line and "compiling it" in line for line in echoed), echoed
        return kernel

    # 1. a stranger's key signs what it pushes: not taken
    signing_as(credentials, builder_keys["stranger"])
    first = compiled_saying(builder, "state-a", "is not in the registry")
    assert first["registry"]["signed"] is True
    credentials.delenv(cosign.KEY_FILE_ENV)
    refused = compiled_saying(consumer, "state-b",
                              "no signature of it verifies against a trusted builder key")
    # 2. the trusted builder's key: taken
    signing_as(credentials, builder_keys["builder"])
    compiled_saying(builder, "state-c", "no signature of it verifies")
    credentials.delenv(cosign.KEY_FILE_ENV)
    _, taken, commands, _ = build_in(Context.load(consumer, state / "state-d"))
    assert taken["cache"] == "registry" and "--target kernel-minik" not in commands
    # 3. someone with the registry password only: another wheel under the same key, its record
    # recomputed to match (the key inputs kept, the wheel's sha256 recomputed), pushed unsigned
    reference = taken["registry"]["pulled"]
    repository, tag = reference.rsplit(":", 1)
    creds = registry_api_creds()
    genuine = artifacts.pull_artifact(repository, tag,
                                      artifacts.ArtifactKind(kernelregistry.RECORD_TYPE),
                                      _fresh(tmp_path / "genuine"), creds)
    evil = _fresh(tmp_path / "evil") / genuine.files[0].name
    evil.write_bytes(b"not the wheel the builder compiled")
    record = json.loads(genuine.record)
    record["sha256"] = {evil.name: artifacts.sha256_file(evil)}
    pushed = artifacts.push_artifact(repository, tag, kernelregistry.record_bytes(record),
                                     kernelregistry.RECORD_TYPE,
                                     [(evil, kernelregistry.WHEEL_TYPE)], creds)
    assert pushed != genuine.digest
    compiled_saying(consumer, "state-e", "unsigned: the registry holds no signature of it")
    e = Context.load(consumer, state / "state-e")
    assert b"not the wheel" not in only_wheel(e).read_bytes()
    print("\n".join(["", "kernel refusals:", refused["registry"]["miss"],
                      kernel_miss(Context.load(consumer, state / "state-e"))]))


def registry_api_creds():
    from infermatrix.engine import registry as registries

    return registries.RegistryCredentials(USER, PASSWORD, "test")


def kernel_miss(ctx: Context) -> str:
    plans = plan_matrix(ctx)
    return journal.load(ctx.state, plans[0].id)["stages"]["build"]["details"]["kernels"][
        "minik"]["registry"]["miss"]


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_layer_types_and_size_caps_are_checked_before_anything_is_kept(registry, tmp_path):
    """On the real registry: an artifact whose layer is not a kernel wheel, or whose blob is
    over the cap, is a RegistryError and leaves no file; one within both comes back whole."""
    from infermatrix.errors import RegistryError

    creds = registry_api_creds()
    repository = f"{registry}/t{uuid.uuid4().hex[:8]}/kernels/minik"
    wheel = _fresh(tmp_path / "wheel") / "minik-1.0-py3-none-any.whl"
    wheel.write_bytes(b"w" * 4096)
    record = kernelregistry.record_bytes({"wheels": [wheel.name]})
    artifacts.push_artifact(repository, "typed", record, kernelregistry.RECORD_TYPE,
                            [(wheel, "application/vnd.oci.image.layer.v1.tar")], creds)
    artifacts.push_artifact(repository, "wheel", record, kernelregistry.RECORD_TYPE,
                            [(wheel, kernelregistry.WHEEL_TYPE)], creds)
    wheels = artifacts.ArtifactKind(kernelregistry.RECORD_TYPE,
                                    frozenset({kernelregistry.WHEEL_TYPE}), 1 << 20, 1 << 20)
    with pytest.raises(RegistryError, match="not one of"):
        artifacts.pull_artifact(repository, "typed", wheels, _fresh(tmp_path / "a"), creds)
    assert list((tmp_path / "a").iterdir()) == []
    with pytest.raises(RegistryError, match="over the cap of 1024"):
        artifacts.pull_artifact(repository, "wheel", dataclasses.replace(
            wheels, max_file_bytes=1024), _fresh(tmp_path / "b"), creds)
    assert [p.name for p in (tmp_path / "b").iterdir()] == []  # the record is removed too
    pulled = artifacts.pull_artifact(repository, "wheel", wheels, _fresh(tmp_path / "c"), creds)
    assert pulled.files[0].read_bytes() == wheel.read_bytes()
