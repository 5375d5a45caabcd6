"""verify-repro: build a rendered cell twice without cache and compare the images file by file.

What is compared: every path of each image's filesystem (`docker create` + `docker export`,
read as a tar stream, never run), with its type, mode, owner, size, SHA-256 of the content
and link target. Hard links count as the file they point to (which name tar lists first
depends on directory order, not on content). Modification times are not compared: Debian's
docker 20.10 BuildKit stamps each written file with the build time and has no way to rewrite
it (docs/repro.md), so they would differ in every file of every build.

The image configuration (Env, Cmd, Entrypoint, Labels, WorkingDir, User, ExposedPorts) is
compared as well. Then the image digests (ids): when they differ, the metadata an id hashes is
compared field by field (`created`, each layer's diff id) and each difference is explained by
what the builder can and cannot clamp (`builder_info`: the BuildKit the daemon embeds). The
report also lists every input of the cell and how it is pinned (`cell_inputs`); an input
pinned by neither hash nor digest is flagged.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any, Iterable

import yaml
from packaging.version import InvalidVersion, Version

from ..stages import build
from ..kernels import kernelcache
from ..engine import docker as engine
from ..engine.docker import Engine
from ..engine.images import layers_of
from ..options import RunOptions
from .. import journal
from ..stages import lock as locks
from ..config import DATA_DIR
from ..context import Context
from ..errors import KernelStageEmpty, StageFailure
from ..model.spec import CellSpec

REPRO_REPOSITORY = "infermatrix-repro"
CONFIG_KEYS = ("Env", "Cmd", "Entrypoint", "Labels", "WorkingDir", "User", "ExposedPorts",
               "Volumes", "StopSignal")
_KINDS = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "dir",
          tarfile.SYMTYPE: "symlink", tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block",
          tarfile.FIFOTYPE: "fifo", tarfile.CONTTYPE: "file"}


@dataclass(frozen=True)
class ImageFile:
    path: str
    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    sha256: str | None = None
    link: str | None = None  # symlink target

    def describe(self) -> str:
        text = f"{self.kind} {self.mode:04o} {self.uid}:{self.gid} {self.size} B"
        if self.sha256:
            text += f" sha256:{self.sha256[:16]}"
        if self.link:
            text += f" -> {self.link}"
        return text


@dataclass(frozen=True)
class Difference:
    path: str
    # only-in-first | only-in-second | kind | mode | owner | size | content | link | config
    what: str
    first: str
    second: str

    def line(self) -> str:
        return f"{self.what:14} {self.path}: {self.first} | {self.second}"


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (the export stream)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:  # a writable buffer (bytearray, memoryview)
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def manifest_of_tar(stream: Iterable[bytes] | io.IOBase) -> dict[str, ImageFile]:
    """path -> ImageFile for every member of a tar stream (read once, front to back)."""
    raw = stream if isinstance(stream, io.IOBase) else io.BufferedReader(
        _ChunkReader(stream), buffer_size=1 << 20)
    entries: dict[str, ImageFile] = {}
    with tarfile.open(fileobj=raw, mode="r|") as archive:
        for member in archive:
            path = _absolute(member.name)
            if member.islnk():  # a hard link is the file it names
                target = entries.get(_absolute(member.linkname))
                if target is not None:
                    entries[path] = ImageFile(path, target.kind, member.mode, member.uid,
                                              member.gid, target.size, target.sha256)
                    continue
            sha = None
            if member.isreg():
                digest = hashlib.sha256()
                handle = archive.extractfile(member)
                assert handle is not None
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
                sha = digest.hexdigest()
            entries[path] = ImageFile(path, _KINDS.get(member.type, "other"), member.mode,
                                      member.uid, member.gid, member.size if member.isreg() else 0,
                                      sha, member.linkname if member.issym() else None)
    return entries


def _absolute(name: str) -> str:
    """`./usr/bin/` or `usr/bin` -> `/usr/bin` (tar member names are relative)."""
    while name.startswith("./"):
        name = name[2:]
    name = name.strip("/")
    return "/" + name if name not in ("", ".") else "/"


def image_manifest(image: str, docker: Engine) -> dict[str, ImageFile]:
    with docker.exported_filesystem(image) as chunks:
        return manifest_of_tar(chunks)


def compare(first: dict[str, ImageFile], second: dict[str, ImageFile]) -> list[Difference]:
    """Every difference between two manifests, sorted by path."""
    differences: list[Difference] = []
    for path in sorted(first.keys() | second.keys()):
        a, b = first.get(path), second.get(path)
        if a is None or b is None:
            what = "only-in-second" if a is None else "only-in-first"
            differences.append(Difference(path, what, a.describe() if a else "-",
                                          b.describe() if b else "-"))
            continue
        for what, left, right in (("kind", a.kind, b.kind),
                                  ("mode", f"{a.mode:04o}", f"{b.mode:04o}"),
                                  ("owner", f"{a.uid}:{a.gid}", f"{b.uid}:{b.gid}"),
                                  ("size", str(a.size), str(b.size)),
                                  ("content", a.sha256 or "", b.sha256 or ""),
                                  ("link", a.link or "", b.link or "")):
            if left != right:
                differences.append(Difference(path, what, left, right))
                break  # one line per path: the first property that differs
    return differences


def compare_config(first: dict[str, Any], second: dict[str, Any]) -> list[Difference]:
    a, b = first.get("Config") or {}, second.get("Config") or {}
    return [Difference(f"config.{key}", "config", json.dumps(a.get(key), sort_keys=True),
                       json.dumps(b.get(key), sort_keys=True))
            for key in CONFIG_KEYS if a.get(key) != b.get(key)]


def category(path: str) -> str:
    """A coarse reason class for a differing path, to read a long list at a glance."""
    if path.endswith(".pyc"):
        return "python bytecode (.pyc)"
    for prefix, name in (("/var/log/", "logs (/var/log)"), ("/var/cache/", "caches (/var/cache)"),
                         ("/var/lib/apt/", "apt lists"), ("/var/lib/dpkg/", "dpkg database"),
                         ("/root/.cache/", "user caches"), ("/tmp/", "temporary files"),
                         ("/etc/", "configuration (/etc)"), ("config.", "image config")):
        if path.startswith(prefix):
            return name
    if "/site-packages/" in path or "/dist-packages/" in path:
        return "python packages"
    return "other"


# --- digests: which metadata differs, and whether this builder can clamp it ----------------

def compare_digests(first: dict[str, Any], second: dict[str, Any]) -> list[Difference]:
    """Why two image ids differ: the fields of the config an id hashes that `docker image
    inspect` shows (`created`, each layer's diff id). Empty when the ids are equal."""
    if first.get("Id") == second.get("Id"):
        return []
    found = [Difference("image.id", "digest", str(first.get("Id")), str(second.get("Id")))]
    if first.get("Created") != second.get("Created"):
        found.append(Difference("config.created", "metadata", str(first.get("Created")),
                                str(second.get("Created"))))
    for index, (a, b) in enumerate(zip_longest(layers_of(first), layers_of(second))):
        if a != b:
            found.append(Difference(f"rootfs.diff_ids[{index}]", "metadata", str(a or "-"),
                                    str(b or "-")))
    return found


def _buildkit_table() -> dict[str, Any]:
    return yaml.safe_load((DATA_DIR / "buildkit.yaml").read_text(encoding="utf-8"))


def embedded_buildkit(daemon_version: str | None) -> str | None:
    """The BuildKit a daemon of this version embeds (data/buildkit.yaml), None if unknown."""
    match = re.match(r"(\d+\.\d+)", daemon_version or "")
    return _buildkit_table()["embedded"].get(match.group(1)) if match else None


def rewrites_timestamps(buildkit: str | None) -> bool | None:
    """Whether that BuildKit can clamp `created` and file mtimes (None: unknown)."""
    if buildkit is None:
        return None
    try:
        return Version(buildkit) >= Version(_buildkit_table()["rewrite_timestamp_since"])
    except InvalidVersion:
        return None


def builder_info(docker: Engine) -> dict[str, Any]:
    """The client, the daemon and the BuildKit the builds ran on, and what that means for
    digests."""
    client = engine.build_client()
    daemon = docker.host_info().get("server_version")
    buildkit = embedded_buildkit(daemon)
    can = rewrites_timestamps(buildkit)
    info: dict[str, Any] = {"client": client.describe(), "daemon": daemon,
                            "buildkit": buildkit or "unknown", "rewrite_timestamp": can,
                            "describe": f"dockerd {daemon} (BuildKit {buildkit or 'unknown'})"}
    if can is False:
        info["why_digests_differ"] = (
            f"BuildKit {buildkit} stamps config.created and history[].created with the build "
            "time and writes every file of a layer with the build time as its mtime, so each "
            "layer tar (diff id), the config and the id differ although every file is the same; "
            "it has no SOURCE_DATE_EPOCH clamp and no rewrite-timestamp. BuildKit >= 0.13 "
            "(dockerd 26, Debian trixie) has both, through an OCI exporter "
            "(docs/repro.md, 'A BuildKit that rewrites timestamps')")
    elif can:
        info["why_digests_differ"] = (
            "this BuildKit can clamp timestamps, but the builds go through the image exporter "
            "(--load), which refuses rewrite-timestamp (\"conflicts with unpack\"): export OCI "
            "archives with rewrite-timestamp=true (docs/repro.md)")
    return info


# --- inputs: every one shown with how it is pinned -------------------------------------------

def _item(value: Any, how: str, pinned: bool) -> dict[str, Any]:
    return {"value": value, "how": how, "pinned": pinned}


def base_input(labels: dict[str, str]) -> dict[str, Any]:
    """The base recipe (debootstrap labels the image inherits from its base)."""
    strategy = labels.get("io.infermatrix.base.strategy")
    if strategy != "debootstrap":
        digest = labels.get("org.opencontainers.image.base.digest")
        return _item(labels.get("org.opencontainers.image.base.name", strategy),
                     f"registry digest {digest}" if digest else "registry tag, no digest",
                     bool(digest))
    mirror = labels.get("io.infermatrix.base.mirror", "")
    value = (f"debootstrap {labels.get('io.infermatrix.base.suite')} "
             f"{labels.get('io.infermatrix.base.variant')} recipe "
             f"{labels.get('io.infermatrix.base.recipe')} from {mirror}")
    if "snapshot.debian.org" in mirror:
        return _item(value, "snapshot mirror", True)
    return _item(value, "recipe hash; packages from the live mirror (snapshot "
                 f"{labels.get('io.infermatrix.base.snapshot')} is only the time stamp)", False)


def lock_input(ctx: Context, cell_id: str) -> tuple[dict[str, Any], str | None]:
    path = locks.lock_path(ctx, cell_id)
    if not path.is_file():
        return _item(None, f"no lock file {path}", False), None
    text = path.read_text(encoding="utf-8")
    return _item(f"{path.relative_to(ctx.root)} {locks.lock_digest(text)}",
                 "uv pip compile --generate-hashes, installed --require-hashes", True), text


def kernel_inputs(lock_text: str | None) -> dict[str, dict[str, Any]]:
    """Each compiled kernel's source: a PyPI sdist by sha256, a local tree by content hash."""
    from ..model.spec import kernel_header_entries

    found = {}
    for name, spec in kernel_header_entries(lock_text):
        sha = re.search(r"sha256:[0-9a-f]{64}", spec)
        tree = re.search(r"tree:[0-9a-f]+", spec)
        how = "sdist sha256" if sha else ("source tree content hash" if tree else "version only")
        found[f"kernel {name}"] = _item(spec, how, bool(sha or tree))
    return found


def nvcc_input(dockerfile_text: str) -> dict[str, Any] | None:
    """The CUDA compiler the toolchain installs (None for a cell without one)."""
    wheel = re.search(r"cuda-toolkit\[[^\]]*\]==([0-9.]+)", dockerfile_text)
    if wheel:
        return _item(f"nvcc {wheel.group(1)} (cuda-toolkit wheels)",
                     "version pin; the wheels are not hash-locked", False)
    apt = re.search(r"cuda-minimal-build-[0-9-]+=([0-9.]+)", dockerfile_text)
    if apt:
        return _item(f"nvcc {apt.group(1)} (NVIDIA apt)", "apt version pin, signed repo", False)
    return None


def cell_inputs(ctx: Context, cell: CellSpec, image_info: dict[str, Any],
                builder: dict[str, Any]) -> dict[str, dict[str, Any]]:
    labels = (image_info.get("Config") or {}).get("Labels") or {}
    dockerfile = (build.cell_dir(ctx, cell.id) / "Dockerfile").read_text(encoding="utf-8")
    lock_item, lock_text = lock_input(ctx, cell.id)
    inputs = {"base": base_input(labels), "lock": lock_item, **kernel_inputs(lock_text)}
    nvcc = nvcc_input(dockerfile)
    if nvcc is not None:
        inputs["nvcc"] = nvcc
    inputs["buildkit"] = _item(f"{builder.get('buildkit')} in dockerd {builder.get('daemon')}",
                               "the host's engine, not pinned by the recipe", False)
    return inputs


@dataclass
class ReproReport:
    cell_id: str
    images: list[str]
    files: list[int]  # entries in each image
    differences: list[Difference] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)
    build_args: dict[str, str] = field(default_factory=dict)
    metadata: list[Difference] = field(default_factory=list)  # why the digests differ
    builder: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        """Files and image config identical (what every builder can reach)."""
        return not self.differences

    @property
    def digest_identical(self) -> bool:
        return len(set(self.images)) == 1

    @property
    def unpinned(self) -> list[str]:
        return [name for name, item in self.inputs.items() if not item.get("pinned")]

    def digest_lines(self) -> list[str]:
        if self.digest_identical:
            return [f"image digest identical: {self.images[0]}"]
        builder = self.builder.get("describe", "this builder")
        lines = [f"image digests differ ({self.images[0][:19]} | {self.images[1][:19]}); the "
                 f"metadata that differs, on {builder}:"]
        lines += ["  " + d.line() for d in self.metadata]
        if self.builder.get("why_digests_differ"):
            lines.append("  why: " + self.builder["why_digests_differ"])
        return lines

    def input_lines(self) -> list[str]:
        lines = ["inputs:"]
        for name, item in self.inputs.items():
            flag = "" if item.get("pinned") else "  UNPINNED"
            lines.append(f"  {name:10} {item.get('value')}  [{item.get('how')}]{flag}")
        return lines

    def by_category(self) -> dict[str, int]:
        return dict(Counter(category(d.path) for d in self.differences).most_common())

    def summary(self, max_list: int = 200) -> str:
        head = (f"{self.cell_id}: builds {self.images[0][:19]} and {self.images[1][:19]} "
                f"({self.files[0]} and {self.files[1]} paths; built in "
                f"{', '.join(f'{d:.0f} s' for d in self.durations_s)})")
        tail = self.digest_lines() + self.input_lines()
        if self.identical:
            same = ("files reproducible: no difference in any path, type, mode, owner, size, "
                    "content or link, nor in the image config (file timestamps not compared)")
            return "\n".join([head, same, *tail])
        lines = [head, f"NOT reproducible: {len(self.differences)} difference(s)"]
        lines += [f"  {n:6d}  {name}" for name, n in self.by_category().items()]
        lines += ["  " + d.line() for d in self.differences[:max_list]]
        if len(self.differences) > max_list:
            lines.append(f"  ... {len(self.differences) - max_list} more (--json lists all)")
        return "\n".join(lines + tail)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(identical=self.identical, by_category=self.by_category(),
                    digest_identical=self.digest_identical, unpinned=self.unpinned)
        return data


def _context_with_kernels(ctx: Context, cell: CellSpec, tmp: Path, build_args: dict[str, str],
                          secrets: dict[str, Path], log_path: Path, run: int,
                          docker: Engine) -> Path:
    """A copy of the cell's context whose kernel-wheels/ this run compiled without cache."""
    directory = build.cell_dir(ctx, cell.id)
    context = tmp / f"context-{run}"
    shutil.copytree(directory, context, symlinks=True)
    wheels_dir = context / build.KERNEL_WHEELS_DIR
    wheels_dir.mkdir(exist_ok=True)
    training = {k.name for k in cell.train_kernels}  # the train target's, not the image's
    for name in build.kernel_stages((directory / "Dockerfile").read_text(encoding="utf-8")):
        if name in training:
            continue
        out = tmp / f"kernel-{name}-{run}"
        docker.build_image(engine.BuildRequest(
            context, target=f"kernel-{name}", build_args=build_args, secrets=secrets,
            output_dir=out, no_cache=True, platform=build.build_platform(cell, docker)), log_path)
        wheels = kernelcache.find_wheels(out)
        if not wheels:
            raise KernelStageEmpty(f"stage kernel-{name} left no wheel in /wheels/")
        for wheel in wheels:
            shutil.copy2(wheel, wheels_dir / wheel.name)
    return context


def build_twice(ctx: Context, cell: CellSpec, log_path: Path,
                build_args: dict[str, str] | None = None,
                secrets: dict[str, Path] | None = None, options: RunOptions | None = None, *,
                docker: Engine) -> tuple[list[str], list[float], dict]:
    """Two complete no-cache builds of a rendered cell (kernels included) on `docker`; their
    image ids. Build args and secrets as `build` sizes them under `options` (--max-jobs,
    --ca-bundle)."""
    options = options or RunOptions()
    dockerfile = build.cell_dir(ctx, cell.id) / "Dockerfile"
    if not dockerfile.is_file():
        raise StageFailure(f"{cell.id}: not rendered ({dockerfile} is missing)",
                           fix=f"run `infermatrix render --select {cell.id}` first")
    stages = [name for name in build.kernel_stages(dockerfile.read_text(encoding="utf-8"))
              if name not in {k.name for k in cell.train_kernels}]  # the serving image's
    if build_args is None:
        build_args = build.compile_plan_for(ctx, [stages], options).build_args()
    if secrets is None:
        secrets = build.secrets_for(options)
    images, durations = [], []
    root = ctx.state.root / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"repro-{cell.id}-", dir=root) as tmp:
        for run in (1, 2):
            started = time.monotonic()
            context = _context_with_kernels(ctx, cell, Path(tmp), build_args, secrets,
                                            log_path, run, docker)
            images.append(docker.build_image(engine.BuildRequest(
                context, tag=f"{REPRO_REPOSITORY}/{cell.id}:{run}",
                target=build.serving_target(dockerfile.read_text(encoding="utf-8")),
                build_args=build_args, secrets=secrets, no_cache=True,
                platform=build.build_platform(cell, docker)), log_path))
            durations.append(time.monotonic() - started)
    return images, durations, build_args


def compare_images(first: str, second: str, docker: Engine
                   ) -> tuple[list[Difference], list[int]]:
    a, b = image_manifest(first, docker), image_manifest(second, docker)
    differences = compare(a, b)
    differences += compare_config(docker.inspect_image(first) or {},
                                  docker.inspect_image(second) or {})
    return differences, [len(a), len(b)]


def verify_repro(ctx: Context, cell: CellSpec, keep: bool = False,
                 options: RunOptions | None = None, *, docker: Engine) -> ReproReport:
    """Build twice without cache, compare files, config and digests, list the inputs; record
    the result (journal field `repro` and <state>/reports/repro-<cell>.json); remove the two
    images unless `keep`."""
    log_path = ctx.state.cell_log(cell.id, "repro")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"# infermatrix verify-repro {cell.id}\n", encoding="utf-8")
    try:
        images, durations, build_args = build_twice(ctx, cell, log_path, options=options,
                                                    docker=docker)
        differences, files = compare_images(images[0], images[1], docker)
        infos = [docker.inspect_image(image) or {} for image in images]
        builder = builder_info(docker)
        inputs = cell_inputs(ctx, cell, infos[0], builder)
    finally:
        if not keep:  # only the two tags this command made
            for run in (1, 2):
                docker.remove_image(f"{REPRO_REPOSITORY}/{cell.id}:{run}")
    report = ReproReport(cell.id, images, files, differences, durations, build_args,
                         metadata=compare_digests(infos[0], infos[1]), builder=builder,
                         inputs=inputs)
    _record(ctx, report, log_path)
    return report


def _record(ctx: Context, report: ReproReport, log_path: Path) -> None:
    path = ctx.state.reports / f"repro-{report.cell_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=1, sort_keys=True) + "\n",
                    encoding="utf-8")
    journal.update(ctx.state, report.cell_id, repro={
        "identical": report.identical, "differences": len(report.differences),
        "digest_identical": report.digest_identical, "unpinned": report.unpinned,
        "by_category": report.by_category(), "report": str(path), "log": str(log_path)})


# --- compiled kernels: two compiles of a kernel stage, compared member by member ------------

@dataclass
class KernelDifference:
    wheel: str
    member: str
    what: str  # only-in-first | only-in-second | content
    sections: list[str] = field(default_factory=list)  # ELF sections whose bytes differ
    device_code_identical: bool | None = None  # .nv_fatbin equal (None: no device code)
    identical_after_strip: bool | None = None  # after `strip --strip-unneeded`
    explanation: str = ""
    derived: bool = False  # follows from the other differences (a RECORD lists their hashes)

    def line(self) -> str:
        return f"{self.what:14} {self.wheel}!{self.member}: {self.explanation}"


@dataclass
class KernelReproReport:
    cell_id: str
    kernel: str
    wheels: list[str]
    members: int
    sources: list[str]  # where each compile came from ("fresh compile 1", "kernel cache ...")
    differences: list[KernelDifference] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences

    @property
    def explained(self) -> bool:
        """Every difference is in local symbols only (identical after strip, device code equal)
        or follows from those (the RECORD that lists their hashes); False when nothing but
        derived differences remain, which cannot happen for an honest RECORD."""
        primary = [d for d in self.differences if not d.derived]
        return bool(primary) and all(d.identical_after_strip for d in primary)

    def summary(self) -> str:
        head = (f"{self.cell_id} kernel {self.kernel}: {len(self.wheels)} wheel(s), "
                f"{self.members} members, {' vs '.join(self.sources)}")
        if self.identical:
            return head + "\n  bit-identical: every member of every wheel"
        lines = [head, f"  {len(self.differences)} member(s) differ"
                 + (" (all explained: local symbols only)" if self.explained else "")]
        return "\n".join(lines + ["  " + d.line() for d in self.differences])


def wheel_members(wheel: Path) -> dict[str, bytes]:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()
                if not info.is_dir()}


def elf_sections(data: bytes) -> dict[str, bytes] | None:
    """Section name -> bytes of an ELF file, or None when it is not one."""
    if not data.startswith(b"\x7fELF"):
        return None
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(data))
    return {s.name: s.data() for s in elf.iter_sections() if s.header.sh_type != "SHT_NOBITS"}


def stripped(data: bytes) -> bytes:
    """The bytes of `strip --strip-unneeded` applied to an ELF object (binutils, logged)."""
    from .. import proc

    with tempfile.TemporaryDirectory(prefix="infermatrix-strip-") as tmp:
        path = Path(tmp) / "object"
        path.write_bytes(data)
        proc.run(["strip", "--strip-unneeded", str(path)], check=True)
        return path.read_bytes()


def explain_member(wheel: str, member: str, first: bytes, second: bytes) -> KernelDifference:
    sections_a, sections_b = elf_sections(first), elf_sections(second)
    if sections_a is None or sections_b is None:
        return KernelDifference(wheel, member, "content", explanation=(
            f"not an ELF object ({len(first)} vs {len(second)} B)"))
    differing = sorted(name for name in sections_a.keys() | sections_b.keys()
                       if sections_a.get(name) != sections_b.get(name))
    fatbin = sections_a.get(".nv_fatbin")
    device_same = None if fatbin is None else fatbin == sections_b.get(".nv_fatbin")
    after_strip = stripped(first) == stripped(second)
    text = f"sections {', '.join(differing) or '(none: layout only)'} differ"
    if device_same is not None:
        text += "; device code (.nv_fatbin) " + ("identical" if device_same else "DIFFERS")
    if after_strip:
        text += ("; identical after `strip --strip-unneeded`: the local symbols name nvcc's "
                 "temporary files (tmpxft_<pid>_...), whose PIDs depend on scheduling; "
                 "linking with -Wl,--discard-all drops them")
    return KernelDifference(wheel, member, "content", differing, device_same, after_strip, text)


def compare_kernel_wheels(first: list[Path], second: list[Path]
                          ) -> tuple[list[KernelDifference], int]:
    """Every differing member of the same-named wheels of two compiles, explained."""
    by_name = {w.name: w for w in second}
    differences, members = [], 0
    for wheel in sorted(first, key=lambda w: w.name):
        other = by_name.get(wheel.name)
        if other is None:
            differences.append(KernelDifference(wheel.name, "*", "only-in-first",
                                                explanation="no wheel of that name"))
            continue
        a, b = wheel_members(wheel), wheel_members(other)
        members += len(a.keys() | b.keys())
        for member in sorted(a.keys() | b.keys()):
            if member not in a or member not in b:
                what = "only-in-second" if member not in a else "only-in-first"
                differences.append(KernelDifference(wheel.name, member, what,
                                                    explanation="present in one compile only"))
            elif a[member] != b[member]:
                if member.endswith(".dist-info/RECORD"):
                    differences.append(KernelDifference(
                        wheel.name, member, "content",
                        explanation="the hashes of the members listed above", derived=True))
                    continue
                differences.append(explain_member(wheel.name, member, a[member], b[member]))
    for wheel in second:
        if wheel.name not in {w.name for w in first}:
            differences.append(KernelDifference(wheel.name, "*", "only-in-second",
                                                explanation="no wheel of that name"))
    return differences, members


COMPILE_NONCE_ARG = build.COMPILE_NONCE_ARG


def compile_kernel_again(ctx: Context, cell: CellSpec, name: str, out: Path,
                         build_args: dict[str, str], secrets: dict[str, Path],
                         log_path: Path, docker: Engine) -> list[Path]:
    """A real compile of kernel stage `name` on the cached toolchain: a nonce never used before
    (so no earlier compile can be reused from the cache) reruns the compile RUN only."""
    nonce = uuid.uuid4().hex
    docker.build_image(engine.BuildRequest(
        build.cell_dir(ctx, cell.id), target=f"kernel-{name}",
        build_args={**build_args, COMPILE_NONCE_ARG: nonce}, secrets=secrets, output_dir=out,
        platform=build.build_platform(cell, docker)), log_path)
    wheels = kernelcache.find_wheels(out)
    if not wheels:
        raise KernelStageEmpty(f"stage kernel-{name} left no wheel in /wheels/")
    return wheels


def verify_kernels(ctx: Context, cell: CellSpec, against_cache: bool = False,
                   options: RunOptions | None = None, *, docker: Engine
                   ) -> list[KernelReproReport]:
    """Compile each kernel stage of the cell (its compile step again, on the cached toolchain:
    compile_kernel_again) and compare the wheels member by member with a second such compile,
    or (`against_cache`) with the wheel the kernel cache holds for the same key (what a rebuild
    of the cell would otherwise reuse)."""
    dockerfile = build.cell_dir(ctx, cell.id) / "Dockerfile"
    if not dockerfile.is_file():
        raise StageFailure(f"{cell.id}: not rendered",
                           fix=f"run `infermatrix render --select {cell.id}`")
    text = dockerfile.read_text(encoding="utf-8")
    stages = build.kernel_stages(text)
    if not stages:
        raise StageFailure(f"{cell.id} compiles no kernel (no kernel-* stage)")
    options = options or RunOptions()
    build_args = build.compile_plan_for(ctx, [stages], options).build_args()
    secrets = build.secrets_for(options)
    keys = build.kernel_keys_for(ctx, cell, text)
    log_path = ctx.state.cell_log(cell.id, "repro-kernels")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"# infermatrix verify-repro --kernels {cell.id}\n", encoding="utf-8")
    reports = []
    root = ctx.state.root / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    for name in stages:
        with tempfile.TemporaryDirectory(prefix=f"repro-kernel-{name}-", dir=root) as tmp:
            compiles, sources, durations = [], [], []
            cached = kernelcache.lookup(ctx.state, keys[name]) if against_cache else None
            if against_cache and cached is None:
                raise StageFailure(f"{cell.id}: the kernel cache holds no {name} for "
                                   f"{keys[name].slug}",
                                   fix="build the cell first or drop --against-cache")
            if cached is not None:
                compiles.append(cached.wheels)
                sources.append(f"kernel cache {keys[name].slug}")
            for run in range(1, 3 - len(compiles)):
                started = time.monotonic()
                compiles.append(compile_kernel_again(ctx, cell, name, Path(tmp) / str(run),
                                                     build_args, secrets, log_path, docker))
                durations.append(round(time.monotonic() - started, 1))
                sources.append(f"fresh compile {run}")
            differences, members = compare_kernel_wheels(compiles[0], compiles[1])
            kept = ctx.state.reports / f"repro-kernels-{cell.id}" / name
            for index, wheels in enumerate(compiles, start=1):  # kept, to look at the bytes
                (kept / str(index)).mkdir(parents=True, exist_ok=True)
                for wheel in wheels:
                    shutil.copy2(wheel, kept / str(index) / wheel.name)
            reports.append(KernelReproReport(cell.id, name, [w.name for w in compiles[0]],
                                             members, sources, differences, durations))
    path = ctx.state.reports / f"repro-kernels-{cell.id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(r) | {"identical": r.identical, "explained": r.explained}
                                for r in reports], indent=1, sort_keys=True) + "\n",
                    encoding="utf-8")
    journal.update(ctx.state, cell.id, repro_kernels={
        r.kernel: {"identical": r.identical, "explained": r.explained,
                   "differences": len(r.differences), "members": r.members,
                   "sources": r.sources, "report": str(path)} for r in reports})
    return reports
