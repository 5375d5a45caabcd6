"""Base images made here, so no registry is needed: `infermatrix base build`.

A `debootstrap` base (matrix.yaml `bases.definitions.<name>`) is a Debian rootfs made with
debootstrap from a Debian mirror and imported into the engine with `docker import`, under a tag
derived from its recipe: `infermatrix/base-<name>:<hash of suite, variant, mirror, packages,
architecture>`. The same recipe gives the same tag, so a second `base build` finds the image
and does nothing; render puts the exact tag in `FROM` through `image_ref`.

The mirror, when matrix.yaml says `null`, is the Debian mirror this host's apt uses (deb822
files under /etc/apt/sources.list.d/, else /etc/apt/sources.list); FALLBACK_MIRROR only when
the host has none. The suite, mirror, snapshot date (when the sources name one) and build date
are recorded as image labels.
"""

from __future__ import annotations

import hashlib
import json
import os
import logging
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from ..engine import docker as engine
from ..engine.docker import Engine
from .. import journal, proc
from ..config import Matrix
from ..errors import ConfigError, MissingTool, UnknownChoice
from ..model.spec import os_base
from ..model.spec import CellSpec
from ..state import StatePaths, flocked
from ..watch import Heartbeat
from .steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401

log = logging.getLogger(__name__)

# Used only when matrix.yaml says `mirror: null` and this host has no Debian apt source.
FALLBACK_MIRROR = "http://deb.debian.org/debian"
# What every debootstrap base carries, whatever matrix.yaml lists (the templates rely on it).
REQUIRED_PACKAGES = ("ca-certificates", "python3", "python3-venv")
BASE_REPOSITORY = "infermatrix/base-{name}"
# Bump when the way a base is made changes, so old tags are not reused.
RECIPE_FORMAT = 1
APT_SOURCES_DIR = Path("/etc/apt/sources.list.d")
APT_SOURCES_LIST = Path("/etc/apt/sources.list")


# --------------------------------------------------------------------------------------------
# The host's Debian mirror (pure parsing + a reader)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    # e.g. 20250520T000000Z: a snapshot.debian.org URI, or the snapshot a stanza's comment names
    # (Debian images note the snapshot they were made from that way).
    snapshot: str | None


def parse_deb822_sources(text: str) -> list[AptSource]:
    """Parse a deb822 `.sources` file (stanzas separated by blank lines)."""
    sources = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        noted = snapshot_in(stanza)
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        suites = tuple(fields.get("suites", "").split())
        for uri in fields.get("uris", "").split():
            sources.append(AptSource(uri.rstrip("/"), suites, snapshot_in(uri) or noted))
    return sources


def parse_sources_list(text: str) -> list[AptSource]:
    """Parse one-line-style `deb [opts] URI suite components` entries."""
    sources = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("deb "):
            continue
        line = re.sub(r"\[[^\]]*\]", "", line)
        parts = line.split()
        if len(parts) >= 3:
            sources.append(AptSource(parts[1].rstrip("/"), (parts[2],), snapshot_in(parts[1])))
    return sources


def snapshot_in(text: str) -> str | None:
    """The timestamp of a snapshot.debian.org archive URL in `text`."""
    match = re.search(r"snapshot\.debian\.org/archive/debian/(\d{8}T\d{6}Z)", text)
    return match.group(1) if match else None


def pick_debian_mirror(sources: list[AptSource], suite: str) -> AptSource | None:
    """The main archive (not -security/-updates) serving `suite`, else any non-security one."""
    plain = [s for s in sources if not any("security" in x for x in s.suites)
             and "security" not in s.uri]
    for source in plain:
        if suite in source.suites:
            return source
    return plain[0] if plain else None


def host_apt_sources(sources_dir: Path = APT_SOURCES_DIR,
                     sources_list: Path = APT_SOURCES_LIST) -> list[AptSource]:
    sources: list[AptSource] = []
    if sources_dir.is_dir():
        for path in sorted(sources_dir.glob("*.sources")):
            sources += parse_deb822_sources(path.read_text(encoding="utf-8", errors="replace"))
        for path in sorted(sources_dir.glob("*.list")):
            sources += parse_sources_list(path.read_text(encoding="utf-8", errors="replace"))
    if sources_list.is_file():
        sources += parse_sources_list(sources_list.read_text(encoding="utf-8", errors="replace"))
    return sources


# --------------------------------------------------------------------------------------------
# Recipes and their content-derived tags
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BaseRecipe:
    name: str
    suite: str
    variant: str
    mirror: str
    packages: tuple[str, ...]
    architecture: str
    snapshot: str | None = None
    declared_mirror: str | None = None  # as matrix.yaml says it (None: the host's mirror)

    def key(self) -> dict[str, object]:
        """What decides the content: the tag is a hash of this. Only what matrix.yaml declares
        counts, not what this host's apt sources resolve `mirror: null` to: the tag is written
        into the committed Dockerfiles, which must render the same on every machine."""
        return {"format": RECIPE_FORMAT, "suite": self.suite, "variant": self.variant,
                "mirror": self.declared_mirror or "host", "packages": list(self.packages),
                "architecture": self.architecture,
                "snapshot": snapshot_in(self.declared_mirror or "")}

    @property
    def digest(self) -> str:
        blob = json.dumps(self.key(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def ref(self) -> str:
        return f"{BASE_REPOSITORY.format(name=self.name)}:{self.suite}-{self.digest}"

    def labels(self, built: str) -> dict[str, str]:
        return {
            "io.infermatrix.base": self.name,
            "io.infermatrix.base.strategy": "debootstrap",
            "io.infermatrix.base.suite": self.suite,
            "io.infermatrix.base.variant": self.variant,
            "io.infermatrix.base.mirror": self.mirror,
            # The snapshot the host's sources name (a comment or a snapshot.debian.org URI);
            # packages come from `mirror` as of the build date.
            "io.infermatrix.base.snapshot": self.snapshot or "none",
            "io.infermatrix.base.date": built,
            "io.infermatrix.base.packages": ",".join(self.packages),
            "io.infermatrix.base.recipe": self.digest,
            "org.opencontainers.image.created": built,
            "org.opencontainers.image.title": f"infermatrix base {self.name} ({self.suite})",
        }


def host_architecture() -> str:
    """The Debian architecture name of this host (amd64, arm64)."""
    host = engine.host_platform()
    return DEBIAN_ARCHITECTURES.get(host, host.split("/")[-1])


def definition(matrix: Matrix, base_name: str) -> dict:
    definitions = matrix.bases["definitions"]
    if base_name not in definitions:
        raise UnknownChoice(f"unknown base {base_name!r} "
                            f"(defined: {', '.join(sorted(definitions))})")
    return definitions[base_name]


def recipe_for(matrix: Matrix, base_name: str, sources: list[AptSource] | None = None,
               architecture: str | None = None) -> BaseRecipe:
    """The debootstrap recipe of a base; `sources` default to this host's apt sources."""
    spec = definition(matrix, base_name)
    if spec["strategy"] != "debootstrap":
        raise matrix.error(f"base {base_name!r} has strategy {spec['strategy']!r}, not debootstrap",
                           "bases", "definitions", base_name, "strategy")
    suite = spec.get("suite")
    if not suite:
        raise matrix.error(f"debootstrap base {base_name!r} needs `suite:`",
                           "bases", "definitions", base_name)
    declared = spec.get("mirror")
    mirror, snapshot = declared, None
    if not mirror:
        found = pick_debian_mirror(host_apt_sources() if sources is None else sources, suite)
        mirror, snapshot = (found.uri, found.snapshot) if found else (FALLBACK_MIRROR, None)
    snapshot = snapshot_in(mirror) or snapshot
    packages = tuple(sorted(set(REQUIRED_PACKAGES) | set(spec.get("packages", []))))
    return BaseRecipe(name=base_name, suite=suite, variant=spec.get("variant", "minbase"),
                      mirror=mirror.rstrip("/"), packages=packages,
                      architecture=architecture or host_architecture(), snapshot=snapshot,
                      declared_mirror=declared.rstrip("/") if declared else None)


DEBIAN_ARCHITECTURES = {"linux/amd64": "amd64", "linux/arm64": "arm64"}
QEMU_BINFMT = {"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}


def architecture_of(platform: str | None) -> str | None:
    """Debian's name for an image platform (linux/arm64 -> arm64); None: this host's."""
    return DEBIAN_ARCHITECTURES[platform] if platform else None


def image_ref(matrix: Matrix, base_name: str, platform: str | None = None) -> str:
    """The exact local tag of a base, for `FROM`. A `wheels` base is its `from:` base's image.
    `platform` (linux/arm64) picks the base of that architecture; None: this host's."""
    spec = definition(matrix, base_name)
    if spec["strategy"] == "wheels":
        return image_ref(matrix, os_base(matrix, base_name), platform)
    if spec["strategy"] != "debootstrap":
        raise ConfigError(f"base {base_name!r} is a registry image ({spec.get('image')}); "
                          "it is not built here", matrix.path,
                          matrix.line_of("bases", "definitions", base_name))
    return recipe_for(matrix, base_name, architecture=architecture_of(platform)).ref


# The platform renders treat as the build machine's: the one a debootstrap base's tag is named
# for when a Dockerfile must not depend on the host (an x86_64 machine builds the arm64 cells).
BUILD_PLATFORM = "linux/amd64"


def bytecode_hosts(matrix: Matrix, spec: CellSpec) -> dict[str, str]:
    """Debian architecture -> the debootstrap base of that CPU, for a cell whose byte-code is
    compiled on the build machine's own CPU (templates/blocks/bytecode.j2): a cell for another
    platform than BUILD_PLATFORM on a debootstrap OS. Empty: compiled in the image's stage.
    The Dockerfile picks the entry of the machine that builds (BUILDARCH), so an Arm builder
    compiles natively too; only that one must exist there."""
    name = os_base(matrix, spec.base)
    if (spec.platform == BUILD_PLATFORM
            or matrix.bases["definitions"][name]["strategy"] != "debootstrap"):
        return {}
    return {DEBIAN_ARCHITECTURES[platform]: image_ref(matrix, name, platform)
            for platform in sorted(DEBIAN_ARCHITECTURES)}


def can_run_foreign(architecture: str, binfmt_dir: Path = Path("/proc/sys/fs/binfmt_misc")
                    ) -> bool:
    """Can this host run `architecture` binaries (debootstrap's second stage, RUN lines)?"""
    if architecture == host_architecture():
        return True
    handler = binfmt_dir / QEMU_BINFMT.get(architecture, "none")
    return handler.is_file() and "enabled" in handler.read_text(errors="replace")


def debootstrap_bases(matrix: Matrix) -> list[str]:
    return [name for name, spec in matrix.bases["definitions"].items()
            if spec["strategy"] == "debootstrap"]


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------

@dataclass
class BaseResult:
    name: str
    ref: str
    image_id: str
    built: bool  # False: the tag was there already
    duration_s: float


def _base_lock(recipe: BaseRecipe) -> AbstractContextManager[None]:
    """One builder per recipe on this host at a time (images are engine-wide, not per state
    directory); others wait, then find the image."""
    return flocked(Path(tempfile.gettempdir()) / f"infermatrix-base-{recipe.digest}.lock")


def build_base(matrix: Matrix, base_name: str, state: StatePaths, force: bool = False,
               timeout: float = 1800, platform: str | None = None,
               echo: Callable[[str], None] | None = None, *, docker: Engine) -> BaseResult:
    """Make the base image in `docker` (this machine's engine: debootstrap runs here) for
    `platform`, default this host's, unless its content-derived tag exists already; `echo`
    gets a line a minute while debootstrap runs."""
    recipe = recipe_for(matrix, base_name, architecture=architecture_of(platform))
    if not can_run_foreign(recipe.architecture) and not docker.image_id_of(recipe.ref):
        raise MissingTool(
            f"base {base_name} for {platform}: this {host_architecture()} host cannot run "
            f"{recipe.architecture} programs (debootstrap's second stage and every RUN line need "
            "them)", fix="apt-get install -y qemu-user-static binfmt-support (emulated, slow), "
            f"or build the {platform} cells on a {recipe.architecture} machine "
            "(e.g. the DGX Spark itself: --select '*-sm121')")
    started = time.monotonic()
    with _base_lock(recipe):
        existing = docker.image_id_of(recipe.ref)
        if existing and not force:
            return BaseResult(base_name, recipe.ref, existing, False, time.monotonic() - started)
        if shutil.which("debootstrap") is None:
            raise MissingTool("debootstrap is not installed", fix="apt-get install -y debootstrap")
        log_path = state.logs / "_bases" / f"{base_name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")
        with Heartbeat(f"base {base_name} ({recipe.architecture}): debootstrap and import",
                       echo or (lambda _: None)):
            image_id = _debootstrap_and_import(recipe, log_path, timeout, docker)
    return BaseResult(base_name, recipe.ref, image_id, True, time.monotonic() - started)


def debootstrap_argv(recipe: BaseRecipe, rootfs: Path) -> list[str]:
    return ["debootstrap", f"--variant={recipe.variant}", f"--arch={recipe.architecture}",
            f"--include={','.join(recipe.packages)}", recipe.suite, str(rootfs), recipe.mirror]


def _debootstrap_and_import(recipe: BaseRecipe, log_path: Path, timeout: float,
                            docker: Engine) -> str:
    # /var/tmp: a disk-backed directory (a rootfs with g++ is a few hundred MB).
    with tempfile.TemporaryDirectory(prefix=f"infermatrix-base-{recipe.name}-",
                                     dir="/var/tmp") as tmp:
        rootfs, tarball = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        proc.run(debootstrap_argv(recipe, rootfs), log_path=log_path, timeout=timeout)
        _trim_rootfs(rootfs)
        proc.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."],
                 log_path=log_path, timeout=timeout)
        built = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        changes = [f"LABEL {key}={json.dumps(value)}" for key, value in
                   sorted(recipe.labels(built).items())]
        changes += ['ENV LANG=C.UTF-8', 'CMD ["/bin/bash"]']
        if recipe.architecture != host_architecture():
            return _import_foreign(tarball, recipe, changes, log_path, timeout, docker)
        return docker.import_rootfs(tarball, recipe.ref, changes=changes, log_path=log_path)


def _import_foreign(tarball: Path, recipe: BaseRecipe, changes: list[str],
                    log_path: Path | None, timeout: float, docker: Engine) -> str:
    """A rootfs of another architecture as an image whose config names that architecture:
    BuildKit resolves `--platform linux/arm64` builds only to a local image of that platform,
    and `docker import` (engine 20.10) records the engine's own. A `FROM scratch` build with
    `--platform` records it, from the same tarball, without a registry."""
    context = tarball.parent / "import-context"
    context.mkdir()
    os.link(tarball, context / "rootfs.tar")
    (context / "Dockerfile").write_text("FROM scratch\nADD rootfs.tar /\n" + "\n".join(changes)
                                        + "\n", encoding="utf-8")
    return docker.build_image(engine.BuildRequest(context, tag=recipe.ref,
                                                  platform=f"linux/{recipe.architecture}"),
                              log_path, timeout)


def _trim_rootfs(rootfs: Path) -> None:
    """Drop downloaded .debs and apt lists: they are not part of the recipe's content."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*"):
        for path in rootfs.glob(pattern):
            path.unlink(missing_ok=True)

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """Build (or find) the debootstrap bases the cells stand on, for each image platform. A
    base that cannot be made here (an arm64 base on an x86_64 host without an emulator) fails
    the cells that need it, with the fix, and not the others."""
    from ..errors import InfermatrixError
    debootstrap = set(debootstrap_bases(run.ctx.matrix))
    needs: dict[tuple[str, str], list[str]] = {}
    for cell in cells:
        for name in set(cell.base_chain) & debootstrap:
            for platform in _base_platforms(run, cell):
                needs.setdefault((name, platform), []).append(cell.id)
    made: list[str] = []
    failed: dict[str, str] = {}  # cell -> why
    refs: dict[str, list[str]] = {}
    for (name, platform), needed_by in sorted(needs.items()):
        try:
            result = build_base(run.ctx.matrix, name, run.ctx.state, platform=platform,
                                echo=echo, docker=run.docker)
            echo(f"base {name} ({platform}): {result.ref}")
            made.append(name)
            for cell_id in needed_by:
                refs.setdefault(cell_id, []).append(result.ref)
        except InfermatrixError as exc:
            echo(f"base {name} ({platform}): {exc}")
            failed.update({cell_id: f"base {name} ({platform}): {exc}"
                           for cell_id in needed_by})
    for cell in cells:
        if cell.id in failed:
            journal.record_stage(run.ctx.state, cell.id, "base", journal.Status.FAIL,
                                 reason=failed[cell.id])
        elif cell.id in refs:
            journal.record_stage(run.ctx.state, cell.id, "base", journal.Status.PASS,
                                 details={"images": refs[cell.id]})
    passed = [c.id for c in cells if c.id not in failed]
    return step_record("base", passed, sorted(failed), note=", ".join(sorted(set(made))))


def _base_platforms(run: Run, cell: CellSpec) -> list[str]:
    """The platforms whose base a cell builds on: its image's, and this machine's when its
    byte-code is compiled on the build machine's CPU (templates/blocks/bytecode.j2)."""
    from ..engine.docker import host_platform
    platforms = [cell.platform]
    if bytecode_hosts(run.ctx.matrix, cell) and host_platform() not in platforms:
        platforms.append(host_platform())
    return platforms
