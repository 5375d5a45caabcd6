"""OCI artifacts in a registry over its HTTP API v2: a record (the config blob, of a custom
media type) and files (the layers) under a tag of a repository, as ORAS pushes them.

The manifest is a plain OCI image manifest with a custom config mediaType, which distribution
2.8 (Debian's docker-registry) accepts; no OCI 1.1 `artifactType` or referrers. Blobs go up
monolithically (POST an upload, PUT its bytes with their digest) unless a HEAD finds them there;
the manifest goes last, so an interrupted push leaves no tag. A pull checks every blob against
its digest while it streams it to disk. Requests, auth and logging are registry.py's
(`RegistrySession.request`: each call logged with method, URL and who, never the secret).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from .registry import (DigestMismatch, RegistryCredentials, RegistryError, RegistrySession,
                       _api_url, _expect, registry_error, registry_host)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TITLE = "org.opencontainers.image.title"  # a layer's file name (what ORAS writes)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    title: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest,
                                "size": self.size}
        if self.title:
            data["annotations"] = {TITLE: self.title}
        return data


@dataclass(frozen=True)
class ArtifactKind:
    """What a pulled artifact must be: its record's (config blob's) media type, its layers'
    (None: any) and the most bytes its record and each of its files may hold (None: no cap)."""
    record_type: str
    layer_types: frozenset[str] | None = None
    max_record_bytes: int | None = None
    max_file_bytes: int | None = None


@dataclass(frozen=True)
class Artifact:
    """A pulled artifact: its manifest digest, the record's bytes and the files, in `dest`."""
    digest: str
    record: bytes
    files: list[Path]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for chunk in iter(lambda: data.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def describe_bytes(data: bytes, media_type: str) -> Descriptor:
    return Descriptor(media_type, "sha256:" + hashlib.sha256(data).hexdigest(), len(data))


def describe_file(path: Path, media_type: str) -> Descriptor:
    return Descriptor(media_type, "sha256:" + sha256_file(path), path.stat().st_size, path.name)


def manifest_bytes(config: Descriptor, layers: list[Descriptor]) -> bytes:
    """The OCI image manifest of an artifact (stable bytes: sorted keys, no spaces)."""
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config.as_dict(),
                "layers": [layer.as_dict() for layer in layers]}
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def layer_file_name(layer: dict[str, Any]) -> str:
    """The file name a layer is saved under: its title, a bare name (never a path)."""
    title = str((layer.get("annotations") or {}).get(TITLE) or "")
    if not title or Path(title).name != title or title.startswith("."):
        raise ValueError(f"layer {layer.get('digest')} has no usable file name ({title!r})")
    return title


# --- push -----------------------------------------------------------------------------------

def push_artifact(repository: str, tag: str, record: bytes, record_type: str,
                  files: list[tuple[Path, str]], creds: RegistryCredentials) -> str:
    """Push `record` as the config blob and each (file, media type) as a layer, then the
    manifest under `tag`; return the manifest's digest."""
    session = RegistrySession(creds)
    config = describe_bytes(record, record_type)
    _upload_blob(repository, config, record, session)
    layers = []
    for path, media_type in files:
        layer = describe_file(path, media_type)
        _upload_blob(repository, layer, path, session)
        layers.append(layer)
    manifest = manifest_bytes(config, layers)
    what = f"putting the manifest {repository}:{tag}"
    response = session.request("PUT", _api_url(repository, "manifests", tag), what,
                               {"Content-Type": OCI_MANIFEST}, body=manifest)
    _expect(response, (201,), what, repository, creds)
    return response.headers.get("Docker-Content-Digest") or describe_bytes(manifest, "").digest


def _upload_blob(repository: str, blob: Descriptor, body: bytes | Path,
                 session: RegistrySession) -> None:
    """A monolithic upload (POST, then PUT with the digest), skipped when the blob is there."""
    what = f"checking blob {blob.digest} in {repository}"
    head = session.request("HEAD", _api_url(repository, "blobs", blob.digest), what)
    if head.status_code == 200:
        return
    what = f"uploading blob {blob.digest} to {repository}"
    start = session.request("POST", _api_url(repository, "blobs/uploads", ""), what)
    _expect(start, (202,), what, repository, session.creds)
    location = urljoin(start.url, start.headers.get("Location", ""))
    separator = "&" if "?" in location else "?"
    done = session.request("PUT", f"{location}{separator}digest={blob.digest}", what,
                           {"Content-Type": "application/octet-stream",
                            "Content-Length": str(blob.size)}, body=body)
    _expect(done, (201,), what, repository, session.creds)


# --- pull -----------------------------------------------------------------------------------

def pull_artifact(repository: str, tag: str, kind: ArtifactKind, dest: Path,
                  creds: RegistryCredentials) -> Artifact | None:
    """The artifact under `repository:tag`, its files saved in `dest`; None when there is no
    such tag. A manifest of another config type or (with `kind.layer_types`) a layer of another
    media type, a blob larger than its cap or than its descriptor says, or whose bytes do not
    hash to its digest, is a RegistryError. The digest is the manifest's own bytes' sha256 (a
    registry's Docker-Content-Digest header that says otherwise is a DigestMismatch)."""
    session = RegistrySession(creds)
    what = f"reading {repository}:{tag}"
    response = session.request("GET", _api_url(repository, "manifests", tag), what,
                               {"Accept": OCI_MANIFEST})
    if response.status_code == 404:
        return None
    _expect(response, (200,), what, repository, creds)
    manifest = response.json()
    config = manifest.get("config") or {}
    if config.get("mediaType") != kind.record_type:
        raise RegistryError(f"{what}: its config is {config.get('mediaType')!r}, not "
                            f"{kind.record_type}", fix="push the artifact again from its cache")
    digest = "sha256:" + hashlib.sha256(response.content).hexdigest()
    claimed = response.headers.get("Docker-Content-Digest")
    if claimed and claimed != digest:
        raise registry_error(what, f"its manifest hashes to {digest}, the registry says "
                             f"{claimed}", registry_host(repository), creds, DigestMismatch)
    layers = manifest.get("layers") or []
    for layer in layers:
        if kind.layer_types is not None and layer.get("mediaType") not in kind.layer_types:
            raise RegistryError(f"{what}: a layer is {layer.get('mediaType')!r}, not one of "
                                f"{', '.join(sorted(kind.layer_types))}",
                                fix="push the artifact again from its cache")
    caps = [(config, kind.max_record_bytes), *[(layer, kind.max_file_bytes) for layer in layers]]
    for blob, cap in caps:
        _check_size(what, blob, cap)  # before any blob is fetched
    record_path = _fetch_blob(repository, config, dest / ".record", session, kind.max_record_bytes)
    files = [_fetch_blob(repository, layer, dest / layer_file_name(layer), session,
                         kind.max_file_bytes) for layer in layers]
    record = record_path.read_bytes()
    record_path.unlink()
    return Artifact(digest, record, files)


def _check_size(what: str, blob: dict[str, Any], max_bytes: int | None) -> None:
    size = blob.get("size")
    if max_bytes is not None and isinstance(size, int) and size > max_bytes:
        raise RegistryError(f"{what}: blob {blob.get('digest')} is {size} bytes, over the cap "
                            f"of {max_bytes}",
                            fix="a kernel artifact this large is not one a build pushed")


def _fetch_blob(repository: str, blob: dict[str, Any], target: Path, session: RegistrySession,
                max_bytes: int | None = None) -> Path:
    """Stream one blob to `target`, checking its bytes against its digest; no more than its
    descriptor's size (nor `max_bytes`) is read."""
    wanted = str(blob.get("digest", ""))
    what = f"reading blob {wanted} of {repository}"
    size = blob.get("size")
    limit = size if isinstance(size, int) and size >= 0 else None
    _check_size(what, blob, max_bytes)
    if max_bytes is not None and limit is None:
        limit = max_bytes
    response = session.request("GET", _api_url(repository, "blobs", wanted), what, stream=True)
    _expect(response, (200,), what, repository, session.creds)
    digest = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    read = 0
    with response, target.open("wb") as out:
        for chunk in response.iter_content(_CHUNK):
            read += len(chunk)
            if limit is not None and read > limit:
                out.close()
                target.unlink()
                raise registry_error(what, f"more than the {limit} bytes it may hold",
                                     registry_host(repository), session.creds, DigestMismatch)
            digest.update(chunk)
            out.write(chunk)
    if "sha256:" + digest.hexdigest() != wanted:
        target.unlink()
        raise registry_error(what, f"its bytes hash to sha256:{digest.hexdigest()}",
                             registry_host(repository), session.creds, DigestMismatch)
    return target
