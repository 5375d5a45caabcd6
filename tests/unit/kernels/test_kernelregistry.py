"""The kernel cache shared through a registry, without Docker: the artifact's manifest, the
settings, the record and its checks (a record of another key, a wheel of another hash), and the
wiring of pull and push around recording fakes of the registry calls. The real push and pull
are tests/docker/test_kernelcache_registry.py."""

from __future__ import annotations

from tests.paths import TESTS

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from infermatrix.config import load_matrix
from infermatrix.engine import artifacts
from infermatrix.engine.registry import RegistryUnreachable
from infermatrix.errors import ConfigError
from infermatrix.kernels import kernelcache as kc
from infermatrix.kernels import kernelregistry as kr
from infermatrix.state import StatePaths

TEST_MATRIX = TESTS / "matrix" / "matrix.yaml"
SPEC = {"package": "flash-attn", "version": "2.8.3"}
WHEEL = "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl"


def make_key(**changes) -> kc.KernelKey:
    args = dict(torch="2.13.0", cuda="13.0", python="3.11", archs=["sm_120"], stage_text="S")
    return kc.make_key(SPEC, **{**args, **changes})


@pytest.fixture
def entry(tmp_path) -> kc.CachedKernel:
    wheel = tmp_path / "out" / WHEEL
    wheel.parent.mkdir()
    wheel.write_bytes(b"compiled wheel bytes")
    return kc.store(StatePaths.at(tmp_path / "a"), make_key(), [wheel],
                    details={"compiled_by": "cell-a", "stats": {"seconds": 3412}})


# --- the manifest ---------------------------------------------------------------------------

def test_manifest_is_an_oci_image_manifest_with_the_record_as_config(tmp_path):
    record = b'{"key": {}}'
    wheel = tmp_path / WHEEL
    wheel.write_bytes(b"wheel")
    config = artifacts.describe_bytes(record, kr.RECORD_TYPE)
    layer = artifacts.describe_file(wheel, kr.WHEEL_TYPE)
    manifest = json.loads(artifacts.manifest_bytes(config, [layer]))
    assert manifest == {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": kr.RECORD_TYPE, "size": len(record),
                   "digest": "sha256:" + hashlib.sha256(record).hexdigest()},
        "layers": [{"mediaType": kr.WHEEL_TYPE, "size": 5,
                    "digest": "sha256:" + hashlib.sha256(b"wheel").hexdigest(),
                    "annotations": {"org.opencontainers.image.title": WHEEL}}]}
    assert "artifactType" not in manifest and "subject" not in manifest  # no OCI 1.1
    assert artifacts.manifest_bytes(config, [layer]) == artifacts.manifest_bytes(config, [layer])


@pytest.mark.parametrize("title", ["", "../evil.whl", "/etc/passwd", "a/b.whl", ".hidden"])
def test_a_layer_is_saved_only_under_a_bare_name(title):
    with pytest.raises(ValueError):
        artifacts.layer_file_name({"digest": "sha256:0", "annotations": {artifacts.TITLE: title}})


# --- settings -------------------------------------------------------------------------------

def _matrix(tmp_path: Path, kernel_cache: dict | None, repository: str = "infermatrix-test"):
    data = yaml.safe_load(TEST_MATRIX.read_text())
    data["publish"]["repository"] = repository
    if kernel_cache is not None:
        data["build"]["kernel_cache"] = kernel_cache
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_matrix(path)


def test_off_without_a_registry(tmp_path):
    assert kr.shared_cache(_matrix(tmp_path, None)) is None
    assert kr.shared_cache(_matrix(tmp_path, {"registry": None})) is None


def test_repository_defaults_to_publish_and_the_tag_is_the_key_digest(tmp_path):
    shared = kr.shared_cache(_matrix(tmp_path, {"registry": "127.0.0.1:5000/acme/"}))
    key = make_key()
    assert shared == kr.SharedCache("127.0.0.1:5000/acme/", "infermatrix-test", True)
    assert shared.reference(key) == ("127.0.0.1:5000/acme/infermatrix-test/kernels/flash-attn:"
                                     + key.digest)
    other = kr.shared_cache(_matrix(tmp_path, {"registry": "ghcr.io", "repository": "x/y",
                                               "push": False}))
    assert other == kr.SharedCache("ghcr.io", "x/y", False)
    package = kc.KernelKey("FlashInfer_Python", "1", "2", "13.0", "3.11", ("sm_120",))
    assert other.repository_for(package) == "ghcr.io/x/y/kernels/flashinfer-python"


@pytest.mark.parametrize("settings", [{"registry": "no-host-here"}, {"registry": "ghcr.io",
                                                                      "repository": "Bad Name"},
                                      {"registry": "ghcr.io", "pull": True}])
def test_bad_settings_are_config_errors(tmp_path, settings):
    with pytest.raises(ConfigError):
        _matrix(tmp_path, settings)


# --- the record and its checks --------------------------------------------------------------

def test_the_record_is_the_entry_json_with_each_wheels_sha256(entry):
    record = kr.record_of(entry)
    assert record == json.loads((entry.directory / kc.ENTRY_FILE).read_text())
    assert record["key"] == entry.key.as_dict() and record["wheels"] == [WHEEL]
    assert record["sha256"] == {WHEEL: hashlib.sha256(b"compiled wheel bytes").hexdigest()}
    assert record["details"]["stats"] == {"seconds": 3412}
    assert kr.artifact_refusal(record, entry.key, entry.wheels) is None


def test_an_old_entry_without_hashes_gets_them_in_its_record(entry):
    marker = entry.directory / kc.ENTRY_FILE
    old = json.loads(marker.read_text())
    del old["sha256"]
    marker.write_text(json.dumps(old))
    assert kr.record_of(entry)["sha256"] == {WHEEL: artifacts.sha256_file(entry.wheels[0])}


def test_a_record_of_another_key_is_refused_naming_the_input(entry):
    record = kr.record_of(entry)
    why = kr.artifact_refusal(record, make_key(torch="2.12.0"), entry.wheels)
    assert why and "torch: '2.13.0' != '2.12.0'" in why
    forged = dict(record, key={**record["key"], "archs": ["sm_90"]})  # the slug kept: still no
    why = kr.artifact_refusal(forged, entry.key, entry.wheels)
    assert why and "archs: ['sm_90'] != ['sm_120']" in why


def test_a_wheel_of_another_hash_or_name_is_refused(entry, tmp_path):
    record = kr.record_of(entry)
    tampered = tmp_path / "pulled" / WHEEL
    tampered.parent.mkdir()
    tampered.write_bytes(b"other bytes")
    why = kr.artifact_refusal(record, entry.key, [tampered])
    assert why and f"{WHEEL} hashes to {hashlib.sha256(b'other bytes').hexdigest()}" in why
    renamed = tmp_path / "pulled" / "other-1.0-py3-none-any.whl"
    renamed.write_bytes(b"compiled wheel bytes")
    assert "not the ones its record names" in (
        kr.artifact_refusal(record, entry.key, [renamed]) or "")
    assert kr.artifact_refusal({**record, "sha256": {}}, entry.key, entry.wheels)


@pytest.mark.parametrize("damage", [[], "text", {"key": "x"}, {"sha256": ["x"]},
                                    {"wheels": WHEEL}, {"wheels": None}])
def test_a_malformed_record_is_refused_not_raised(entry, damage):
    record = damage if not isinstance(damage, dict) else {**kr.record_of(entry), **damage}
    assert kr.artifact_refusal(record, entry.key, entry.wheels)


# --- pull and push wiring, around recording fakes of the registry calls -------------------------

class FakeRegistryRecording:
    """Stands in for engine.artifacts' push/pull; records the calls, holds pushed artifacts."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.calls: list[tuple[str, str, str]] = []
        self.held: dict[str, tuple[bytes, list[tuple[str, bytes]]]] = {}

    def push_artifact(self, repository, tag, record, record_type, files, creds):
        self.calls.append(("push", repository, tag))
        if self.fail:
            raise self.fail
        assert record_type == kr.RECORD_TYPE and {t for _, t in files} == {kr.WHEEL_TYPE}
        self.held[f"{repository}:{tag}"] = (record, [(p.name, p.read_bytes()) for p, _ in files])
        return "sha256:" + "1" * 64

    def pull_artifact(self, repository, tag, kind, dest, creds):
        self.calls.append(("pull", repository, tag))
        assert kind == kr.KERNEL_ARTIFACT
        if self.fail:
            raise self.fail
        if f"{repository}:{tag}" not in self.held:
            return None
        record, files = self.held[f"{repository}:{tag}"]
        for name, data in files:
            (dest / name).write_bytes(data)
        return artifacts.Artifact("sha256:" + "2" * 64, record, [dest / n for n, _ in files])


SHARED = kr.SharedCache("127.0.0.1:5000", "infermatrix", trusted_keys=("builder.pub",))


def FAKE_SIGNATURE_ACCEPTED(repository, digest, trusted_keys, creds):
    """Stands in for the cosign check of the artifact's signature (the real one, and each of
    its refusals: tests/docker/test_kernelcache_registry.py): accepts what a key is trusted."""
    return None if trusted_keys else "no builder keys are trusted"


@pytest.fixture
def fake_registry(monkeypatch):
    monkeypatch.setenv("INFERMATRIX_REGISTRY_USER", "u")
    monkeypatch.setenv("INFERMATRIX_REGISTRY_PASSWORD", "p")
    for name in ("INFERMATRIX_COSIGN_KEY", "INFERMATRIX_COSIGN_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)  # pushed unsigned here
    fake = FakeRegistryRecording()
    monkeypatch.setattr(artifacts, "push_artifact", fake.push_artifact)
    monkeypatch.setattr(artifacts, "pull_artifact", fake.pull_artifact)
    monkeypatch.setattr(kr, "signature_refusal", FAKE_SIGNATURE_ACCEPTED)
    return fake


def test_pushed_then_pulled_into_another_state(entry, fake_registry, tmp_path):
    said: list[str] = []
    note = kr.push(SHARED, entry, said.append)
    assert {k: note[k] for k in ("pushed", "digest", "signed")} == {
        "pushed": SHARED.reference(entry.key), "digest": "sha256:" + "1" * 64, "signed": False}
    assert note["sign_warning"].startswith("warning: kernel flash-attn pushed UNSIGNED")
    other = StatePaths.at(tmp_path / "b")
    (other.root / "tmp").mkdir(parents=True)
    pulled, note = kr.pull(other, SHARED, entry.key, other.root / "tmp", said.append)
    assert pulled is not None and pulled.wheels[0].read_bytes() == b"compiled wheel bytes"
    assert pulled.details["source"] == "registry" and pulled.details["compiled_by"] == "cell-a"
    assert note["pulled"] == SHARED.reference(entry.key) and note["compiled_by"] == "cell-a"
    assert kc.lookup(other, entry.key) is not None
    assert [c[0] for c in fake_registry.calls] == ["push", "pull"]


def test_a_tampered_artifact_is_refused_and_nothing_is_stored(entry, fake_registry, tmp_path):
    kr.push(SHARED, entry, print)
    reference = SHARED.reference(entry.key)
    record, _ = fake_registry.held[reference]
    fake_registry.held[reference] = (record, [(WHEEL, b"evil bytes")])
    other = StatePaths.at(tmp_path / "b")
    (other.root / "tmp").mkdir(parents=True)
    said: list[str] = []
    pulled, note = kr.pull(other, SHARED, entry.key, other.root / "tmp", said.append)
    assert pulled is None and kc.lookup(other, entry.key) is None
    assert "refused" in note["miss"] and "hashes to" in note["miss"] and len(said) == 1


def test_without_trusted_builder_keys_no_wheel_is_taken(tmp_path):
    """The real check (no fake): with no builder key trusted, nothing is asked of cosign or
    the registry's signatures; the build compiles and says why."""
    assert kr.signature_refusal("r/x", "sha256:" + "1" * 64, (), None).startswith(
        "no builder keys are trusted (build.kernel_cache.trusted_keys)")
    shared = kr.shared_cache(_matrix(tmp_path, {"registry": "127.0.0.1:5000",
                                                "trusted_keys": ["keys/builder.pub", "/k.pub"]}))
    assert shared.trusted_keys == (str(tmp_path / "keys" / "builder.pub"), "/k.pub")


def test_a_missing_artifact_or_unreachable_registry_is_one_line_and_no_failure(
        entry, fake_registry, tmp_path):
    state = StatePaths.at(tmp_path / "b")
    (state.root / "tmp").mkdir(parents=True)
    said: list[str] = []
    assert kr.pull(state, SHARED, entry.key, state.root / "tmp", said.append)[0] is None
    fake_registry.fail = RegistryUnreachable("reading x: registry unreachable (anonymous)")
    pulled, note = kr.pull(state, SHARED, entry.key, state.root / "tmp", said.append)
    assert pulled is None and "registry unreachable" in note["miss"]
    assert len(said) == 2 and all("compiling it" in line for line in said)


def test_a_failed_push_is_a_warning(entry, fake_registry):
    fake_registry.fail = RegistryUnreachable("uploading blob: registry unreachable")
    said: list[str] = []
    note = kr.push(SHARED, entry, said.append)
    assert note["push_warning"].startswith("warning: kernel flash-attn not pushed")
    assert said == [note["push_warning"]]
    assert kr.push(kr.SharedCache("127.0.0.1:5000", push=False), entry, said.append) == {}
