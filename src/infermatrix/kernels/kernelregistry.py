"""The kernel cache shared through a registry (matrix.yaml `build.kernel_cache`).

A kernel wheel compiled and stored in the local cache (kernelcache.py) is pushed as an OCI
artifact `<registry>/<repository>/kernels/<package>:<key digest>`: its build record (the
entry's `entry.json`: the key's inputs, each wheel's sha256, the compile's seconds and peak
memory) is the config blob (RECORD_TYPE), each wheel a layer (engine/artifacts.py). A build whose
local cache lacks a key pulls that artifact first and takes it only when the record's key
inputs equal the key this build computed and every wheel hashes to the record's sha256; it is
then a local entry like a compiled one. No registry configured, no artifact, an unreachable
registry or a refused record: the build compiles as before, said in one line. A failed push is
a warning. Credentials are publish's (registry.credentials_for: environment or Docker's config).

Provenance (issue 44): a registry password must not be enough to supply a kernel. The builder
signs each pushed artifact's manifest digest with cosign (its key: INFERMATRIX_COSIGN_KEY /
_KEY_FILE, as publish signs); the manifest names the record (the full key inputs and each
wheel's sha256) and every wheel by digest, so the signature covers them all. A build takes an
artifact only when a signature of its digest verifies against one of the builder keys it trusts
(`build.kernel_cache.trusted_keys`: cosign public keys); none configured, an unsigned artifact
or one signed by another key: it compiles, and says why.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import Matrix
from ..engine import artifacts, cosign
from ..engine import registry as registries
from ..errors import InfermatrixError, SignatureError
from ..state import StatePaths
from . import kernelcache

RECORD_TYPE = "application/vnd.infermatrix.kernel.record.v1+json"
WHEEL_TYPE = "application/vnd.infermatrix.kernel.wheel.v1+zip"
DEFAULT_REPOSITORY = "infermatrix"
MAX_RECORD_BYTES = 1 << 20  # a build record is a few KiB
MAX_WHEEL_BYTES = 4 << 30  # a flash-attn wheel for several archs is under 1 GiB
KERNEL_ARTIFACT = artifacts.ArtifactKind(RECORD_TYPE, frozenset({WHEEL_TYPE}), MAX_RECORD_BYTES,
                                         MAX_WHEEL_BYTES)
SOURCE = "registry"  # what the journal says of a kernel taken from it


@dataclass(frozen=True)
class SharedCache:
    """Where kernel artifacts live: `<registry>/<repository>/kernels/<package>`."""
    registry: str  # host[:port][/path]
    repository: str = DEFAULT_REPOSITORY
    push: bool = True
    trusted_keys: tuple[str, ...] = ()  # cosign public keys of the builders whose wheels count

    def repository_for(self, key: kernelcache.KernelKey) -> str:
        package = re.sub(r"[^a-z0-9]+", "-", key.package.lower()).strip("-")
        return f"{self.registry.rstrip('/')}/{self.repository}/kernels/{package}"

    def reference(self, key: kernelcache.KernelKey) -> str:
        return f"{self.repository_for(key)}:{key.digest}"


def shared_cache(matrix: Matrix) -> SharedCache | None:
    """`build.kernel_cache` of the matrix; None (off) without a registry. The repository
    defaults to publish.repository."""
    settings = matrix.build.get("kernel_cache") or {}
    if not settings.get("registry"):
        return None
    repository = settings.get("repository") or matrix.publish.get("repository")
    keys = tuple(str(Path(k) if Path(k).is_absolute() else matrix.root / k)
                 for k in settings.get("trusted_keys") or [])
    return SharedCache(settings["registry"], repository or DEFAULT_REPOSITORY,
                       bool(settings.get("push", True)), keys)


# --- the record and its checks (pure) -------------------------------------------------------

def record_of(entry: kernelcache.CachedKernel) -> dict[str, Any]:
    """The build record pushed with the wheels: the entry's entry.json, with each wheel's
    sha256 (an entry stored before entry.json carried them gets them here)."""
    record = kernelcache.read_entry(entry)
    if not record.get("sha256"):
        record["sha256"] = {w.name: artifacts.sha256_file(w) for w in entry.wheels}
    return record


def record_bytes(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, indent=1).encode()


def _mapping(value: Any) -> dict[str, Any]:
    """A record's field that should be a JSON object; anything else reads as empty."""
    return value if isinstance(value, dict) else {}


def key_differences(record: dict[str, Any], key: kernelcache.KernelKey) -> list[str]:
    """The key inputs in which the record differs from this build's key, as `name: X != Y`."""
    theirs = _mapping(record.get("key"))
    ours = key.as_dict()
    return [f"{name}: {theirs.get(name)!r} != {ours.get(name)!r}"
            for name in sorted(set(ours) | set(theirs)) if theirs.get(name) != ours.get(name)]


def artifact_refusal(record: Any, key: kernelcache.KernelKey, wheels: list[Path]) -> str | None:
    """Why a pulled artifact may not be taken for `key`, or None: its record's key inputs must
    be this build's, its wheels the ones it names, each hashing to the record's sha256."""
    if not isinstance(record, dict):
        return "its record is not a JSON object"
    differences = key_differences(record, key)
    if differences:
        return "its record's key inputs are not this build's (" + "; ".join(differences) + ")"
    hashes = _mapping(record.get("sha256"))
    names = record.get("wheels")
    named = sorted(str(n) for n in names) if isinstance(names, list) else []
    if not named or named != sorted(w.name for w in wheels):
        return (f"its wheels {sorted(w.name for w in wheels)} are not the ones its record "
                f"names {named}")
    for wheel in wheels:
        actual = artifacts.sha256_file(wheel)
        if hashes.get(wheel.name) != actual:
            return (f"{wheel.name} hashes to {actual}, its record says "
                    f"{hashes.get(wheel.name)}")
    return None


# --- push and pull --------------------------------------------------------------------------

def push(shared: SharedCache, entry: kernelcache.CachedKernel, say: Callable[[str], None]
         ) -> dict[str, Any]:
    """Push a freshly compiled entry; the journal's note of it. A failure is a warning."""
    if not shared.push:
        return {}
    reference = shared.reference(entry.key)
    repository, tag = reference.rsplit(":", 1)
    try:
        creds = registries.credentials_for(repository)
        digest = artifacts.push_artifact(
            repository, tag, record_bytes(record_of(entry)), RECORD_TYPE,
            [(wheel, WHEEL_TYPE) for wheel in entry.wheels], creds)
    except (InfermatrixError, OSError) as exc:
        warning = f"warning: kernel {entry.key.package} not pushed to {reference}: {_one_line(exc)}"
        say(warning)
        return {"push_warning": warning}
    signed = sign_artifact(repository, digest, creds, say, entry.key.package)
    say(f"kernel {entry.key.package} pushed to {reference} ({digest}, "
        f"{'signed' if signed.get('signed') else 'UNSIGNED'})")
    return {"pushed": reference, "digest": digest, **signed}


def sign_artifact(repository: str, digest: str, creds: registries.RegistryCredentials,
                  say: Callable[[str], None], package: str) -> dict[str, Any]:
    """Sign a pushed artifact's manifest digest with the builder's key; the journal's note.
    No key, or a failed signing: a warning (builds that trust keys will not take it)."""
    try:
        key = cosign.signing_key()
        if key is None:
            warning = (f"warning: kernel {package} pushed UNSIGNED (no {cosign.KEY_ENV} / "
                       f"{cosign.KEY_FILE_ENV}): builds take only wheels signed by a key they "
                       "trust (build.kernel_cache.trusted_keys)")
            say(warning)
            return {"signed": False, "sign_warning": warning}
        cosign.sign(f"{repository}@{digest}", key, creds)
    except (InfermatrixError, OSError) as exc:
        warning = f"warning: kernel {package} pushed but not signed: {_one_line(exc)}"
        say(warning)
        return {"signed": False, "sign_warning": warning}
    return {"signed": True}


def signature_refusal(repository: str, digest: str, trusted_keys: tuple[str, ...],
                      creds: registries.RegistryCredentials) -> str | None:
    """Why an artifact's signature does not let a build take it, or None: a signature of its
    manifest digest must verify against one of the trusted builder keys."""
    if not trusted_keys:
        return ("no builder keys are trusted (build.kernel_cache.trusted_keys): a wheel is "
                "taken only when its signature verifies against one")
    problems = []
    for name in trusted_keys:
        try:
            public = cosign.public_key_path(Path(name))
            payloads = cosign.verify(f"{repository}@{digest}", public, creds)
        except (SignatureError, InfermatrixError) as exc:
            problems.append(_signature_reason(str(exc)))
            continue
        claimed = {((p.get("critical") or {}).get("image") or {}).get("docker-manifest-digest")
                   for p in payloads if isinstance(p, dict)}
        if digest in claimed:
            return None
        problems.append(f"its signature is of another digest ({', '.join(map(str, claimed))})")
    keys = ", ".join(Path(k).name for k in trusted_keys)
    return f"{digest}: {problems[0] if problems else 'no signature'} (trusted keys: {keys})"


def _signature_reason(message: str) -> str:
    text = message.lower()
    if "no signatures found" in text or "no matching signatures: no signatures" in text:
        return "unsigned: the registry holds no signature of it"
    if "no matching signatures" in text or "invalid signature" in text:
        return "no signature of it verifies against a trusted builder key"
    return " ".join(message.split())[:300]


def pull(state: StatePaths, shared: SharedCache, key: kernelcache.KernelKey, tmp_root: Path,
         say: Callable[[str], None]) -> tuple[kernelcache.CachedKernel | None, dict[str, Any]]:
    """(the local entry made from the registry's artifact for `key`, or None; the journal's
    note). Never raises for a miss: the caller compiles then."""
    reference = shared.reference(key)
    repository, tag = reference.rsplit(":", 1)
    started = time.monotonic()
    cosign.use_state_dir(state.root)  # cosign's registry credentials: <state>/secrets
    with tempfile.TemporaryDirectory(prefix="kernel-pull-", dir=tmp_root) as tmp:
        try:
            creds = registries.credentials_for(repository)
            artifact = artifacts.pull_artifact(repository, tag, KERNEL_ARTIFACT, Path(tmp), creds)
            if artifact is None:
                return _miss(say, key, f"{reference} is not in the registry")
            record = json.loads(artifact.record)
            refused = signature_refusal(repository, artifact.digest, shared.trusted_keys,
                                        creds) or artifact_refusal(record, key, artifact.files)
            if refused:
                return _miss(say, key, f"{reference} refused: {refused}")
            details = {**_mapping(record.get("details")), "source": SOURCE,
                       "pulled_from": f"{repository}@{artifact.digest}"}
            entry = kernelcache.store(state, key, artifact.files, details=details)
        except (InfermatrixError, OSError, ValueError) as exc:
            return _miss(say, key, f"{reference}: {_one_line(exc)}")
    say(f"kernel {key.package} taken from the registry: {repository}@{artifact.digest}, "
        f"compiled by {details.get('compiled_by') or 'another machine'}")
    return entry, {"pulled": reference, "digest": artifact.digest,
                   "seconds": round(time.monotonic() - started, 3),
                   "compiled_by": details.get("compiled_by"), "builder": details.get("builder")}


def _miss(say: Callable[[str], None], key: kernelcache.KernelKey, why: str
          ) -> tuple[None, dict[str, Any]]:
    line = f"kernel {key.package} not taken from the registry, compiling it: {why}"
    say(line)
    return None, {"miss": line}


def _one_line(exc: BaseException) -> str:
    text = exc.one_line() if isinstance(exc, InfermatrixError) else str(exc)  # the fix kept
    return " ".join(text.split())[:400]
