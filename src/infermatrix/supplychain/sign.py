"""Signed verdicts: publish signs each pushed digest with cosign and attaches three attestations
(the test result, the CycloneDX SBOM, the SLSA v1 provenance); pull and deploy verify them
before an image runs.

Publish (`sign_entry`): the key comes from INFERMATRIX_COSIGN_KEY (the PEM) or
INFERMATRIX_COSIGN_KEY_FILE, its password from INFERMATRIX_COSIGN_PASSWORD (engine/cosign.py:
never from matrix.yaml, never in argv, a log, the journal or images.lock). Without a key the
cell is published unsigned, said on its line; pull and deploy then refuse it unless told to skip.
images.lock's `signing` records the key's fingerprint, the signature manifest and each
attestation's layer digest.

Verify (`verify_signatures`), against the consumer's public key: the signature covers the locked
digest; the test-result attestation verifies and says "passed" with every required level
passed; the SBOM and provenance attestations verify. Each refusal is one line and its fix
(SignatureError, exit 1): wrong key, unsigned, signature of another digest, missing or tampered
attestation, failed or insufficient verdict. `--skip-verify` skips it all, and says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..engine import cosign
from ..engine.docker import Engine
from ..journal import CellRecord
from ..engine import registry as registries
from ..errors import UsageError
from ..model.spec import CellSpec
from . import attest, sbom

if TYPE_CHECKING:
    from ..context import Context

SKIP_FLAG = "--skip-verify"
SignatureError = cosign.SignatureError


# --- publish -------------------------------------------------------------------------------

@dataclass
class Signer:
    key: cosign.SigningKey
    fingerprint: str | None
    cosign_version: str

    def describe(self) -> str:
        fp = f" {self.fingerprint[:19]}..." if self.fingerprint else ""
        return f"cosign {self.cosign_version}, {self.key.describe()}{fp}"


def signer_from_env() -> Signer | None:
    """The run's signer, or None when no key is configured (publish then does not sign)."""
    key = cosign.signing_key()
    if key is None:
        return None
    fingerprint = None if key.keyless else cosign.key_fingerprint(cosign.public_key_of(key))
    return Signer(key, fingerprint, cosign.version())


def predicates(ctx: Context, spec: CellSpec, image_id: str, record: CellRecord, docker: Engine
               ) -> dict[str, Any]:
    """name -> predicate of the three attestations of a cell's published image (read from
    `docker`, the engine that holds it); the SBOM's pins from the run's CellSpec's lock."""
    cell = spec.cell
    try:
        facts = docker.sdk().version()
        engine_facts = {"docker": facts.get("Version"), "api": facts.get("ApiVersion"),
                        "platform": f"{facts.get('Os')}/{facts.get('Arch')}"}
    except Exception:  # noqa: BLE001 - the facts are informative; the build happened
        engine_facts = {}
    return {
        "test-result": attest.test_result(record, cell),
        "sbom": json.loads(sbom.build_sbom(ctx, cell, image_id, record, spec.lock_text,
                                           docker)),
        "provenance": attest.provenance(
            record, cell, matrix_path=ctx.matrix.path, root=ctx.root,
            lock_path=spec.lock_path, cell_dir=ctx.cell_dir(cell.id), engine_facts=engine_facts),
    }


def sign_entry(ctx: Context, signer: Signer, entry: dict[str, Any], record: CellRecord,
               spec: CellSpec, creds: registries.RegistryCredentials, docker: Engine
               ) -> dict[str, Any]:
    """Sign the entry's digest, attach its attestations; images.lock's `signing` of it."""
    reference = entry["reference"]
    cell = spec.cell
    made = predicates(ctx, spec, entry["image_id"], record, docker)
    made["test-result"]["digest"] = entry["digest"]
    made["test-result"]["lock"] = attest.lock_statement(entry)  # what consumers act on
    cosign.sign(reference, signer.key, creds)
    for name, predicate_type in attest.PREDICATES.items():
        cosign.attest(reference, signer.key, creds, made[name], predicate_type)
    found = cosign.attached(entry["repository"], entry["digest"], creds)
    sbom_file = write_sbom_file(ctx.state.root, cell.id, made["sbom"])
    return {
        "signed": True, "sbom_file": sbom_file, "mode": signer.key.describe(),
        "key": signer.fingerprint,
        "cosign": signer.cosign_version,
        "signed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "signature": found["signature"], "attestations_manifest": found["attestations"],
        "attestations": {name: found["predicates"].get(kind)
                         for name, kind in attest.PREDICATES.items()},
        "verdict": made["test-result"]["verdict"],
        "statement": attest.statement_digest(made["test-result"]["lock"]),
    }


SBOM_DIR = "sbom"


def write_sbom_file(state_root: Path, cell_id: str, document: dict[str, Any]) -> str:
    """The attested SBOM beside the journal (`<state>/sbom/<cell>.cdx.json`, the report links
    it); its path relative to the state directory."""
    from ..names import inside
    from ..state import write_json_atomic

    path = inside(state_root / SBOM_DIR, f"{cell_id}.cdx.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, document)
    return f"{SBOM_DIR}/{path.name}"


def still_signed(old: dict[str, Any], entry: dict[str, Any], signer: Signer,
                 creds: registries.RegistryCredentials) -> bool:
    """Whether an unchanged digest already carries this key's signature and attestations (as
    images.lock recorded them, and still in the registry): then nothing is signed again."""
    signing = old.get("signing") or {}
    if old.get("digest") != entry["digest"] or signing.get("key") != signer.fingerprint or \
            not signing.get("signed"):
        return False
    if signing.get("statement") != attest.statement_digest(attest.lock_statement(entry)):
        return False  # the run block, labels or driver floor changed: sign what is true now
    found = cosign.attached(entry["repository"], entry["digest"], creds)
    return (found["signature"] == signing.get("signature") and
            found["attestations"] == signing.get("attestations_manifest"))


# --- verify --------------------------------------------------------------------------------

@dataclass
class VerifyOptions:
    public_key: Path | None = None
    skip: bool = False
    require_levels: list[str] | None = None  # None: the publisher's required levels
    tlog: bool = False


def verify_options(key: Path | None, skip: bool, require: str | None) -> VerifyOptions:
    """From pull's / deploy's flags (and INFERMATRIX_COSIGN_PUBLIC_KEY); exit 2 when there is
    no key to verify against and verification is not skipped."""
    levels = [lv.strip() for lv in require.split(",") if lv.strip()] if require else None
    if skip:
        return VerifyOptions(skip=True, require_levels=levels)
    import os
    keyless = cosign._truthy(os.environ.get(cosign.KEYLESS_ENV))
    path = cosign.public_key_path(key)
    if path is None and not keyless:
        raise UsageError("no public key to verify the image's signature against",
                         fix=f"pass --key cosign.pub (the publisher's public key) or set "
                         f"{cosign.PUBLIC_KEY_ENV}, or pass {SKIP_FLAG} to run it unverified")
    return VerifyOptions(public_key=path, require_levels=levels,
                         tlog=keyless or cosign._truthy(os.environ.get(cosign.TLOG_ENV)))


def _refuse(cell: str, what: str, fix: str, digest: str | None = None) -> SignatureError:
    """One line naming the cell, the digest and what did not match."""
    return SignatureError(f"{cell} ({digest}): {what}" if digest else f"{cell}: {what}",
                          fix=fix)


SIGN_FIX = ("publish it with a signing key (INFERMATRIX_COSIGN_KEY_FILE + "
            "INFERMATRIX_COSIGN_PASSWORD), or verify with the publisher's public key")


def _signature_problem(message: str) -> str:
    text = message.lower()
    if "no signatures found" in text or "no matching signatures: no signatures" in text:
        return "unsigned: the registry holds no signature of this digest"
    if "digest" in text and ("mismatch" in text or "does not match" in text or
                             "invalid or missing digest" in text):
        return "the signature is of another digest"
    if "invalid signature" in text or "no matching signatures" in text or \
            "verification" in text:
        return "no signature of this digest verifies against the key (wrong key, a " \
               "signature of another digest, or a tampered one)"
    return "the signature does not verify"


def skip_warning(entry: dict[str, Any]) -> str:
    return (f"warning: {entry.get('cell')} ({entry.get('reference')}) is NOT VERIFIED "
            f"({SKIP_FLAG}): neither its signature, its test result nor its serve command "
            "(images.lock's `run`, unsigned) was checked")


def verify_signatures(entry: dict[str, Any], options: VerifyOptions,
                      creds: registries.RegistryCredentials,
                      say: Callable[[str], None] = print) -> dict[str, Any]:
    """Check the signature and attestations of a locked digest, and that the signed statement
    is of the entry's cell and digest and says what the entry says (signed_entry); the
    verified predicates by name."""
    import sys

    cell, reference, digest = entry["cell"], entry["reference"], entry.get("digest")
    if options.skip:
        say(f"# verification SKIPPED ({SKIP_FLAG}): the signature and test results of "
            f"{reference} were not checked")
        print(skip_warning(entry), file=sys.stderr)
        return {}
    if not digest or reference != f"{entry.get('repository')}@{digest}":
        raise _refuse(cell, f"images.lock's reference {reference} is not its repository@digest "
                      f"({entry.get('repository')}@{digest})", RELOCK_FIX, digest)
    key_name = str(options.public_key) if options.public_key else "keyless identity"
    try:
        payloads = cosign.verify(reference, options.public_key, creds, options.tlog)
    except SignatureError as exc:
        raise _refuse(cell, f"{_signature_problem(str(exc))} (key {key_name}): "
                      f"{cosign.error_line(str(exc).split(': ', 1)[-1])}", SIGN_FIX,
                      digest) from None
    claimed = {((p.get("critical") or {}).get("image") or {}).get("docker-manifest-digest")
               for p in payloads if isinstance(p, dict)}
    if digest not in claimed:
        raise _refuse(cell, f"the signature is of another digest ({', '.join(map(str, claimed))}"
                      f", images.lock pins {digest})", SIGN_FIX, digest)
    verified: dict[str, Any] = {}
    for name, predicate_type in attest.PREDICATES.items():
        try:
            statements = cosign.verify_attestation(reference, options.public_key,
                                                   predicate_type, creds, options.tlog)
        except SignatureError as exc:
            raise _refuse(cell, f"missing or invalid {name} attestation ({predicate_type}): "
                          f"{str(exc).split(': ', 1)[-1]}",
                          "publish the cell again with the signing key (it attaches the "
                          "test result, SBOM and provenance)", digest) from None
        subjects = [s for s in statements
                    if any((sub.get("digest") or {}).get("sha256") ==
                           digest.split(":", 1)[1] for sub in s.get("subject") or [])]
        if not subjects:
            others = sorted({f"sha256:{(sub.get('digest') or {}).get('sha256')}"
                             for s in statements for sub in s.get("subject") or []})
            raise _refuse(cell, f"the {name} attestation is about another digest "
                          f"({', '.join(others) or 'none'})", "publish the cell again", digest)
        verified[name] = subjects[-1].get("predicate") or {}
    signed_entry(cell, entry, verified)  # the statement is of this cell, digest and entry
    problem = attest.verdict_problem(verified["test-result"], entry.get("image_id"),
                                     options.require_levels)
    if problem:
        raise _refuse(cell, problem, "run the required levels where they can run (a GPU host "
                      "for gpu/model), tag and publish again, or choose the levels you require "
                      "with --require-levels", digest)
    bom = verified["sbom"]
    if bom.get("bomFormat") != "CycloneDX" or \
            ((bom.get("metadata") or {}).get("component") or {}).get("version") != \
            entry.get("image_id"):
        raise _refuse(cell, "the SBOM attestation is not a CycloneDX document of this image",
                      "publish the cell again", digest)
    levels = verified["test-result"].get("levels") or {}
    passed = [n for n, lv in levels.items() if (lv or {}).get("status") == "pass"]
    how = "transparency log checked" if options.tlog else cosign.OFFLINE_NOTE
    say(f"# verified {reference}: signed by {key_name} ({how}); "
        f"test result {verified['test-result'].get('verdict')!r} (levels passed: "
        f"{', '.join(sorted(passed)) or 'none'}); SBOM and provenance attested")
    return verified


RELOCK_FIX = ("use the images.lock that publish wrote with this image (`git checkout "
              "images.lock`), or publish the cell again")


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


def statement_differences(entry: dict[str, Any], signed: dict[str, Any]) -> list[str]:
    """Each field (a dotted key inside `run` and `labels`) where images.lock's entry is not
    the signed statement, with both values: "run.env: images.lock {...}, signed {...}"."""
    found = []
    for name in attest.SIGNED_FIELDS:
        mine, theirs = entry.get(name), signed.get(name)
        if mine == theirs:
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict):
            for key in sorted(set(mine) | set(theirs), key=str):
                if mine.get(key) != theirs.get(key):
                    found.append(f"{name}.{key}: images.lock {_shown(mine.get(key))}, "
                                 f"signed {_shown(theirs.get(key))}")
        else:
            found.append(f"{name}: images.lock {_shown(mine)}, signed {_shown(theirs)}")
    return found


def signed_entry(requested: str, entry: dict[str, Any], verified: dict[str, Any]
                 ) -> dict[str, Any]:
    """The entry to act on: the signed statement of the verified test result (its `lock`),
    after checking that it is of the requested cell and of images.lock's digest and that
    images.lock says the same; a SignatureError naming both values otherwise."""
    digest = entry.get("digest")
    predicate = verified.get("test-result") or {}
    signed = predicate.get("lock")
    if not isinstance(signed, dict) or not signed.get("run"):
        raise _refuse(requested, "the test-result attestation signs no serve command (`run`): "
                      "published by an infermatrix that did not sign it", "publish the cell "
                      "again with this version of infermatrix", digest)
    for what, value in (("the signed statement", signed.get("cell")),
                        ("the test result", predicate.get("cell"))):
        if value != requested:
            raise _refuse(requested, f"{what} is for cell {value}, not {requested} (an "
                          f"images.lock entry of another cell under this name?)", RELOCK_FIX,
                          digest)
    if signed.get("digest") != digest or predicate.get("digest") != digest:
        raise _refuse(requested, f"the signed statement is of digest {signed.get('digest')}, "
                      f"images.lock pins {digest}", RELOCK_FIX, digest)
    differences = statement_differences(entry, signed)
    if differences:
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        raise _refuse(requested, f"images.lock differs from the signed statement: "
                      f"{differences[0]}{more}", RELOCK_FIX, digest)
    return {**entry, **signed, "reference": f"{entry['repository']}@{signed['digest']}"}


def verified_entry(requested: str, entry: dict[str, Any], options: VerifyOptions,
                   creds: registries.RegistryCredentials,
                   say: Callable[[str], None] = print) -> dict[str, Any]:
    """What pull, deploy and verify act on: the signed statement of `entry`, verified against
    the consumer's key and the requested cell; images.lock's entry as it is (and said to be
    unverified) with --skip-verify."""
    if entry.get("cell") != requested:
        raise _refuse(requested, f"images.lock's entry under {requested} is for cell "
                      f"{entry.get('cell')}", RELOCK_FIX, entry.get("digest"))
    verified = verify_signatures(entry, options, creds, say)
    if options.skip:
        return {**entry, "verified_by": None}
    return {**signed_entry(requested, entry, verified), "verified_by": str(
        options.public_key) if options.public_key else "keyless identity"}
