"""Registries: credentials, the registry HTTP API v2, and pushes and pulls through the daemon.

One code path for `publish` and `pull`: both take their credentials from `credentials_for`
(INFERMATRIX_REGISTRY_USER/_PASSWORD, else Docker's config with its credential helpers, honouring
DOCKER_CONFIG) and hand the same `RegistryCredentials` to the daemon (push/pull, through the
engine module's SDK client) and to the HTTP API (manifests, image configs). Pushes and pulls go
through the daemon, so they honour its TLS / insecure-registry settings; manifests are read over
HTTP (Basic or Bearer-token auth) to learn a tag's digest and config digest (= the image id).
The same requests (`RegistrySession.request`, one session per push or pull) carry the OCI
artifacts of artifacts.py: the compiled-kernel cache shared through the registry.

Every failure is a `RegistryError` (errors.py's catalogue) whose message is one line, what
failed and why (`classify`), with the fix in its `fix` field (`fix_for`). Credentials never
reach argv, logs or messages.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from . import docker as engine
from ..errors import (DigestMismatch, RegistryAuthError, RegistryError, RegistryNotFound,
                      RegistryTLSError, RegistryUnreachable, UsageError)

if TYPE_CHECKING:  # requests is imported where it runs
    import requests

log = logging.getLogger("infermatrix.commands")

REGISTRY_USER_ENV = "INFERMATRIX_REGISTRY_USER"
REGISTRY_PASSWORD_ENV = "INFERMATRIX_REGISTRY_PASSWORD"

_MANIFEST_TYPES = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
])
# Docker Hub's names and the host its registry API answers on.
_API_HOSTS = {"docker.io": "registry-1.docker.io", "index.docker.io": "registry-1.docker.io"}


# --- errors: one line each, with the fix (the classes are errors.py's) -----------------------

# (error class, regexes over the daemon's or requests' message, what went wrong), in order: a TLS
# failure also says "dial tcp", an auth failure may say "not found" in its realm text.
_PATTERNS: list[tuple[type[RegistryError], tuple[str, ...], str]] = [
    (RegistryTLSError, ("x509", "certificate", "tls:", "ssl",
                        "server gave http response to https client"), "TLS failure"),
    (RegistryAuthError, ("unauthorized", "authentication required", "no basic auth credentials",
                         "denied", r"\b401\b", r"\b403\b"),
     "the registry refused the credentials"),
    (DigestMismatch, ("digest mismatch", "digest did not match", "manifest verification",
                      "manifest invalid"), "digest mismatch"),
    (RegistryUnreachable, ("connection refused", "no such host", "i/o timeout", "dial tcp",
                           "connection reset", "timed out", "network is unreachable",
                           "max retries exceeded", "failed to establish", "name resolution"),
     "registry unreachable"),
    (RegistryNotFound, ("manifest unknown", "name unknown", "not found", r"\b404\b",
                        "blob unknown"), "not found"),
]


def fix_for(kind: type[RegistryError], host: str) -> str:
    return {
        RegistryAuthError: f"set {REGISTRY_USER_ENV}/{REGISTRY_PASSWORD_ENV} to an account that "
                           f"may access it, or `docker login {host}`",
        RegistryNotFound: RegistryNotFound.default_fix,
        RegistryUnreachable: f"start the registry or check that {host} is the right host:port "
                             "and reachable from this host and its Docker daemon",
        RegistryTLSError: f"put the registry's CA in /etc/docker/certs.d/{host}/ca.crt (and the "
                          "system CA bundle), or for a plain-HTTP registry add it to "
                          "insecure-registries in /etc/docker/daemon.json",
        DigestMismatch: DigestMismatch.default_fix,
    }.get(kind) or "see the registry's log"


def classify(message: str) -> type[RegistryError]:
    text = message.lower()
    for kind, words, _ in _PATTERNS:
        if any(re.search(word, text) for word in words):
            return kind
    return RegistryError


def _summary(kind: type[RegistryError]) -> str:
    return next((what for k, _, what in _PATTERNS if k is kind), "registry error")


def registry_error(what: str, message: str, host: str, creds: RegistryCredentials,
                   kind: type[RegistryError] | None = None) -> RegistryError:
    """One line, `<what>: <kind> (<who>): <cause>`, and the kind's fix for this host."""
    kind = kind or classify(message)
    cause = " ".join(message.split())[:300]  # the daemon's text, on one line
    return kind(f"{what}: {_summary(kind)} ({creds.describe()}): {cause}",
                fix=fix_for(kind, host))


def _expect(response: requests.Response, codes: tuple[int, ...], what: str, repository: str,
            creds: RegistryCredentials) -> None:
    """A RegistryError (HTTP status and the start of the body) unless the status is in `codes`."""
    if response.status_code not in codes:
        raise registry_error(what, f"HTTP {response.status_code} {response.text.strip()[:200]}",
                             registry_host(repository), creds)


# --- credentials ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RegistryCredentials:
    """Who we are to a registry, and where that came from (never the secret in messages)."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    source: str = "none (anonymous)"

    @property
    def anonymous(self) -> bool:
        return not self.username

    def sdk_auth(self) -> dict[str, str] | None:
        if self.anonymous:
            return None
        return {"username": self.username or "", "password": self.password or ""}

    def describe(self) -> str:
        return "anonymous" if self.anonymous else f"user {self.username!r} from {self.source}"


def registry_host(repository: str) -> str:
    """`ghcr.io/acme/infermatrix` -> `ghcr.io`; `127.0.0.1:5000/x` -> `127.0.0.1:5000`."""
    first, sep, _rest = repository.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    raise UsageError(f"{repository!r} names no registry host (expected e.g. ghcr.io/acme/name)")


def registry_credentials(registry: str, env: Mapping[str, str] | None = None,
                         docker_config: Path | None = None) -> RegistryCredentials:
    """INFERMATRIX_REGISTRY_USER/_PASSWORD, else Docker's config (credential helpers included)."""
    import docker.auth

    env = os.environ if env is None else env
    user, password = env.get(REGISTRY_USER_ENV), env.get(REGISTRY_PASSWORD_ENV)
    if user:
        if password is None:
            raise UsageError(f"{REGISTRY_USER_ENV} is set but {REGISTRY_PASSWORD_ENV} is not")
        return RegistryCredentials(user, password, f"{REGISTRY_USER_ENV}/{REGISTRY_PASSWORD_ENV}")
    try:
        config = docker.auth.load_config(str(docker_config) if docker_config else None)
        entry = config.resolve_authconfig(registry) or {}
    except docker.errors.DockerException as exc:
        raise RegistryAuthError(f"cannot read credentials for {registry} from Docker's config: "
                                f"{' '.join(str(exc).split())}",
                                fix="repair the config ($DOCKER_CONFIG or "
                                f"~/.docker/config.json) or set "
                                f"{REGISTRY_USER_ENV}/{REGISTRY_PASSWORD_ENV}") from None
    entry = {k.lower(): v for k, v in entry.items()}
    if entry.get("username"):
        where = str(docker_config) if docker_config else (
            f"Docker's config ({os.environ.get('DOCKER_CONFIG', '~/.docker')}/config.json)")
        return RegistryCredentials(entry["username"], entry.get("password"), where)
    return RegistryCredentials()


def credentials_for(repository: str) -> RegistryCredentials:
    """The one place publish and pull get their credentials for a repository."""
    return registry_credentials(registry_host(repository))


# --- the HTTP API ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RemoteManifest:
    digest: str  # what `repo@digest` pulls
    media_type: str
    config_digest: str | None  # the image id for a single-platform manifest; None for an index


def registry_is_secure(host: str) -> bool:
    """Whether this machine's daemon (the HTTP API calls are made from here) talks TLS to this
    registry (it treats 127.0.0.0/8 as insecure)."""
    configs = (engine.Engine().sdk().info().get("RegistryConfig") or {}).get("IndexConfigs") or {}
    if host in configs:
        return bool(configs[host].get("Secure", True))
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    return not (name == "localhost" or name.startswith("127.") or name in ("::1", "[::1]"))


def _api_url(repository: str, kind: str, reference: str) -> str:
    host = registry_host(repository)
    scheme = "https" if registry_is_secure(host) else "http"
    name = repository[len(host) + 1:]
    return f"{scheme}://{_API_HOSTS.get(host, host)}/v2/{name}/{kind}/{reference}"


class RegistrySession:
    """The answer to one registry's auth challenge, kept for the requests that follow: a blob
    upload's PUT carries it at once, so a large body is not sent a second time after a 401."""

    def __init__(self, creds: RegistryCredentials) -> None:
        self.creds = creds
        self._basic: tuple[str, str] | None = None
        self._bearer: str | None = None

    def send(self, method: str, url: str, headers: dict[str, str],
             body: bytes | Path | None = None, stream: bool = False) -> requests.Response:
        import requests

        headers = dict(headers)
        if self._bearer:
            headers["Authorization"] = "Bearer " + self._bearer
        # a file's body is streamed from it, never read whole
        with body.open("rb") if isinstance(body, Path) else contextlib.nullcontext(body) as data:
            return requests.request(method, url, headers=headers, data=data, auth=self._basic,
                                    timeout=60, stream=stream)

    def request(self, method: str, url: str, what: str, headers: dict[str, str] | None = None,
                *, body: bytes | Path | None = None, stream: bool = False) -> requests.Response:
        """One HTTP request to a registry, answering a Basic or Bearer challenge once (the
        answer is kept for this session's later requests); `what` names it in errors."""
        import requests

        host = url.split("/")[2]
        log.info("# registry: %s %s (%s)", method, url, self.creds.describe())
        try:
            response = self.send(method, url, headers or {}, body, stream)
            if response.status_code == 401 and self.answer(
                    response.headers.get("WWW-Authenticate", "")):
                response = self.send(method, url, headers or {}, body, stream)
        except requests.exceptions.SSLError as exc:
            raise registry_error(what, str(exc), host, self.creds, RegistryTLSError) from None
        except requests.RequestException as exc:
            raise registry_error(what, str(exc), host, self.creds, RegistryUnreachable) from None
        if response.status_code in (401, 403):
            raise registry_error(what, f"HTTP {response.status_code} {response.text.strip()[:200]}",
                                 host, self.creds, RegistryAuthError)
        return response

    def answer(self, challenge: str) -> bool:
        """Take up a Basic or Bearer challenge; False when there is nothing to answer with."""
        import requests
        from requests.utils import parse_dict_header

        scheme, _, params = challenge.partition(" ")
        auth = None if self.creds.anonymous else (self.creds.username or "",
                                                  self.creds.password or "")
        if scheme.lower() == "basic" and auth:
            self._basic = auth
            return True
        if scheme.lower() != "bearer":
            return False
        fields = parse_dict_header(params)
        token_params = {k: v for k, v in fields.items() if k in ("service", "scope")}
        token = requests.get(fields.get("realm", ""), params=token_params, auth=auth, timeout=60)
        if token.status_code != 200:
            return False
        body = token.json()
        self._bearer = body.get("token") or body.get("access_token") or ""
        return True


def remote_manifest(repository: str, tag_or_digest: str,
                    creds: RegistryCredentials) -> RemoteManifest | None:
    """The manifest `repository:tag` points to in its registry, or None when there is none."""
    what = f"reading {repository}:{tag_or_digest}"
    url = _api_url(repository, "manifests", tag_or_digest)
    response = RegistrySession(creds).request("GET", url, what, {"Accept": _MANIFEST_TYPES})
    if response.status_code == 404:
        return None
    _expect(response, (200,), what, repository, creds)
    body = response.json()
    media_type = response.headers.get("Content-Type", body.get("mediaType", ""))
    digest = response.headers.get("Docker-Content-Digest")
    if not digest:  # a registry may leave the header out: the digest of the bytes is the same
        digest = "sha256:" + hashlib.sha256(response.content).hexdigest()
    config = (body.get("config") or {}).get("digest")
    return RemoteManifest(digest=digest, media_type=media_type, config_digest=config)


def remote_image_config(repository: str, digest: str, creds: RegistryCredentials,
                        expect_id: str | None = None) -> dict[str, Any] | None:
    """The image config (labels, env, ...) of `repository@digest`, read before any pull: a
    few KB instead of the image. None for a multi-platform index. `expect_id`: the image id
    images.lock pins; another config digest is a DigestMismatch."""
    host = registry_host(repository)
    manifest = remote_manifest(repository, digest, creds)
    if manifest is None:
        raise registry_error(f"reading {repository}@{digest}", "manifest unknown (HTTP 404)",
                             host, creds, RegistryNotFound)
    if manifest.digest != digest:
        raise registry_error(f"reading {repository}@{digest}", f"the registry answered with "
                             f"digest {manifest.digest}", host, creds, DigestMismatch)
    if manifest.config_digest is None:
        return None
    if expect_id and manifest.config_digest != expect_id:
        raise registry_error(f"reading {repository}@{digest}", f"its image id is "
                             f"{manifest.config_digest}, images.lock pins {expect_id}", host,
                             creds, DigestMismatch)
    what = f"reading the config of {repository}@{digest}"
    response = RegistrySession(creds).request(
        "GET", _api_url(repository, "blobs", manifest.config_digest), what)
    if response.status_code != 200:
        raise registry_error(what, f"HTTP {response.status_code}", host, creds)
    if "sha256:" + hashlib.sha256(response.content).hexdigest() != manifest.config_digest:
        raise registry_error(what, "the config blob's bytes do not hash to its digest", host,
                             creds, DigestMismatch)
    return response.json()


# --- pushes and pulls through the daemon ----------------------------------------------------

def _stream_errors(events: Iterable[dict[str, Any]]) -> tuple[str | None, str | None]:
    """(error message, pushed digest) from a push/pull progress stream."""
    error = digest = None
    for event in events:
        if "error" in event:
            error = (event.get("errorDetail") or {}).get("message") or event["error"]
        aux = event.get("aux") or {}
        digest = aux.get("Digest", digest)
    return error, digest


def _daemon_stream(call: Callable[[], Iterable[dict[str, Any]]], what: str, host: str, creds: RegistryCredentials) -> str | None:
    """Run a push/pull SDK call; a daemon error (HTTP 500 before the stream, or an error event
    in it, or a broken connection to the registry) becomes one RegistryError line."""
    import docker
    import requests

    try:
        error, digest = _stream_errors(call())
    except docker.errors.APIError as exc:
        error, digest = str(exc.explanation or exc), None
    except requests.RequestException as exc:
        error, digest = str(exc), None
    if error:
        raise registry_error(what, error, host, creds)
    return digest


def push_image(docker: "engine.Engine", image_id: str, repository: str, tag: str,
               creds: RegistryCredentials) -> str:
    """Tag `image_id` as repository:tag in `docker` and push it from there; return the
    registry's manifest digest."""
    docker.tag_image(image_id, f"{repository}:{tag}")
    log.info("# sdk: docker push %s  # as %s", shlex.quote(f"{repository}:{tag}"),
             creds.describe())
    digest = _daemon_stream(
        lambda: docker.sdk().api.push(repository, tag, auth_config=creds.sdk_auth(),
                                      stream=True, decode=True),
        f"push of {repository}:{tag}", registry_host(repository), creds)
    if not digest:
        raise RegistryError(f"push of {repository}:{tag}: the daemon reported no digest",
                            fix="see the daemon's log")
    return digest


def pull_by_digest(docker: "engine.Engine", repository: str, digest: str,
                   creds: RegistryCredentials) -> dict[str, Any]:
    """Pull repository@digest into `docker`; return its `docker image inspect` record."""
    ref = f"{repository}@{digest}"
    log.info("# sdk: docker pull %s  # as %s", shlex.quote(ref), creds.describe())
    _daemon_stream(
        lambda: docker.sdk().api.pull(repository, tag=digest, auth_config=creds.sdk_auth(),
                                      stream=True, decode=True),
        f"pull of {ref}", registry_host(repository), creds)
    info = docker.inspect_image(ref)
    if info is None:
        raise RegistryError(f"pull of {ref}: finished but the image is not there",
                            fix="see the daemon's log")
    return info
