"""Signed verdicts end to end with real parts: Debian's cosign (provisioned by .ci/provision), a
real docker-registry with htpasswd auth on loopback and the real Docker engine. A key pair is made
here with `cosign generate-key-pair`; publish signs the pushed digest and attaches the test
result, the CycloneDX SBOM and the SLSA provenance; the image is removed locally; `pull`
verifies and pulls it by digest and `deploy` writes its Compose file. Then each refusal is one
line and exit 1: the wrong key, an unsigned digest, a signature copied from another digest, a
"built, not verified" test result, an insufficient verdict, a tampered SBOM and a missing
attestation. No private key or password is left in the state directory, the command log, the
journal, the report, images.lock, the registry's blobs or any layer of the image.

The images are tiny rootfs tarballs labelled as cells of tests/matrix/matrix.yaml (as in
test_publish_registry.py), with a dpkg status file and the CPU cell's real lock beside the
matrix."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from infermatrix import journal
from infermatrix.cli import main
from infermatrix.engine import cosign
from infermatrix.engine import docker as engine
from infermatrix.engine import registry as registry_api
from infermatrix.stages import publish
from infermatrix.supplychain import attest, sbom
from tests.support.registry_support import start_registry
from tests.docker.test_publish_registry import CPU_CELL, GPU_CELL, TEST_MATRIX, labels_for

# This machine's Docker engine (DOCKER_HOST / the current context), passed by hand.
DOCKER = engine.Engine()

pytestmark = [pytest.mark.docker, pytest.mark.registry]

USER, PASSWORD = "signer", "pw-" + uuid.uuid4().hex[:12]
KEY_PASSWORD = "key-" + uuid.uuid4().hex
DPKG_STATUS = """Package: base-files
Status: install ok installed
Architecture: amd64
Version: 12.4+deb12u13

Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u13

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""


def make_keys(directory: Path, password: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run([cosign.binary(), "generate-key-pair", "--output-key-prefix",
                    str(directory / "cosign")], check=True, capture_output=True,
                   env={**os.environ, "COSIGN_PASSWORD": password})
    return directory / "cosign.key", directory / "cosign.pub"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if not DOCKER.available():
        pytest.skip("needs a running Docker engine")
    server = start_registry(tmp_path_factory.mktemp("registry"), USER, PASSWORD)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    good = make_keys(root / "publisher", KEY_PASSWORD)
    other = make_keys(root / "stranger", "other-" + KEY_PASSWORD)
    return {"private": good[0], "public": good[1], "other_public": other[1]}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    work = tmp_path_factory.mktemp("images")
    suffix = uuid.uuid4().hex[:8]
    made: dict[str, str] = {}
    for key, cell_id in [("cpu", CPU_CELL), ("gpu", GPU_CELL)]:
        rootfs = work / key
        (rootfs / "var/lib/dpkg").mkdir(parents=True)
        (rootfs / "var/lib/dpkg/status").write_text(DPKG_STATUS)
        (rootfs / "CELL").write_text(f"{cell_id} {suffix}\n")
        tar_path = work / f"{key}.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(rootfs, arcname=".")
        changes = [f"LABEL {k}={v!r}".replace("'", '"') for k, v in labels_for(cell_id).items()]
        made[key] = DOCKER.import_rootfs(tar_path, f"infermatrix-test/signing:{key}-{suffix}",
                                         changes=changes)
    yield made
    for info in DOCKER.sdk().api.images():
        if info["Id"] in made.values():
            for ref in (info.get("RepoTags") or []) + (info.get("RepoDigests") or []):
                DOCKER.remove_image(ref, force=True)


def context_dir(tmp_path: Path, registry_host: str, repository: str) -> Path:
    """matrix.yaml (the test matrix, publishing to the test registry) with the CPU cell's lock."""
    data = yaml.safe_load(TEST_MATRIX.read_text())
    data["publish"] = {"registry": registry_host, "repository": repository, "tag": "{cell_id}"}
    for kernel in data["build"]["kernels"].values():
        if "path" in kernel:
            kernel["path"] = str((TEST_MATRIX.parent / kernel["path"]).resolve())
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "locks").mkdir(exist_ok=True)
    shutil.copy(TEST_MATRIX.parent / "locks" / f"{CPU_CELL}.txt", tmp_path / "locks")
    return tmp_path


def mark_passed(state_root: Path, cell_id: str, image_id: str, kind: str = "tested") -> None:
    """What build, audit, smoke and tag leave for a cell whose required levels passed (or,
    kind static-only, whose tag says "built, not verified")."""
    from infermatrix.state import StatePaths

    state = StatePaths.at(state_root)
    journal.record_stage(state, cell_id, "build", "pass", image_id=image_id, duration_s=12.0,
                         details={"kernels": {}, "build_args": {"MAX_JOBS": "2"}})
    journal.record_stage(state, cell_id, "audit", "pass", details={
        "checks": [{"name": "pins", "status": "pass", "detail": "169 pinned packages"}]})
    model = {"status": "pass" if kind == "tested" else "skip", "reason": None,
             "duration_s": 30.0}
    levels = {"static": {"status": "pass", "reason": None, "duration_s": 2.0},
              "gpu": {"status": "skip", "reason": "CPU lane", "applicable": False},
              "model": model}
    journal.record_stage(state, cell_id, "smoke", "pass", details={
        "image_id": image_id, "levels": levels, "host_gpu": False})
    journal.record_stage(state, cell_id, "tag", "pass", details={
        "image_id": image_id, "tagged_image_id": image_id, "kind": kind,
        "policy": {"require": ["static", "gpu", "model"], "allow_static_only": True}})


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "empty-docker-config"))
    (tmp_path / "empty-docker-config").mkdir()
    monkeypatch.setenv(registry_api.REGISTRY_USER_ENV, USER)
    monkeypatch.setenv(registry_api.REGISTRY_PASSWORD_ENV, PASSWORD)
    for name in (cosign.KEY_ENV, cosign.KEY_FILE_ENV, cosign.PASSWORD_ENV,
                 cosign.PUBLIC_KEY_ENV, cosign.KEYLESS_ENV, cosign.TLOG_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def publish_cli(root: Path, cell: str, lock: Path, capsys) -> str:
    code = main(["publish", "--matrix", str(root / "matrix.yaml"), "--state-dir",
                 str(root / "state"), "--select", cell, "--lock", str(lock), "--wait"])
    said = capsys.readouterr()  # the step's lines are on stderr
    assert code == 0, said.out + said.err
    return said.out + said.err


def one_line(err: str) -> str:
    """The one error line and its `  fix:` line (errors.py's form), as one string."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) in (1, 2) and "Traceback" not in err, err
    assert len(lines) == 1 or lines[1].startswith("  fix: "), err
    return " ".join(lines)


def pull(lock: Path, cell: str, key: Path | None, capsys, *extra: str) -> tuple[int, str, str]:
    argv = ["pull", cell, "--lock", str(lock), "--skip-host-check", *extra]
    if key is not None:
        argv += ["--key", str(key)]
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def http(registry_host: str, method: str, path: str, **kwargs) -> requests.Response:
    return requests.request(method, f"http://{registry_host}/v2/{path}", auth=(USER, PASSWORD),
                            timeout=30, **kwargs)


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def secrets_of(private_key: Path) -> list[str]:
    """The strings that must never be written anywhere: both passwords, the encrypted key's
    PEM body (every line of it) and the registry password's Basic-auth token."""
    body = [ln for ln in private_key.read_text().splitlines() if ln and "-----" not in ln]
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return [PASSWORD, KEY_PASSWORD, token, *[ln for ln in body if len(ln) > 20]]


def assert_no_secret_in(paths: list[Path], secrets: list[str]) -> int:
    checked = 0
    for root in paths:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in files:
            data = path.read_bytes()
            checked += 1
            for secret in secrets:
                assert secret.encode() not in data, f"a secret is in {path}"
    return checked


def test_signed_publish_pull_deploy_and_every_refusal(tmp_path, registry, images, keys, env,
                                                      capsys):
    repo = f"signing-{uuid.uuid4().hex[:6]}"
    root = context_dir(tmp_path / "publisher", registry.host, repo)
    lock = root / "images.lock"
    mark_passed(root / "state", CPU_CELL, images["cpu"])
    mark_passed(root / "state", GPU_CELL, images["gpu"])

    # 1. publish the GPU cell unsigned (no key): said, and recorded as unsigned
    out = publish_cli(root, GPU_CELL, lock, capsys)
    assert "UNSIGNED" in out and "--skip-verify" in out
    assert publish.read_images_lock(lock)["images"][GPU_CELL]["signing"] is None

    # 2. publish the CPU cell signed: key from a file, its password from the environment
    env.setenv(cosign.KEY_FILE_ENV, str(keys["private"]))
    env.setenv(cosign.PASSWORD_ENV, KEY_PASSWORD)
    out = publish_cli(root, CPU_CELL, lock, capsys)
    assert "signing: cosign" in out and "offline" in out and f"({CPU_CELL}, signed)" in out
    entry = publish.read_images_lock(lock)["images"][CPU_CELL]
    signing = entry["signing"]
    assert signing["signed"] and signing["verdict"] == attest.PASSED
    assert signing["key"] == cosign.key_fingerprint(keys["public"].read_text())
    assert signing["signature"]["tag"].endswith(cosign.attached_tag(entry["digest"], "sig"))
    assert set(signing["attestations"]) == {"test-result", "sbom", "provenance"}
    assert all(d and d.startswith("sha256:") for d in signing["attestations"].values())
    # the lock records what the registry holds
    assert http(registry.host, "HEAD", f"{repo}/manifests/{signing['signature']['digest']}",
                headers={"Accept": OCI_MANIFEST}).status_code == 200
    # the SBOM publish attested: valid CycloneDX listing the lock's packages with its hashes
    document = (root / "state" / signing["sbom_file"]).read_text()
    assert sbom.validation_error(document) is None
    components = json.loads(document)["components"]
    locked = sbom.lock_packages((root / "locks" / f"{CPU_CELL}.txt").read_text())
    by_ref = {c["bom-ref"]: c for c in components}
    for pkg in locked:
        component = by_ref[f"pypi:{pkg.name.lower()}@{pkg.version}"]
        assert sorted(h["content"] for h in component["hashes"]) == sorted(pkg.hashes)
    assert "deb:libc6@2.36-9+deb12u13:amd64" in by_ref and not any(
        "removed-one" in ref for ref in by_ref)
    # a second publish of the unchanged digest keeps its signature (nothing signed again)
    out = publish_cli(root, CPU_CELL, lock, capsys)
    assert "unchanged" in out
    assert publish.read_images_lock(lock)["images"][CPU_CELL]["signing"] == signing

    # 3. remove every local copy; pull verifies, then pulls by digest
    DOCKER.remove_image(images["cpu"], force=True)
    assert DOCKER.inspect_image(images["cpu"]) is None
    env.delenv(cosign.KEY_FILE_ENV)
    env.delenv(cosign.PASSWORD_ENV)
    code, out, err = pull(lock, CPU_CELL, keys["public"], capsys)
    assert code == 0, err
    assert f"# verified {entry['reference']}" in out and "'passed'" in out and "offline" in out
    assert (DOCKER.inspect_image(entry["reference"]) or {}).get("Id") == images["cpu"]
    assert entry["reference"] in out.strip().splitlines()[-1]  # the docker run line

    # 4. deploy verifies too, then writes the Compose file by digest
    models = tmp_path / "models"
    models.mkdir()
    deploy_out = tmp_path / "deploy"
    env.setenv(cosign.PUBLIC_KEY_ENV, str(keys["public"]))  # the key from the environment
    code = main(["deploy", CPU_CELL, "--matrix", str(root / "matrix.yaml"), "--lock", str(lock),
                 "--cpu-lane", "1", "--model-dir", str(models), "--out", str(deploy_out)])
    out = capsys.readouterr().out
    assert code == 0 and "# verified" in out
    compose = yaml.safe_load((deploy_out / "compose.yaml").read_text())
    assert all(s["image"] == entry["reference"] for s in compose["services"].values())
    env.delenv(cosign.PUBLIC_KEY_ENV)

    # 5. refusals: one line, exit 1 each
    code, out, err = pull(lock, CPU_CELL, keys["other_public"], capsys)  # the wrong key
    assert code == 1 and "verifies against the key" in one_line(err), err
    code, out, err = pull(lock, GPU_CELL, keys["public"], capsys)  # unsigned
    assert code == 1 and "unsigned" in one_line(err), err
    code, out, err = pull(lock, CPU_CELL, keys["public"], capsys, "--require-levels", "gpu")
    line = one_line(err)  # an insufficient verdict for what this consumer requires
    assert code == 1 and "required level 'gpu'" in line, err
    # a signature copied from another digest: the CPU digest's signature put on the GPU digest
    gpu_entry = publish.read_images_lock(lock)["images"][GPU_CELL]
    sig_tag = cosign.attached_tag(entry["digest"], "sig")
    sig = http(registry.host, "GET", f"{repo}/manifests/{sig_tag}",
               headers={"Accept": OCI_MANIFEST})
    assert sig.status_code == 200
    put = http(registry.host, "PUT",
               f"{repo}/manifests/{cosign.attached_tag(gpu_entry['digest'], 'sig')}",
               data=sig.content, headers={"Content-Type": OCI_MANIFEST})
    assert put.status_code == 201, put.text
    code, out, err = pull(lock, GPU_CELL, keys["public"], capsys)
    line = one_line(err)
    assert code == 1 and "another digest" in line, err
    # without a key and without the skip flag: a usage error; with the flag: said, and pulled
    code, out, err = pull(lock, GPU_CELL, None, capsys)
    assert code == 2 and "--skip-verify" in one_line(err)
    code, out, err = pull(lock, GPU_CELL, None, capsys, "--skip-verify", "--no-pull")
    assert code == 0 and "not verified" in out
    code, out, err = pull(lock, GPU_CELL, None, capsys, "--skip-verify")
    assert code == 0 and "verification SKIPPED (--skip-verify)" in out, err

    # a tampered SBOM: its statement changed in the attestation manifest, the signature kept
    att_tag = cosign.attached_tag(entry["digest"], "att")
    att = http(registry.host, "GET", f"{repo}/manifests/{att_tag}",
               headers={"Accept": OCI_MANIFEST})
    manifest = att.json()
    layer = next(x for x in manifest["layers"]
                 if x["annotations"]["predicateType"] == attest.SBOM_TYPE)
    envelope = http(registry.host, "GET", f"{repo}/blobs/{layer['digest']}").json()
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["components"] = statement["predicate"]["components"][1:]
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    blob = json.dumps(envelope).encode()
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    location = http(registry.host, "POST", f"{repo}/blobs/uploads/").headers["Location"]
    url = f"http://{registry.host}{location}" if location.startswith("/") else location
    done = requests.put(url + ("&" if "?" in url else "?") + f"digest={digest}", data=blob,
                        auth=(USER, PASSWORD), timeout=30,
                        headers={"Content-Type": "application/octet-stream"})
    assert done.status_code == 201, done.text
    layer["digest"], layer["size"] = digest, len(blob)
    put = http(registry.host, "PUT", f"{repo}/manifests/{att_tag}",
               data=json.dumps(manifest).encode(), headers={"Content-Type": OCI_MANIFEST})
    assert put.status_code == 201, put.text
    code, out, err = pull(lock, CPU_CELL, keys["public"], capsys)
    line = one_line(err)
    assert code == 1 and "invalid sbom attestation" in line, err
    # a missing attestation: the attestation manifest deleted
    current = http(registry.host, "HEAD", f"{repo}/manifests/{att_tag}",
                   headers={"Accept": OCI_MANIFEST}).headers["Docker-Content-Digest"]
    assert http(registry.host, "DELETE", f"{repo}/manifests/{current}").status_code == 202
    code, out, err = pull(lock, CPU_CELL, keys["public"], capsys)
    line = one_line(err)
    assert code == 1 and "missing or invalid test-result attestation" in line, err

    # 6. the report shows the signing status and links the SBOM
    code = main(["report", "--matrix", str(root / "matrix.yaml"), "--state-dir",
                 str(root / "state")])
    report_err = capsys.readouterr().err
    assert code == 0, report_err
    markdown = (root / "state" / "reports" / "report.md").read_text()
    assert "### Signing" in markdown and "published unsigned" in markdown
    assert f"../{signing['sbom_file']}" in markdown
    html = (root / "state" / "reports" / "report.html").read_text()
    assert signing["attestations"]["sbom"] in html

    # 7. no secret anywhere: state dir (journal, commands.log, report, SBOM), images.lock,
    # the deployment, the registry's blobs, and the image's layers and history
    secrets = secrets_of(keys["private"])
    checked = assert_no_secret_in([root, deploy_out, registry.root / "data"], secrets)
    assert checked > 10
    assert (root / "state" / "commands.log").is_file()
    log = (root / "state" / "commands.log").read_text()
    assert "cosign sign" in log and "COSIGN_PASSWORD='***'" in log and "--tlog-upload=false" in log
    history = subprocess.run(["/usr/bin/docker", "history", "--no-trunc", images["cpu"]],
                             capture_output=True, text=True, check=True).stdout
    inspect = json.dumps(DOCKER.inspect_image(images["cpu"]))
    for secret in secrets:
        assert secret not in history and secret not in inspect


def test_static_only_verdict_is_refused_and_key_from_env(tmp_path, registry, images, keys, env,
                                                         capsys):
    """A test result that says "built, not verified" is refused, although it is signed; the key
    comes from INFERMATRIX_COSIGN_KEY (the PEM itself) this time."""
    repo = f"signing-static-{uuid.uuid4().hex[:6]}"
    root = context_dir(tmp_path / "publisher", registry.host, repo)
    lock = root / "images.lock"
    mark_passed(root / "state", CPU_CELL, images["cpu"], kind="static-only")
    env.setenv(cosign.KEY_ENV, keys["private"].read_text())
    env.setenv(cosign.PASSWORD_ENV, KEY_PASSWORD)
    out = publish_cli(root, CPU_CELL, lock, capsys)
    assert f"({CPU_CELL}, signed)" in out
    assert publish.read_images_lock(lock)["images"][CPU_CELL]["signing"]["verdict"] == \
        attest.NOT_VERIFIED
    env.delenv(cosign.KEY_ENV)
    code, out, err = pull(lock, CPU_CELL, keys["public"], capsys)
    line = one_line(err)
    assert code == 1 and "'built, not verified'" in line, err
    assert_no_secret_in([root], secrets_of(keys["private"]))


def test_a_bad_signing_setting_stops_publish_before_any_push(tmp_path, registry, images, env,
                                                              capsys):
    repo = f"signing-bad-{uuid.uuid4().hex[:6]}"
    root = context_dir(tmp_path / "publisher", registry.host, repo)
    mark_passed(root / "state", CPU_CELL, images["cpu"])
    env.setenv(cosign.KEY_FILE_ENV, str(tmp_path / "no-such.key"))
    env.setenv(cosign.PASSWORD_ENV, KEY_PASSWORD)
    code = main(["publish", "--matrix", str(root / "matrix.yaml"), "--state-dir",
                 str(root / "state"), "--lock", str(root / "images.lock")])
    err = capsys.readouterr().err
    assert code == 2 and cosign.KEY_FILE_ENV in one_line(err) and KEY_PASSWORD not in err
    assert not (root / "images.lock").exists()
