"""Package-index metadata: the dependency pins an engine release publishes.

Reads a release's wheel METADATA (PEP 566) from a PEP 691 simple index. Indexes that serve
PEP 658 `.metadata` files are used directly; otherwise only the zip's central directory and
the METADATA member are fetched with HTTP range requests (the wheel itself can be 500 MB).
Results are cached on disk; offline mode answers from the cache alone.
"""

from __future__ import annotations

import datetime
import email.parser
import io
import json
import logging
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TypeVar

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ..state import DamagedStateFile, notice, read_state_json, write_json_atomic

log = logging.getLogger(__name__)

DEFAULT_INDEX = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
USER_AGENT = "infermatrix (+metadata reader)"


class IndexUnavailable(Exception):
    """The index could not be reached (a network condition, not a verdict on a cell)."""


class NotOnIndex(Exception):
    """The index answered, and the release (or a wheel for the platform) is not there."""


@dataclass(frozen=True)
class ReleaseMetadata:
    name: str
    version: str
    wheel: str  # the file the metadata was read from
    url: str  # where a user can see it
    requires_dist: tuple[str, ...]

    def requirements(self, machine: str = "x86_64") -> list[Requirement]:
        """The requirements that apply on Linux `machine` (markers evaluated; a line that is
        not a requirement is passed over)."""
        env = {"sys_platform": "linux", "platform_system": "Linux",
               "platform_machine": machine, "extra": ""}
        found: list[Requirement] = []
        for line in self.requires_dist:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate(env):
                found.append(req)
        return found

    def pins_for(self, dependency: str, machine: str = "x86_64") -> list[Requirement]:
        """Requirements on `dependency` that apply on Linux `machine`."""
        wanted = canonicalize_name(dependency)
        return [r for r in self.requirements(machine) if canonicalize_name(r.name) == wanted]


def index_url(configured: str | None = None) -> str:
    """The index to read: the configured one (the run option `index_url`:
    options.package_index()), else PyPI's simple index."""
    return (configured or DEFAULT_INDEX).rstrip("/")


def _ssl_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    bundle = os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT")
    if bundle and Path(bundle).is_file():
        ctx.load_verify_locations(bundle)
    return ctx


# A transient failure is tried again after each of these pauses (CI lost a run to one
# "Temporary failure in name resolution" of files.pythonhosted.org).
RETRY_DELAYS_S = (1.0, 3.0)


def transient(exc: BaseException) -> bool:
    """A failure worth trying again: the resolver's "try again" (EAI_AGAIN), a timeout, a reset
    connection, an overloaded server (429, 502-504). Not a name that does not resolve at all
    (EAI_NONAME: an index this machine cannot reach), nor a 404."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (429, 502, 503, 504)
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return reason.errno == socket.EAI_AGAIN
    return isinstance(reason, (TimeoutError, ConnectionResetError))


def _index_error(url: str, exc: OSError) -> Exception:
    if isinstance(exc, urllib.error.HTTPError):
        return NotOnIndex(f"{url}: 404") if exc.code == 404 else \
            IndexUnavailable(f"{url}: HTTP {exc.code}")
    return IndexUnavailable(f"{url}: {exc}")


def _http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 30) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    for pause in (*RETRY_DELAYS_S, None):
        log.debug("GET %s %s", url, headers or "")
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=_ssl_context()) as resp:
                return resp.read()
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            if pause is None or not transient(exc):
                raise _index_error(url, exc) from exc
            log.info("GET %s: %s; trying again in %.0f s", url, exc, pause)
            time.sleep(pause)
    raise AssertionError("unreachable: the last attempt returns or raises")


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:  # a writable buffer (bytearray, memoryview)
        if self.pos >= self.size or len(buffer) == 0:
            return 0
        end = min(self.size, self.pos + len(buffer)) - 1
        data = _http_get(self.url, {"Range": f"bytes={self.pos}-{end}"})
        data = data[: end - self.pos + 1]
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _metadata_from_wheel(url: str, size: int) -> bytes:
    # A buffer of 256 KiB makes the central directory one or two requests.
    remote = io.BufferedReader(_RangeFile(url, size), buffer_size=256 * 1024)
    with zipfile.ZipFile(remote) as wheel:
        member = next(n for n in wheel.namelist()
                      if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return wheel.read(member)


def _pick_wheel(files: list[dict], version: str, machine: str = "x86_64") -> dict:
    """A Linux `machine` (or pure-Python) wheel of exactly `version`, preferring CPython 3.12."""
    def score(entry: dict) -> int | None:
        name = entry["filename"]
        if not name.endswith(".whl") or entry.get("yanked"):
            return None
        _, ver, _, tags = parse_wheel_filename(name)
        if ver != Version(version):
            return None
        platforms = {t.platform for t in tags}
        if "any" in platforms:
            return 1
        if any(p.endswith(machine) and "linux" in p for p in platforms):
            return 3 if any(t.interpreter in ("cp312", "py3", "cp38", "cp39") or t.abi == "abi3"
                            for t in tags) else 2
        return None
    ranked = [(s, f) for f in files if (s := score(f)) is not None]
    if not ranked:
        raise NotOnIndex(f"no Linux {machine} wheel for version {version}")
    return max(ranked, key=lambda pair: pair[0])[1]


T = TypeVar("T")
if TYPE_CHECKING:
    from _typeshed import DataclassInstance
D = TypeVar("D", bound="DataclassInstance")


def cached_entry(path: Path, build: Callable[[dict[str, Any]], T],
                 kind: str = "metadata cache entry", again: str = "read again from the index"
                 ) -> T | None:
    """A cache entry built from its file, or None when it is missing or damaged. A damaged
    entry (empty, truncated, binary, wrong shape) is removed and said, so the caller makes
    it again (the index: fetched again; offline, the usual "run once online")."""
    if not path.is_file():
        return None
    try:
        return build(read_state_json(path, kind, f"it is {again}"))
    except DamagedStateFile as exc:
        problem = str(exc).split("\n")[0]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problem = f"{path}: damaged {kind}: wrong shape ({exc})"
    path.unlink(missing_ok=True)
    notice(f"warning: {problem}\n  removed from the cache; it is {again}")
    return None


def typed(cls: type[D], data: dict[str, Any], tuples: tuple[str, ...] = ()) -> D:
    """A dataclass of `data` whose fields are all given with their type (`tuples`: lists
    stored for tuple fields); TypeError otherwise (a cache entry of the wrong shape)."""
    values = {f.name: data[f.name] for f in fields(cls)}  # KeyError: a field is missing
    for name, value in values.items():
        kind = list if name in tuples else {"int": int}.get(str(_field_type(cls, name)), str)
        if not isinstance(value, kind) or (isinstance(value, list) and
                                           not all(isinstance(v, str) for v in value)):
            raise TypeError(f"{name} is {type(value).__name__}")
    return cls(**{k: tuple(v) if k in tuples else v for k, v in values.items()})


def _field_type(cls: type[DataclassInstance], name: str) -> object:
    return next(f.type for f in fields(cls) if f.name == name)


class MetadataCache:
    """Disk cache of release metadata under `root`, keyed by index, name and version."""

    def __init__(self, root: Path, offline: bool = False, index: str | None = None) -> None:
        self.root, self.offline, self.index = root, offline, (index or index_url())

    def _path(self, name: str, version: str, machine: str) -> Path:
        safe_index = "".join(c if c.isalnum() else "_" for c in self.index)[-60:]
        suffix = "" if machine == "x86_64" else f"-{machine}"
        return self.root / safe_index / f"{canonicalize_name(name)}-{version}{suffix}.json"

    def release(self, name: str, version: str, machine: str = "x86_64") -> ReleaseMetadata:
        """Metadata of `name==version` as its Linux `machine` wheel declares it."""
        path = self._path(name, version, machine)
        cached = cached_entry(path, lambda d: typed(ReleaseMetadata, d, ("requires_dist",)))
        if cached is not None:
            return cached
        if self.offline:
            raise IndexUnavailable(
                f"offline: no cached metadata for {name}=={version} (run once online to fill {self.root})")
        meta = self._fetch(name, version, machine)
        # A unique temp name per writer, renamed over: two plans filling one cache never meet.
        write_json_atomic(path, meta.__dict__ | {"requires_dist": list(meta.requires_dist)})
        return meta

    def _fetch(self, name: str, version: str, machine: str) -> ReleaseMetadata:
        project_url = f"{self.index}/{canonicalize_name(name)}/"
        listing = json.loads(_http_get(project_url, {"Accept": SIMPLE_JSON}))
        wheel = _pick_wheel(listing.get("files", []), version, machine)
        if wheel.get("core-metadata") or wheel.get("data-dist-info-metadata"):
            raw = _http_get(wheel["url"] + ".metadata")
        else:
            raw = _metadata_from_wheel(wheel["url"], int(wheel["size"]))
        message = email.parser.BytesParser().parsebytes(raw, headersonly=True)
        return ReleaseMetadata(
            name=str(message["Name"]), version=str(message["Version"]), wheel=wheel["filename"],
            url=f"{project_url}#{wheel['filename']}",
            requires_dist=tuple(message.get_all("Requires-Dist") or ()))


# Release listings ---------------------------------------------------------------------------
LISTING_TTL_S = 3600  # an online plan re-reads a listing older than this (new releases appear)


@dataclass(frozen=True)
class ReleaseList:
    """The releases of a project that have a Linux wheel (not yanked), oldest first."""

    name: str
    versions: tuple[str, ...]
    fetched_at: str  # ISO 8601 UTC: when the index said so
    url: str

    def newest(self, specifier: SpecifierSet, count: int) -> list[str]:
        """The `count` newest final releases matching `specifier`, newest first."""
        found = [v for v in self.versions
                 if not Version(v).is_prerelease and specifier.contains(v)]
        return list(reversed(found))[:count]


def linux_wheels(files: Iterable[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], Version]]:
    """(entry, version) of each Linux or pure-Python wheel of a PEP 691 `files` listing."""
    for entry in files:
        filename = str(entry.get("filename", ""))
        if not filename.endswith(".whl"):
            continue
        try:
            _, version, _, tags = parse_wheel_filename(filename)
        except ValueError:  # InvalidWheelFilename, InvalidVersion
            continue
        if any(t.platform == "any" or "linux" in t.platform for t in tags):
            yield entry, version


def _linux_wheel_versions(files: list[dict]) -> list[str]:
    versions = {version for entry, version in linux_wheels(files) if not entry.get("yanked")}
    return [str(v) for v in sorted(versions)]


def _listing_path(root: Path, index: str, name: str) -> Path:
    safe_index = "".join(c if c.isalnum() else "_" for c in index)[-60:]
    return root / safe_index / "releases" / f"{canonicalize_name(name)}.json"


def release_list(root: Path, name: str, *, offline: bool = False, index: str | None = None,
                 ttl_s: float | None = None) -> ReleaseList:
    """The releases of `name` on the index: from the cache when offline or fresh enough."""
    index = index or index_url()
    path = _listing_path(root, index, name)
    ttl = LISTING_TTL_S if ttl_s is None else ttl_s  # the run option index_ttl_s
    if path.is_file() and (offline or time.time() - path.stat().st_mtime < ttl):
        cached = cached_entry(path, lambda d: typed(ReleaseList, d, ("versions",)))
        if cached is not None:
            return cached
    if offline:
        raise IndexUnavailable(f"offline: no cached release list of {name} (run once online "
                               f"to fill {root})")
    url = f"{index}/{canonicalize_name(name)}/"
    listing = json.loads(_http_get(url, {"Accept": SIMPLE_JSON}))
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = ReleaseList(canonicalize_name(name), tuple(_linux_wheel_versions(
        listing.get("files", []))), now, url)
    # a temp file of its own: two planners (threads, processes) may fill the same entry
    write_json_atomic(path, result.__dict__ | {"versions": list(result.versions)})
    return result


def url_exists(url: str, timeout: float = 15) -> bool | None:
    """True/False when the server answers (2xx/3xx vs 404/410); None when it cannot be reached
    (DNS, proxy refusal, timeout): a network condition that says nothing about the URL."""
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": USER_AGENT})
    log.debug("HEAD %s", url)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=_ssl_context()):
            return True
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            return False
        return None
    except (urllib.error.URLError, TimeoutError, OSError):
        return None


def index_lists(project_url: str, filename_prefix: str, timeout: float = 15) -> bool | None:
    """Does a simple-index project page list a file starting with `filename_prefix`? None when
    the index cannot be reached."""
    try:
        page = _http_get(project_url, timeout=timeout).decode("utf-8", "replace")
    except NotOnIndex:
        return False
    except IndexUnavailable:
        return None
    return filename_prefix in page or filename_prefix.replace("+", "%2B") in page
