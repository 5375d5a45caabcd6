"""The CycloneDX SBOM of a built cell image, made with cyclonedx-python-lib and checked against
the CycloneDX JSON schema by its validator (`infermatrix sbom CELL|IMAGE`; publish attests it).

Components:
  - every Python package of the cell's lock (`locks/<cell>.txt`), with the lock's sha256 hashes
    (purl pkg:pypi);
  - the Debian packages installed in the image (its /var/lib/dpkg/status, the base's OS), purl
    pkg:deb/debian with the arch;
  - the CUDA components: the CUDA release of the cell and the NVIDIA CUDA wheels of the lock
    (nvidia-*, cuda-*), each marked `infermatrix:cuda`;
  - each compiled kernel wheel: the wheel's sha256 (the kernel cache's record), its source
    sdist and that sdist's sha256 (the lock header's pin) or the source tree's hash, the arches
    and the compile flags (the kernel's env) it was built with.
The pure part (`document`) takes texts and records; `image_facts` reads the image (engine).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..journal import CellRecord
from .. import __version__
from ..errors import StageFailure
from ..engine.docker import Engine
from ..model.cell import CPU, Cell
from ..model.spec import LockedPackage, lock_packages  # noqa: F401  (the lock's one parser)

if TYPE_CHECKING:  # cyclonedx is imported where it runs: it costs every CLI start otherwise
    from cyclonedx.model import HashType
    from cyclonedx.model.bom import Bom

    from ..context import Context

CUDA_PREFIXES = ("nvidia-", "cuda-")
DPKG_STATUS = "/var/lib/dpkg/status"


@dataclass
class DebPackage:
    name: str
    version: str
    arch: str
    source: str | None = None


def dpkg_packages(status: str) -> list[DebPackage]:
    """The installed packages of a dpkg status file."""
    found = []
    for stanza in status.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if fields.get("Package") and "installed" in fields.get("Status", "").split():
            if fields.get("Status", "").endswith(" installed"):
                found.append(DebPackage(fields["Package"], fields.get("Version", ""),
                                        fields.get("Architecture", ""),
                                        fields.get("Source")))
    return sorted(found, key=lambda p: p.name)


@dataclass
class KernelWheel:
    """One compiled kernel wheel: from the build's journal details and the kernel cache."""
    name: str  # the build.kernels key
    package: str
    version: str
    wheel: str
    sha256: str | None
    archs: list[str]
    flags: dict[str, str]
    sdist: str | None = None
    sdist_sha256: str | None = None
    source_tree: str | None = None  # `src-<hash>` for a path: kernel


def _hashes(values: list[str]) -> list[HashType]:
    from cyclonedx.model import HashAlgorithm, HashType
    return [HashType(alg=HashAlgorithm.SHA_256, content=v) for v in values]


def document(cell: Cell, image_id: str, lock_text: str | None, dpkg_status: str | None,
             kernels: list[KernelWheel], labels: dict[str, str] | None = None,
             timestamp: str | None = None) -> Bom:
    """The cyclonedx Bom of a cell image (validated by `to_json`)."""
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.model.component import Component as ToolComponent
    from packageurl import PackageURL
    import datetime

    labels = labels or {}
    when = datetime.datetime.now(datetime.timezone.utc)
    if timestamp:
        try:
            when = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=datetime.timezone.utc)
        except ValueError:
            pass
    subject = Component(
        type=ComponentType.CONTAINER, name=cell.id, version=image_id, bom_ref=f"image:{cell.id}",
        properties=[Property(name=f"infermatrix:{k.removeprefix('io.infermatrix.')}", value=v)
                    for k, v in sorted(labels.items()) if k.startswith("io.infermatrix.")])
    tools = ToolRepository(components=[ToolComponent(type=ComponentType.APPLICATION,
                                                     name="infermatrix", version=__version__)])
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"infermatrix:{cell.id}:{image_id}"),
              metadata=BomMetaData(component=subject, tools=tools, timestamp=when))
    components = []
    for pkg in lock_packages(lock_text or ""):
        cuda = pkg.name.lower().startswith(CUDA_PREFIXES)
        components.append(Component(
            type=ComponentType.LIBRARY, name=pkg.name, version=pkg.version,
            bom_ref=f"pypi:{pkg.name.lower()}@{pkg.version}",
            purl=PackageURL("pypi", name=pkg.name.lower(), version=pkg.version),
            hashes=_hashes(pkg.hashes),
            properties=[Property(name="infermatrix:source", value="lock")] +
            ([Property(name="infermatrix:cuda", value="true")] if cuda else [])))
    for deb in dpkg_packages(dpkg_status or ""):
        components.append(Component(
            type=ComponentType.LIBRARY, name=deb.name, version=deb.version,
            bom_ref=f"deb:{deb.name}@{deb.version}:{deb.arch}",
            purl=PackageURL("deb", namespace="debian", name=deb.name, version=deb.version,
                            qualifiers={"arch": deb.arch} if deb.arch else None),
            properties=[Property(name="infermatrix:source", value="dpkg-status")]))
    if cell.cuda != CPU:
        components.append(Component(
            type=ComponentType.FRAMEWORK, name="cuda", version=cell.cuda,
            bom_ref=f"cuda:{cell.cuda}", group="nvidia",
            properties=[Property(name="infermatrix:cuda", value="true"),
                        Property(name="infermatrix:arch", value=cell.arch)]))
    for kernel in kernels:
        props = [Property(name="infermatrix:kernel", value=kernel.name),
                 Property(name="infermatrix:archs", value=",".join(kernel.archs))]
        props += [Property(name=f"infermatrix:flag:{k}", value=v)
                  for k, v in sorted(kernel.flags.items())]
        props += [Property(name=f"infermatrix:{k}", value=v)
                  for k, v in (("sdist", kernel.sdist), ("sdist-sha256", kernel.sdist_sha256),
                               ("source-tree", kernel.source_tree)) if v]
        components.append(Component(
            type=ComponentType.LIBRARY, name=kernel.package, version=kernel.version,
            bom_ref=f"kernel:{kernel.name}:{kernel.wheel}",
            purl=PackageURL("pypi", name=kernel.package.lower(), version=kernel.version,
                            qualifiers={"file_name": kernel.wheel}),
            hashes=_hashes([kernel.sha256] if kernel.sha256 else []), properties=props))
    unique: dict[str, Component] = {}
    for component in components:  # one dpkg entry per name:arch, but be safe
        unique.setdefault(str(component.bom_ref), component)
    bom.components.update(unique.values())
    bom.register_dependency(subject, list(bom.components))  # the image holds each of them
    return bom


def to_json(bom: Bom) -> str:
    """The document as CycloneDX 1.6 JSON, validated against the schema (StageFailure if not)."""
    from cyclonedx.output.json import JsonV1Dot6

    text = JsonV1Dot6(bom).output_as_string(indent=2)
    error = validation_error(text)
    if error is not None:
        raise StageFailure(f"the SBOM does not validate against CycloneDX 1.6: {error}")
    return text


def validation_error(text: str) -> str | None:
    """The CycloneDX 1.6 schema's complaint about a JSON document, or None."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    return None if error is None else str(error)


# --- facts of a built image -----------------------------------------------------------------

def kernel_wheels(ctx: Context, record: CellRecord, lock_text: str | None) -> list[KernelWheel]:
    """The kernel wheels a cell's build installed: journal build.details.kernels, each key's
    kernel cache record (wheel sha256, arches, flags), the lock header's sdist pin."""
    from ..model.spec import kernel_pins_from_lock
    from packaging.utils import canonicalize_name

    pins = kernel_pins_from_lock(lock_text or "") if lock_text else {}
    found = []
    for name, kernel in sorted(record.build.kernels.items()):
        entry_path = ctx.state.kernels / str(kernel.get("key", "")) / "entry.json"
        entry: dict[str, Any] = {}
        if kernel.get("key") and entry_path.is_file():
            try:
                entry = json.loads(entry_path.read_text(encoding="utf-8"))
            except ValueError:
                entry = {}
        key = entry.get("key") or {}
        spec = (ctx.matrix.build.get("kernels") or {}).get(name) or {}
        package = key.get("package") or spec.get("package") or name
        version = str(key.get("version") or spec.get("version") or "")
        pin = pins.get(canonicalize_name(package)) or {}
        for wheel in kernel.get("wheels") or entry.get("wheels") or []:
            if version.startswith("src-"):  # a source tree: the wheel's own version
                wheel_version = wheel.split("-")[1] if wheel.count("-") >= 2 else version
            else:
                wheel_version = pin.get("version") or version
            found.append(KernelWheel(
                name=name, package=package, version=wheel_version, wheel=wheel,
                sha256=(entry.get("sha256") or {}).get(wheel),
                archs=list(key.get("archs") or []), flags=dict(key.get("env") or {}),
                sdist=pin.get("sdist") or None, sdist_sha256=pin.get("sha256") or None,
                source_tree=version if version.startswith("src-") else None))
    return found


def image_facts(image: str, docker: Engine) -> tuple[dict[str, Any], str | None]:
    """(the image's inspect record, its dpkg status text) read from `docker` without running
    it."""
    import tempfile

    info = docker.inspect_image(image)
    if info is None:
        raise StageFailure(f"image {image} is not in Docker; build it first (`infermatrix "
                           "build`) or pull it (`infermatrix pull`)")
    with tempfile.TemporaryDirectory(prefix="infermatrix-sbom-") as tmp:
        copied = docker.copy_from_image(info["Id"], [DPKG_STATUS], Path(tmp))
        path = copied.get(DPKG_STATUS)
        status = path.read_text(encoding="utf-8", errors="replace") if path else None
    return info, status


def build_sbom(ctx: Context, cell: Cell, image_id: str, record: CellRecord, lock_text: str | None,
               docker: Engine) -> str:
    """The validated CycloneDX JSON of a cell's built image (in `docker`); its Python pins from
    the cell's lock text (a CellSpec's: read once per run)."""
    info, status = image_facts(image_id, docker)
    labels = (info.get("Config") or {}).get("Labels") or {}
    build = record.stage("build")
    finished = build.finished if build else None
    bom = document(cell, info["Id"], lock_text, status, kernel_wheels(ctx, record, lock_text),
                   labels, finished or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return to_json(bom)
