"""Compiled kernel wheels, compiled once per key and reused by every cell with that key.

A key is (package, version or source-tree hash, torch, CUDA, Python, arch list, the package's
build env, a hash of the rendered `kernel-<name>` stage that compiles it, and the image
platform). The wheels of a
key live under `<state>/cache/kernels/<slug>/` with an `entry.json` written last (the key's
inputs, each wheel's sha256, what the compile measured): an entry without it is incomplete and
ignored. Entries appear by an atomic directory rename, so two runs
storing the same key cannot leave a mixed directory.

Consumption (docs/architecture.md, "Rendered Dockerfile stages"): build compiles a missing
wheel with `--target kernel-<name> --output type=local,dest=DIR` (the stage leaves it in
/wheels/), stores it here, then copies the cell's wheels into `kernel-wheels/` of a temporary
copy of the build context, which the `kernels-cached` stage COPYs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..engine.artifacts import sha256_file
from ..model.spec import MATCH_ENGINE
from ..state import DamagedStateFile, StatePaths, notice, read_state_json, write_json_atomic

ENTRY_FILE = "entry.json"
# Files that do not change what a source tree compiles to.
_IGNORED_PARTS = {"__pycache__", ".git", "build", "dist", ".eggs"}


@dataclass(frozen=True)
class KernelKey:
    package: str
    version: str  # release version, or `src-<hash>` for a local source tree
    torch: str
    cuda: str
    python: str
    archs: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    recipe: str = ""  # hash of the rendered kernel stage
    platform: str = "linux/amd64"  # the wheel's CPU: an x86_64 wheel is no use on GB10 (Arm)

    @property
    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def slug(self) -> str:
        """A readable, unique directory name."""
        archs = "+".join(a.replace("_", "") for a in self.archs)
        safe = re.sub(r"[^A-Za-z0-9.+-]", "_", f"{self.package}-{self.version}")
        machine = "" if self.platform == "linux/amd64" else "-" + self.platform.split("/")[-1]
        return (f"{safe}-torch{self.torch}-cu{self.cuda}-py{self.python}-{archs}{machine}-"
                f"{self.digest}")

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["archs"] = list(self.archs)
        data["env"] = dict(self.env)
        data["slug"] = self.slug
        return data


def tree_hash(root: Path) -> str:
    """Hash of a source tree: relative paths and contents, in a stable order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        relative = path.relative_to(root)
        if any(part in _IGNORED_PARTS or part.endswith(".egg-info") for part in relative.parts):
            continue
        digest.update(str(relative).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def make_key(spec: dict[str, Any], *, torch: str, cuda: str, python: str, archs: list[str],
             source_root: Path | None = None, resolved_version: str | None = None,
             stage_text: str = "", platform: str = "linux/amd64") -> KernelKey:
    """The key of one kernel package (`spec`: its `build.kernels.<name>` entry) for a cell.

    `source_root`: where a `path:` is relative to (the matrix directory); `resolved_version`:
    the version the cell's lock resolved, for `version: match-engine`.
    """
    version = str(spec["version"])
    if spec.get("path"):
        root = (Path(source_root or ".") / spec["path"]).resolve()
        version = f"src-{tree_hash(root)}"
    elif version == MATCH_ENGINE:
        if not resolved_version:
            raise ValueError(f"kernel {spec['package']}: version match-engine needs the lock's "
                             "resolved version")
        version = resolved_version
    recipe = hashlib.sha256(stage_text.encode()).hexdigest()[:16] if stage_text else ""
    return KernelKey(package=spec["package"], version=version, torch=torch, cuda=cuda,
                     python=python, archs=tuple(sorted(archs)),
                     env=tuple(sorted((spec.get("env") or {}).items())), recipe=recipe,
                     platform=platform)


# --------------------------------------------------------------------------------------------
# The cache on disk
# --------------------------------------------------------------------------------------------

@dataclass
class CachedKernel:
    key: KernelKey
    directory: Path
    wheels: list[Path] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # what store() was told (stats ...)


def entry_dir(state: StatePaths, key: KernelKey) -> Path:
    return state.kernels / key.slug


def lookup(state: StatePaths, key: KernelKey) -> CachedKernel | None:
    """The complete entry for `key`, or None; each wheel is hashed again against the sha256 its
    entry recorded when it was stored, and an entry whose wheel changed since is not used (said
    on stderr; the next store of the key replaces it)."""
    directory = entry_dir(state, key)
    marker = directory / ENTRY_FILE
    if not marker.is_file():
        return None
    try:
        meta = read_state_json(marker, "kernel cache entry", "it is compiled again")
    except DamagedStateFile as exc:  # issue 48's fuzz: was a JSONDecodeError traceback
        notice(f"warning: {str(exc).splitlines()[0]}\n  left out of the cache; the kernel "
               "is compiled again")
        return None
    names, details = meta.get("wheels"), meta.get("details") or {}
    # a wheel is a plain file name of the entry: never a path out of it
    if not isinstance(names, list) or not names or not isinstance(details, dict) or not all(
            isinstance(n, str) and n.endswith(".whl") and "/" not in n and "\0" not in n
            and n not in (".", "..") for n in names):
        notice(f"warning: {marker}: damaged kernel cache entry: `wheels` is not a list of "
               "wheel file names\n  left out of the cache; the kernel is compiled again")
        return None
    wheels = [directory / name for name in names]
    if not all(w.is_file() and not w.is_symlink() for w in wheels):
        return None
    # issue 44: a local entry is hashed again before use (a changed wheel is compiled again)
    recorded = meta.get("sha256") if isinstance(meta.get("sha256"), dict) else {}
    for wheel in wheels:
        if wheel.name in recorded and sha256_file(wheel) != recorded[wheel.name]:
            notice(f"kernel cache entry {key.slug}: {wheel.name} no longer hashes to the "
                   f"sha256 recorded when it was stored ({recorded[wheel.name]}): not used, "
                   "compiled again")
            return None
    return CachedKernel(key, directory, wheels, details)


def store(state: StatePaths, key: KernelKey, wheels: list[Path],
          details: dict[str, Any] | None = None) -> CachedKernel:
    """Put freshly compiled wheels in the cache (atomically); return the entry."""
    if not wheels:
        raise ValueError(f"no wheels to store for {key.slug}")
    final = entry_dir(state, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    existing = lookup(state, key)
    if existing is not None:
        return existing
    staging = Path(tempfile.mkdtemp(prefix=f".{key.slug}.", dir=final.parent))
    try:
        for wheel in wheels:
            shutil.copy2(wheel, staging / wheel.name)
        write_json_atomic(staging / ENTRY_FILE, {
            "key": key.as_dict(), "wheels": sorted(w.name for w in wheels),
            "sha256": {w.name: sha256_file(w) for w in sorted(wheels)},
            "stored": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "details": details or {}})
        if final.exists():  # an incomplete leftover of an interrupted store
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    entry = lookup(state, key)
    assert entry is not None
    return entry


def read_entry(entry: CachedKernel) -> dict[str, Any]:
    """The entry's `entry.json`: its build record."""
    return json.loads((entry.directory / ENTRY_FILE).read_text(encoding="utf-8"))


def stage_into(entries: list[CachedKernel], kernel_wheels_dir: Path) -> list[Path]:
    """Copy the wheels of `entries` into a build context's `kernel-wheels/` directory."""
    kernel_wheels_dir.mkdir(parents=True, exist_ok=True)
    placed = []
    for entry in entries:
        for wheel in entry.wheels:
            target = kernel_wheels_dir / wheel.name
            shutil.copy2(wheel, target)
            placed.append(target)
    return placed


def find_wheels(directory: Path) -> list[Path]:
    """Wheels an `--output type=local` export left (the stage puts them in /wheels/)."""
    return sorted(Path(directory).rglob("*.whl"))


STATS_SUFFIX = ".build-stats.json"


def read_build_stats(directory: Path) -> dict[str, Any]:
    """What `measure` (templates/files/measure.sh.j2) left beside the wheels: the compile's
    wall time and peak memory, by kernel name. Unreadable files are skipped."""
    stats: dict[str, Any] = {}
    for path in sorted(Path(directory).rglob("*" + STATS_SUFFIX)):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        stats[str(data.get("name") or path.name[:-len(STATS_SUFFIX)])] = data
    return stats


def describe_stats(stats: dict[str, Any]) -> str:
    """`3412 s, peak RSS 7.1 GiB, cgroup peak 9.8 GiB` for one kernel's measure record."""
    parts = [f"{stats.get('seconds', '?')} s"]
    if stats.get("peak_rss_bytes"):
        parts.append(f"peak RSS {stats['peak_rss_bytes'] / 2**30:.1f} GiB")
    if stats.get("cgroup_peak_bytes"):
        parts.append(f"cgroup peak {stats['cgroup_peak_bytes'] / 2**30:.1f} GiB")
    if stats.get("max_jobs"):
        parts.append(f"MAX_JOBS={stats['max_jobs']} NVCC_THREADS={stats.get('nvcc_threads')}")
    return ", ".join(parts)
