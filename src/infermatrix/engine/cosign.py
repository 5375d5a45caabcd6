"""cosign: sign a pushed digest, attach attestations to it, and verify both, in the registry.

Every call goes through proc.run (logged exactly in commands.log). Secrets never reach argv or
the logged line:
  - the private key is a file (`--key PATH`: a path, not the key) or the environment variable
    INFERMATRIX_COSIGN_KEY, which cosign reads itself (`--key env://INFERMATRIX_COSIGN_KEY`);
  - its password goes to cosign as COSIGN_PASSWORD in the environment (logged as ***);
  - registry credentials from INFERMATRIX_REGISTRY_USER/_PASSWORD reach cosign through a Docker
    config written into a private directory under the state directory (`<state>/secrets/`,
    mode 0700, one `auth-<pid>-*` directory per call, removed when the call ends on any path;
    what a run killed by SIGKILL left there is removed by the next run, `clear_dead_secrets`);
    credentials from Docker's own config are used where they are;
  - cosign dies with this process (PR_SET_PDEATHSIG): a SIGKILL of the run leaves no cosign
    running on with the credentials.

Offline by default: no transparency log (Rekor) or OIDC is reachable from these machines, so
signatures and attestations are made with `--tlog-upload=false` and checked with
`--insecure-ignore-tlog=true`; `INFERMATRIX_COSIGN_TLOG=1` uploads to and checks against the
log, and `INFERMATRIX_COSIGN_KEYLESS=1` signs keyless (Fulcio certificate from an OIDC token)
for users who reach those services (verified by INFERMATRIX_COSIGN_IDENTITY and
INFERMATRIX_COSIGN_OIDC_ISSUER).

Where cosign lives: $INFERMATRIX_COSIGN, else `.ci/provision`'s prefix
(/opt/infermatrix-cosign/bin/cosign, Debian trixie's package), else PATH.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from .. import proc
from ..errors import CommandFailed, MissingTool, SignatureError, UsageError
from . import registry as registries

COSIGN_ENV = "INFERMATRIX_COSIGN"
PROVISIONED = Path(os.environ.get("INFERMATRIX_COSIGN_DIR", "/opt/infermatrix-cosign")) / \
    "bin" / "cosign"
KEY_ENV = "INFERMATRIX_COSIGN_KEY"            # the private key itself (PEM)
KEY_FILE_ENV = "INFERMATRIX_COSIGN_KEY_FILE"  # or the path of its file
PASSWORD_ENV = "INFERMATRIX_COSIGN_PASSWORD"  # its password ("" for an unencrypted key)
PUBLIC_KEY_ENV = "INFERMATRIX_COSIGN_PUBLIC_KEY"  # pull/deploy: the public key's file
KEYLESS_ENV = "INFERMATRIX_COSIGN_KEYLESS"
TLOG_ENV = "INFERMATRIX_COSIGN_TLOG"
IDENTITY_ENV = "INFERMATRIX_COSIGN_IDENTITY"
ISSUER_ENV = "INFERMATRIX_COSIGN_OIDC_ISSUER"
INSTALL_FIX = ("run `bash .ci/provision` (it unpacks Debian trixie's cosign into "
               "/opt/infermatrix-cosign) or set INFERMATRIX_COSIGN to a cosign binary")
OFFLINE_NOTE = ("offline: no transparency log (Rekor) entry is made or checked; the signature "
                "is checked against the key alone")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def binary() -> str:
    """The cosign to run; a missing one is a MissingTool with the fix."""
    wanted = os.environ.get(COSIGN_ENV)
    if wanted:
        if not (Path(wanted).is_file() and os.access(wanted, os.X_OK)):
            raise UsageError(f"{COSIGN_ENV}={wanted} is not an executable file",
                             fix=INSTALL_FIX)
        return wanted
    if PROVISIONED.is_file() and os.access(PROVISIONED, os.X_OK):
        return str(PROVISIONED)
    found = shutil.which("cosign")
    if found:
        return found
    raise MissingTool("cosign is not installed", fix=INSTALL_FIX)


def version() -> str:
    """cosign's version: Debian's package version from the provisioned prefix's marker, else
    what `cosign version` says."""
    path = Path(binary())
    markers = sorted(path.parent.parent.glob(".cosign-*"))
    if markers:
        return markers[-1].name.removeprefix(".cosign-")
    result = proc.run([str(path), "version"], check=False, timeout=30)
    for line in result.output.splitlines():
        if line.startswith("GitVersion:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


# --- keys -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SigningKey:
    """How publish signs: `key_ref` is what cosign's --key gets (a path or env://VAR; never the
    key), `password` goes to cosign's environment. keyless: no key (Fulcio + Rekor)."""

    key_ref: str | None
    source: str
    password: str | None = None
    keyless: bool = False
    tlog: bool = False

    def describe(self) -> str:
        mode = "keyless (OIDC certificate)" if self.keyless else f"key from {self.source}"
        return f"{mode}, {'transparency log' if self.tlog else 'offline'}"

    def __repr__(self) -> str:  # never the password
        return f"SigningKey({self.describe()})"


def signing_key(env: Mapping[str, str] | None = None) -> SigningKey | None:
    """The signing key of this run from the environment, or None (publish does not sign).
    Never from matrix.yaml."""
    env = os.environ if env is None else env
    tlog = _truthy(env.get(TLOG_ENV))
    if _truthy(env.get(KEYLESS_ENV)):
        return SigningKey(None, KEYLESS_ENV, keyless=True, tlog=True)
    key, key_file = env.get(KEY_ENV), env.get(KEY_FILE_ENV)
    if key and key_file:
        raise UsageError(f"both {KEY_ENV} and {KEY_FILE_ENV} are set", fix="set one of them")
    if not key and not key_file:
        return None
    password = env.get(PASSWORD_ENV)
    if password is None:
        raise UsageError(f"{KEY_ENV if key else KEY_FILE_ENV} is set but {PASSWORD_ENV} is not",
                         fix="set it to the key's password (empty for an unencrypted key)")
    if key:
        if "PRIVATE KEY" not in key:
            raise UsageError(f"{KEY_ENV} does not hold a PEM private key",
                             fix="put the content of cosign.key in it, or its path in "
                             f"{KEY_FILE_ENV}")
        return SigningKey(f"env://{KEY_ENV}", KEY_ENV, password, tlog=tlog)
    assert key_file is not None  # neither key nor key_file returned above: key_file is set
    path = Path(key_file).expanduser()
    if not path.is_file():
        raise UsageError(f"{KEY_FILE_ENV}={key_file} is not a file",
                         fix="point it at the private key (cosign generate-key-pair writes "
                         "cosign.key)")
    return SigningKey(str(path.absolute()), f"{KEY_FILE_ENV} ({path.name})", password,
                      tlog=tlog)


def public_key_path(flag: Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The public key pull and deploy verify against: --key, else INFERMATRIX_COSIGN_PUBLIC_KEY."""
    env = os.environ if env is None else env
    raw = flag or (Path(env[PUBLIC_KEY_ENV]) if env.get(PUBLIC_KEY_ENV) else None)
    if raw is None:
        return None
    path = Path(raw).expanduser()
    if not path.is_file():
        where = "--key" if flag else PUBLIC_KEY_ENV
        raise UsageError(f"{where} {raw}: no such file",
                         fix="point it at the publisher's public key (cosign.pub)")
    text = path.read_text(encoding="utf-8", errors="replace")
    if "PRIVATE KEY" in text:
        raise UsageError(f"{raw} is a private key", fix="verify with the public key "
                         "(cosign.pub), and keep the private one away from consumers")
    if "PUBLIC KEY" not in text:
        raise UsageError(f"{raw} is not a PEM public key", fix="use cosign.pub")
    return path


def key_fingerprint(public_pem: str) -> str:
    """sha256 of the public key's DER bytes (what `openssl pkey -pubin -outform DER` gives)."""
    body = "".join(line for line in public_pem.strip().splitlines()
                   if line and not line.startswith("-----"))
    return "sha256:" + hashlib.sha256(base64.b64decode(body)).hexdigest()


def public_key_of(key: SigningKey) -> str:
    """The PEM public key of the signing key (`cosign public-key`), to record its fingerprint."""
    with tempfile.TemporaryDirectory(prefix="infermatrix-cosign-") as tmp:
        out = Path(tmp) / "key.pub"
        _cosign(["public-key", "--key", key.key_ref or "", "--outfile", str(out)],
                key=key, what="reading the signing key's public half")
        return out.read_text(encoding="utf-8")


# --- running cosign ---------------------------------------------------------------------------

SECRETS_DIR = "secrets"
_state_root: list[Path] = []  # the state directory of this run (use_state_dir)


def use_state_dir(root: Path) -> Path:
    """Put the registry credentials of this run's cosign calls under `<root>/secrets/` (0700)
    and remove what a killed run left there; the secrets directory."""
    _state_root[:] = [Path(root).absolute()]
    directory = secrets_dir()
    clear_dead_secrets(directory)
    return directory


def secrets_dir() -> Path:
    """`<state>/secrets/` of use_state_dir, else ./.state/secrets (the consumer's directory)."""
    from ..state import DEFAULT_STATE_DIR

    root = _state_root[0] if _state_root else Path(DEFAULT_STATE_DIR).absolute()
    return root / SECRETS_DIR


def _private_dir(directory: Path) -> Path:
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise UsageError(f"cannot make {directory} for cosign's registry credentials: "
                         f"{exc.strerror}", fix="run where the state directory is writable "
                         "(--state-dir, or the directory of --lock)") from None
    if directory.is_symlink() or not directory.is_dir():
        raise UsageError(f"{directory} is not a directory: cosign's credentials are not "
                         "written there", fix="remove it")
    os.chmod(directory, 0o700)
    return directory


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_dead_secrets(directory: Path) -> list[str]:
    """Remove the `auth-<pid>-*` directories of runs that are gone (killed before their
    `finally`); the names removed."""
    if not directory.is_dir():
        return []
    removed = []
    for entry in sorted(directory.iterdir()):
        parts = entry.name.split("-")
        pid = int(parts[1]) if len(parts) > 2 and parts[0] == "auth" and parts[1].isdigit() \
            else None
        if pid == os.getpid() or (pid is not None and _alive(pid)):
            continue  # a live run's (this process's own, a call in another thread, included)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed

@contextmanager
def _registry_env(repository: str | None,
                  creds: registries.RegistryCredentials | None) -> Iterator[dict[str, str]]:
    """DOCKER_CONFIG for cosign: a private one under the state directory (secrets_dir) holding
    the credentials of INFERMATRIX_REGISTRY_USER/_PASSWORD, removed on every way out; else
    Docker's own (left as it is)."""
    if repository is None or creds is None or creds.anonymous or \
            not creds.source.startswith(registries.REGISTRY_USER_ENV):
        yield {}
        return
    host = registries.registry_host(repository)
    parent = _private_dir(secrets_dir())
    clear_dead_secrets(parent)
    directory = Path(tempfile.mkdtemp(prefix=f"auth-{os.getpid()}-", dir=parent))
    try:
        os.chmod(directory, 0o700)
        token = base64.b64encode(f"{creds.username}:{creds.password or ''}".encode()).decode()
        config = directory / "config.json"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"auths": {host: {"auth": token}}}, handle)
        yield {"DOCKER_CONFIG": str(directory)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


DOCKER_CERTS = Path("/etc/docker/certs.d")


def _registry_flags(repository: str) -> list[str]:
    """Plain HTTP for what the daemon treats as insecure (127.0.0.0/8); a registry CA the
    daemon trusts (/etc/docker/certs.d/HOST/ca.crt) is trusted by cosign too."""
    host = registries.registry_host(repository)
    if not registries.registry_is_secure(host):
        return ["--allow-insecure-registry", "--allow-http-registry"]
    ca = DOCKER_CERTS / host / "ca.crt"
    return ["--registry-cacert", str(ca)] if ca.is_file() else []


def _cosign(args: list[str], *, key: SigningKey | None = None, repository: str | None = None,
            creds: registries.RegistryCredentials | None = None, what: str,
            timeout: float = 300) -> proc.Completed:
    """Run cosign; a failure is a SignatureError of one line (cosign's own last error line)."""
    env: dict[str, str] = {}
    if key is not None and key.password is not None:
        env["COSIGN_PASSWORD"] = key.password  # logged as COSIGN_PASSWORD=***
    with _registry_env(repository, creds) as auth_env:
        env.update(auth_env)
        try:
            return proc.run([binary(), *args], env=env, timeout=timeout, die_with_parent=True)
        except CommandFailed as exc:
            raise SignatureError(f"{what}: {error_line(exc.log_tail)}") from None


def error_line(output: str) -> str:
    """cosign's reason, on one line: its `Error:` line, else the last line it printed."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    text = (errors[-1] if errors else (lines[-1] if lines else "cosign failed"))
    text = text.removeprefix("Error:").strip()
    return " ".join(text.split())[:400]


def _sign_flags(key: SigningKey) -> list[str]:
    flags = [] if key.keyless else ["--key", key.key_ref or ""]
    return flags + ["--tlog-upload=" + ("true" if key.tlog else "false"), "--yes"]


def sign(reference: str, key: SigningKey, creds: registries.RegistryCredentials) -> None:
    """Sign `repository@digest` (the signature goes to its `sha256-<hex>.sig` tag)."""
    repository = reference.split("@", 1)[0]
    _cosign(["sign", *_sign_flags(key), *_registry_flags(repository), reference],
            key=key, repository=repository, creds=creds, what=f"signing {reference}")


def attest(reference: str, key: SigningKey, creds: registries.RegistryCredentials,
           predicate: dict[str, Any], predicate_type: str) -> None:
    """Attach a signed in-toto statement of `predicate_type` about `repository@digest` (to its
    `sha256-<hex>.att` tag), replacing an earlier one of the same type."""
    repository = reference.split("@", 1)[0]
    with tempfile.TemporaryDirectory(prefix="infermatrix-predicate-") as tmp:
        path = Path(tmp) / "predicate.json"
        path.write_text(json.dumps(predicate, sort_keys=True, default=str), encoding="utf-8")
        _cosign(["attest", *_sign_flags(key), "--replace", "--type", predicate_type,
                 "--predicate", str(path), *_registry_flags(repository), reference],
                key=key, repository=repository, creds=creds,
                what=f"attesting {predicate_type} for {reference}")


def _verify_flags(public_key: Path | None, tlog: bool) -> list[str]:
    if public_key is None and not (os.environ.get(IDENTITY_ENV) and os.environ.get(ISSUER_ENV)):
        raise UsageError(f"keyless verification needs {IDENTITY_ENV} and {ISSUER_ENV} (the "
                         "signer's certificate identity and OIDC issuer)",
                         fix="set them, or verify with --key cosign.pub")
    flags = ["--key", str(public_key)] if public_key else [
        "--certificate-identity", os.environ.get(IDENTITY_ENV, ""),
        "--certificate-oidc-issuer", os.environ.get(ISSUER_ENV, "")]
    return flags + ([] if tlog else ["--insecure-ignore-tlog=true"])


def verify(reference: str, public_key: Path | None, creds: registries.RegistryCredentials,
           tlog: bool = False) -> list[dict[str, Any]]:
    """The verified signature payloads of `repository@digest` (cosign checks each against the
    key and that its claim names this digest); SignatureError when none verifies."""
    repository = reference.split("@", 1)[0]
    with tempfile.TemporaryDirectory(prefix="infermatrix-verify-") as tmp:
        out = Path(tmp) / "out.json"
        _cosign(["verify", *_verify_flags(public_key, tlog), *_registry_flags(repository),
                 "--output-file", str(out), reference], repository=repository, creds=creds,
                what=f"signature of {reference}")
        try:
            payloads = json.loads(out.read_text(encoding="utf-8") or "[]")
        except (OSError, ValueError):
            payloads = []
    return payloads if isinstance(payloads, list) else []


def verify_attestation(reference: str, public_key: Path | None, predicate_type: str,
                       creds: registries.RegistryCredentials,
                       tlog: bool = False) -> list[dict[str, Any]]:
    """The verified in-toto statements of `predicate_type` attached to `repository@digest`
    (signature checked against the key, subject digest checked by cosign); SignatureError when
    none verifies."""
    repository = reference.split("@", 1)[0]
    with tempfile.TemporaryDirectory(prefix="infermatrix-verify-") as tmp:
        out = Path(tmp) / "out.json"
        _cosign(["verify-attestation", *_verify_flags(public_key, tlog), "--type",
                 predicate_type, *_registry_flags(repository), "--output-file", str(out),
                 reference], repository=repository, creds=creds,
                what=f"{predicate_type} attestation of {reference}")
        text = out.read_text(encoding="utf-8") if out.is_file() else ""
    statements = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            envelope = json.loads(line)
            statements.append(json.loads(base64.b64decode(envelope["payload"])))
        except (ValueError, KeyError, TypeError):
            continue
    return statements


# --- what the registry holds ------------------------------------------------------------------

def attached_tag(digest: str, suffix: str) -> str:
    """cosign's tag for what it attaches to a digest: `sha256-<hex>.sig` / `.att`."""
    return digest.replace(":", "-") + "." + suffix


def attached(repository: str, digest: str,
             creds: registries.RegistryCredentials) -> dict[str, Any]:
    """The digests of what cosign attached to `repository@digest`: the signature manifest and
    the attestation manifest with each attestation's layer by predicate type."""
    found: dict[str, Any] = {"signature": None, "attestations": None, "predicates": {}}
    for suffix, name in (("sig", "signature"), ("att", "attestations")):
        tag = attached_tag(digest, suffix)
        url = registries._api_url(repository, "manifests", tag)
        response = registries.RegistrySession(creds).request(
            "GET", url, f"reading {repository}:{tag}",
            {"Accept": "application/vnd.oci.image.manifest.v1+json"})
        if response.status_code != 200:
            continue
        manifest_digest = response.headers.get("Docker-Content-Digest") or \
            "sha256:" + hashlib.sha256(response.content).hexdigest()
        found[name] = {"tag": f"{repository}:{tag}", "digest": manifest_digest}
        if suffix == "att":
            for layer in response.json().get("layers") or []:
                kind = (layer.get("annotations") or {}).get("predicateType")
                if kind:
                    found["predicates"][kind] = layer.get("digest")
    return found
