"""plan: expand matrix.yaml into cells and prune the impossible ones, each with its reasons.

Engine versions may be selectors (`latest`, `floor`, `{versions: ">=0.5.10", newest: 3}`),
resolved from the index's release list; torch follows the engine's own pin (`torch:
from-engine`, the default) or an explicit list, from which the torches an engine forbids are
dropped before any cell exists. Rule evaluation is pure; the I/O is the index (release lists
and wheel METADATA through `index`, disk-cached, offline-capable) and, for planned cells that
need an index off PyPI, one existence check of that source.
"""

from __future__ import annotations

import datetime
import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlparse

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..config import Matrix
from ..context import Context
from ..model.coverage import Coverage, decide
from ..errors import UnknownChoice
from ..model.index import (IndexUnavailable, MetadataCache, NotOnIndex, ReleaseList, ReleaseMetadata,
                           index_lists, release_list, url_exists)
from ..options import from_environment, package_index
from .. import journal
from ..model.cell import CPU, Cell, CellPlan, CellSettings, Verdict
from ..model.rules import (EngineFacts, backend_choice, cuda_of_requirements, driver_floor,
                           FLASHINFER_ARCH_ENV, engine_env, evaluate, exact_pin,
                           flashinfer_version, load_rules, pypi_build_covers,
                           torch_satisfies,
                           torch_variant, torch_variant_known)
from ..model.selectors import Selection, matches
from ..model.spec import machine_of, serve_args
from ..model.spec import CellSpec
from ..model.wheelcode import WheelCodeCache
from ..model.kernelsyms import CannotDecompress
from ..model.profiles import (GemmRead, ProfilePlan, judge_profile, path_entry,
                              profile_specs)
from .steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401

# (name, version, machine) -> metadata of that release's Linux wheel for the machine
MetadataSource = Callable[..., ReleaseMetadata]
# name -> the releases on the index
ReleaseSource = Callable[[str], ReleaseList]
# url -> True (exists) / False (404) / None (cannot be reached)
ExistsCheck = Callable[[str], "bool | None"]

FROM_ENGINE = "from-engine"
FORBIDDEN_TORCH = "torch the engine's pin forbids (engine-torch-pin)"


def _parse_engine(spec: str) -> tuple[str, str]:
    name, _, version = spec.partition("==")
    return name, version


# --- engine versions -------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineChoice:
    """One engine release an axis entry selects (or could not resolve)."""

    engine: str
    version: str  # the exact release; the selector text when unresolved
    selector: str  # "==0.5.10", "latest", "floor", ">=0.5.10 newest 3"
    where: tuple[Any, ...]  # key path in matrix.yaml (for errors)
    resolved_at: str | None = None  # when the release list said so (None: an exact pin)
    index: str | None = None
    unresolved: str | None = None  # why it could not be resolved (index unreachable)
    passed_over: tuple[str, ...] = ()  # newer releases the selector skipped, each with why

    def record(self) -> dict[str, Any]:
        record = {"selector": self.selector,
                  "version": None if self.unresolved else self.version,
                  "resolved_at": self.resolved_at, "index": self.index}
        return record | ({"passed_over": list(self.passed_over)} if self.passed_over else {})


def passed_over_notes(plans: Iterable[CellPlan]) -> list[str]:
    """One line per selector that passed over a newer release (not installable from the index
    yet), each said once: "vllm latest = 0.33.0, not the newest 0.34.0: it pins ...". `plan`,
    the pipeline's plan step and the report say it where it is seen, not only at the end."""
    seen: dict[tuple[str, str, str], list[str]] = {}
    for plan in plans:
        resolution = plan.resolution or {}
        for why in resolution.get("passed_over", []):
            key = (plan.cell.engine, str(resolution.get("selector", "")),
                   str(resolution.get("version") or plan.cell.engine_version))
            seen.setdefault(key, []).append(why)
    lines = []
    for (engine, selector, version), whys in sorted(seen.items()):
        for why in dict.fromkeys(whys):
            newer, _, reason = why.partition(": ")
            lines.append(f"{engine} {selector} = {version}, not the newest release {newer}: "
                         f"{reason}; an install from another index (the engine's own wheel "
                         f"index) may already run {newer}")
    return lines


def _engine_entries(m: Matrix) -> list[tuple[str, Any, tuple[Any, ...]]]:
    """(engine, selector value, key path) of every `axes.engine` entry, list or mapping form."""
    axis = m.data["axes"]["engine"]
    if isinstance(axis, list):
        return [(*_parse_engine(spec), ("axes", "engine", i)) for i, spec in enumerate(axis)]
    entries: list[tuple[str, Any, tuple[Any, ...]]] = []
    for name, value in axis.items():
        if isinstance(value, list):
            entries += [(name, v, ("axes", "engine", name, j)) for j, v in enumerate(value)]
        else:
            entries.append((name, value, ("axes", "engine", name)))
    return entries


def _selector(m: Matrix, engine: str, value: Any) -> tuple[str, SpecifierSet | None, int, bool]:
    """(label, specifier, count, oldest) of a selector; specifier None for an exact pin."""
    floor = m.floors.get(engine, SpecifierSet())
    if isinstance(value, dict):
        spec = SpecifierSet(value.get("versions", "")) & floor
        count = int(value.get("newest", 1))
        return f"{value.get('versions', str(floor))} newest {count}", spec, count, False
    text = str(value).strip()
    if text == "latest":
        return "latest", floor, 1, False
    if text == "floor":
        return "floor", floor, 1, True
    if text.startswith("==") or text[:1].isdigit():
        return f"=={text.lstrip('=')}", None, 1, False
    return text, SpecifierSet(text) & floor, 1, False


def resolve_engines(m: Matrix, releases: ReleaseSource | None,
                    gatherer: FactGatherer | None = None) -> list[EngineChoice]:
    """Every engine release the axis selects, in axis order, each once. With `gatherer`, a
    release that cannot be installed yet (it pins a dependency release the index does not
    have: vLLM 0.34.0 pinned flashinfer-python==0.7.3 the day it came out) is passed over for
    the next one, and the choice records why."""
    choices: dict[tuple[str, str], EngineChoice] = {}
    for engine, value, where in _engine_entries(m):
        label, spec, count, oldest = _selector(m, engine, value)
        if spec is None:
            version = label[2:]
            choices.setdefault((engine, version), EngineChoice(engine, version, label, where))
            continue
        package = m.engines[engine].get("package")
        if not package:
            raise m.error(f"engine {engine!r} has no package to resolve {label!r} against",
                          *where, fix="pin an exact version (name==X)")
        if releases is None:
            raise m.error(f"{engine} {label!r} needs the package index's release list", *where)
        try:
            listing = releases(package)
        except IndexUnavailable as exc:
            key = (engine, label)
            choices.setdefault(key, EngineChoice(engine, label, label, where,
                                                 unresolved=f"index unreachable: {exc}"))
            continue
        picked, passed_over = _pick(listing, spec, count, oldest,
                                    _not_installable(gatherer, releases, package))
        if not picked and not passed_over:
            raise m.error(_no_match_message(package, label, spec, listing), *where,
                          fix="widen the specifier or pin one of the releases listed")
        if not picked:  # every candidate is waiting for a dependency: plan the newest anyway,
            picked, passed_over = _pick(listing, spec, count, oldest)  # lock prunes it
        for version in picked:
            key = (engine, version)
            if key in choices:  # `latest` and `floor` may name the same release
                old = choices[key]
                choices[key] = replace(old, selector=f"{old.selector}, {label}")
            else:
                choices[key] = EngineChoice(engine, version, label, where,
                                            resolved_at=listing.fetched_at, index=listing.url,
                                            passed_over=tuple(passed_over))
    return list(choices.values())


# how many uninstallable releases a selector looks past before it gives up on skipping
MAX_PASSED_OVER = 3


def _pick(listing: ReleaseList, spec: SpecifierSet, count: int, oldest: bool,
          why_not: Callable[[str], str | None] | None = None) -> tuple[list[str], list[str]]:
    """(picked, passed over with why) of a selector: newest first (`oldest`: the floor
    release), skipping the releases `why_not` says cannot install."""
    found = listing.newest(spec, len(listing.versions))
    ordered = list(reversed(found)) if oldest else found
    wanted = 1 if oldest else count
    if why_not is None:
        return ordered[:wanted], []
    picked: list[str] = []
    passed_over: list[str] = []
    for version in ordered:
        if len(picked) == wanted:
            break
        reason = why_not(version) if len(passed_over) < MAX_PASSED_OVER else None
        if reason:
            passed_over.append(f"{version}: {reason}")
        else:
            picked.append(version)
    return picked, passed_over


def _not_installable(gatherer: FactGatherer | None, releases: ReleaseSource | None,
                     package: str) -> Callable[[str], str | None] | None:
    """Why a release of `package` cannot be installed from the index today (one of its exact
    pins names a release the index does not list), else None. Pins with a local version
    (`torch==2.13.0+cpu`) live on another index and are left to the lock."""
    if gatherer is None or releases is None:
        return None

    def why_not(version: str) -> str | None:
        try:
            pins = gatherer.facts(package, version).exact_pins
        except (IndexUnavailable, NotOnIndex):
            return None  # the plan judges it with its facts
        for name, pinned in pins:
            if "+" in pinned:
                continue
            try:
                listing = releases(name)
            except IndexUnavailable:
                return None
            except NotOnIndex:
                return f"it pins {name}=={pinned}, and the index has no {name}"
            if not any(Version(v) == Version(pinned) for v in listing.versions
                       if _is_version(v)):
                return f"it pins {name}=={pinned}, which {listing.url} does not have (yet)"
        return None
    return why_not


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _no_match_message(package: str, label: str, spec: SpecifierSet, listing: ReleaseList) -> str:
    shown = list(reversed(listing.versions))[:12]
    more = f" (and {len(listing.versions) - 12} older)" if len(listing.versions) > 12 else ""
    return (f"{package} {label!r} ({spec or 'any'}) matches no release on {listing.url}; "
            f"releases there: {', '.join(shown) or 'none'}{more}")


# --- facts from the index --------------------------------------------------------------------
@dataclass
class FactGatherer:
    """Engine and torch facts from package metadata, read once per release (memoised)."""

    source: MetadataSource
    _memo: dict[tuple[str, str, str], Any] = field(default_factory=dict)

    def _cached(self, key: tuple[str, str, str], read: Callable[[], Any]) -> Any:
        if key not in self._memo:
            try:
                self._memo[key] = read()
            except (IndexUnavailable, NotOnIndex) as exc:
                self._memo[key] = exc
        value = self._memo[key]
        if isinstance(value, Exception):
            raise value
        return value

    def facts(self, package: str, version: str, machine: str = "x86_64") -> EngineFacts:
        return self._cached((package, version, machine),
                            lambda: self._read(package, version, machine))

    def torch_cuda(self, version: str, machine: str = "x86_64") -> str:
        """CUDA runtime of PyPI's torch wheel for `version`, from its METADATA."""
        public = version.split("+", 1)[0]
        return self._cached(("torch:cuda", public, machine), lambda: cuda_of_requirements(
            self.source("torch", public, machine).requires_dist))

    def _read(self, package: str, version: str, machine: str) -> EngineFacts:
        meta = self.source(package, version, machine)
        pins = tuple(str(r) for r in meta.pins_for("torch", machine))
        pinned = exact_pin(pins) if pins else None
        torch_cuda = self.torch_cuda(pinned, machine) if pinned else None
        return EngineFacts(metadata_url=meta.url, torch_pins=pins, pinned_torch=pinned,
                           torch_cuda=torch_cuda, wheel=meta.wheel,
                           exact_pins=_exact_pins(meta, machine))


def _exact_pins(meta: ReleaseMetadata, machine: str) -> tuple[tuple[str, str], ...]:
    pins = []
    for req in meta.requirements(machine):
        version = exact_pin((str(req),)) if req.specifier else None
        if version:
            pins.append((canonicalize_name(req.name), version))
    return tuple(pins)


@dataclass
class ExpandedCell:
    """A generated cell before the rules: where it came from and what expansion found."""

    cell: Cell
    origin: str  # "axes" or "include[N]"
    choice: EngineChoice | None = None
    verdicts: list[Verdict] = field(default_factory=list)  # found while expanding
    unresolved: str | None = None


@dataclass
class Expansion:
    candidates: list[ExpandedCell]
    not_generated: dict[str, int] = field(default_factory=dict)  # reason -> combinations


def _torch_axis(m: Matrix) -> list[str] | None:
    """The explicit torch list, or None for `from-engine` (the default)."""
    value = m.data["axes"].get("torch", FROM_ENGINE)
    return None if value == FROM_ENGINE else list(value)


def _check_torch_exists(m: Matrix, gatherer: FactGatherer | None, version: str,
                        where: tuple[Any, ...]) -> None:
    if gatherer is None:
        return
    try:
        gatherer.torch_cuda(version)
    except NotOnIndex as exc:
        raise m.error(f"torch {version} is not on the package index ({exc})", *where,
                      fix="use a torch release the index has, or `torch: from-engine`") from None
    except IndexUnavailable:
        pass  # a network condition: the cells say so


def _engine_facts(m: Matrix, gatherer: FactGatherer, choice: EngineChoice,
                  machine: str) -> EngineFacts:
    """Facts of the choice's wheel for `machine`; a release with no Linux wheel at all is a
    config error at its axis entry (NotOnIndex for one machine only stays the cell's verdict)."""
    package = m.engines[choice.engine]["package"]
    try:
        return gatherer.facts(package, choice.version, machine)
    except NotOnIndex as exc:
        other = "aarch64" if machine == "x86_64" else "x86_64"
        try:
            gatherer.facts(package, choice.version, other)
        except NotOnIndex:
            raise m.error(f"{package} {choice.version} is not on the package index ({exc})",
                          *choice.where, fix="pick a release the index has (a selector such "
                          "as `latest` resolves one)") from None
        except IndexUnavailable:
            pass
        raise


def _torches_for(m: Matrix, gatherer: FactGatherer | None, releases: ReleaseSource | None,
                 choice: EngineChoice, machine: str
                 ) -> tuple[list[str], list[Verdict], str | None]:
    """(torch versions, verdicts, unresolved) of an engine release on `machine`."""
    listed = _torch_axis(m)
    package = m.engines[choice.engine].get("package")
    if choice.unresolved:
        return listed or [FROM_ENGINE], [], choice.unresolved
    if not package or gatherer is None:
        if listed is None:
            raise m.error(f"engine {choice.engine!r} has no package to take torch from",
                          "axes", fix="list torch versions under axes.torch")
        return listed, [], None
    try:
        facts = _engine_facts(m, gatherer, choice, machine)
    except NotOnIndex as exc:
        verdict = Verdict("engine-on-index", f"{package} {choice.version} has no Linux {machine}"
                          f" wheel on the package index ({exc})", str(exc).split(": ")[0])
        return listed or [FROM_ENGINE], [verdict], None
    except IndexUnavailable as exc:
        return listed or [FROM_ENGINE], [], f"index unreachable: {exc}"
    if listed is None:
        if facts.pinned_torch:
            return [facts.pinned_torch.split("+", 1)[0]], [], None
        return _newest_allowed_torch(m, releases, facts, choice)
    allowed = [t for t in listed
               if torch_satisfies(Cell("0", t, choice.engine, choice.version, "x"),
                                  facts.torch_pins)]
    if allowed:
        return allowed, [], None
    return listed, [], None  # none allowed: the rule prunes every cell, naming the pin


def _newest_allowed_torch(m: Matrix, releases: ReleaseSource | None, facts: EngineFacts,
                          choice: EngineChoice) -> tuple[list[str], list[Verdict], str | None]:
    if not facts.torch_pins:
        raise m.error(f"{choice.engine} {choice.version} does not depend on torch: "
                      "`torch: from-engine` has nothing to follow", *choice.where,
                      fix="list torch versions under axes.torch")
    if releases is None:
        return [FROM_ENGINE], [], "no release list of torch to pick from"
    try:
        listing = releases("torch")
    except IndexUnavailable as exc:
        return [FROM_ENGINE], [], f"index unreachable: {exc}"
    spec = SpecifierSet(",".join(str(s) for pin in facts.torch_pins
                                 for s in Requirement(pin).specifier))
    newest = listing.newest(spec, 1)
    return (newest, [], None) if newest else ([FROM_ENGINE], [Verdict(
        "engine-torch-pin", f"no torch release meets {', '.join(facts.torch_pins)}",
        facts.metadata_url)], None)


def expand_axes(m: Matrix, gatherer: FactGatherer | None = None,
                releases: ReleaseSource | None = None) -> Expansion:
    """The cells of the axes (engine releases resolved, torch following the engine), then the
    `include` entries."""
    axes = m.data["axes"]
    for i, version in enumerate(_torch_axis(m) or []):
        _check_torch_exists(m, gatherer, version, ("axes", "torch", i))
    notes: dict[str, int] = {}
    candidates: list[ExpandedCell] = []
    memo: dict[tuple[str, str, str], tuple[list[str], list[Verdict], str | None]] = {}
    for choice, arch in itertools.product(resolve_engines(m, releases, gatherer),
                                          axes["arch"]):
        machine = machine_of(_platform_of_arch(m, arch))
        key = (choice.engine, choice.version, machine)
        if key not in memo:
            memo[key] = _torches_for(m, gatherer, releases, choice, machine)
        torches, verdicts, unresolved = memo[key]
        listed = _torch_axis(m)
        if listed and len(torches) < len(listed):
            notes[FORBIDDEN_TORCH] = notes.get(FORBIDDEN_TORCH, 0) + \
                (len(listed) - len(torches)) * len(axes["cuda"])
        for cuda, torch in itertools.product(axes["cuda"], torches):
            candidates.append(ExpandedCell(Cell(cuda, torch, choice.engine, choice.version, arch),
                                           "axes", choice, list(verdicts), unresolved))
    for i, entry in enumerate(m.data.get("include", [])):
        name, version = _parse_engine(entry["engine"])
        _check_torch_exists(m, gatherer, entry["torch"], ("include", i, "torch"))
        choice = EngineChoice(name, version, f"=={version}", ("include", i, "engine"))
        candidates.append(ExpandedCell(Cell(entry["cuda"], entry["torch"], name, version,
                                            entry["arch"]), f"include[{i}]", choice))
    _refuse_duplicates(m, candidates)
    return Expansion(candidates, notes)


def _refuse_duplicates(m: Matrix, candidates: list[ExpandedCell]) -> None:
    seen: dict[str, str] = {}
    for cand in candidates:
        cell, origin = cand.cell, cand.origin
        if cell.id in seen:
            where = ("include", int(origin[8:-1])) if origin.startswith("include") else ("axes",)
            raise m.error(f"duplicate cell id {cell.id} ({origin} repeats {seen[cell.id]})",
                          *where, fix="remove the repeated entry")
        seen[cell.id] = origin


def base_for(cell: Cell, m: Matrix) -> str:
    """The base of a cell: the first `bases.select` entry matching its id, else the default."""
    for entry in m.bases.get("select", []):
        if matches(entry["cells"], cell.id):
            return entry["base"]
    return m.bases["default"]


def _platform_of_arch(m: Matrix, arch: str) -> str:
    override = m.data.get("platforms", {}).get(arch)
    if override:
        return override
    return load_rules()["arch-platform"]["platforms"].get(arch.rstrip("af"), "linux/amd64")


def platform_for(cell: Cell, m: Matrix) -> str:
    """The image platform: matrix.yaml `platforms:` first, then the arch's machines (rules)."""
    return _platform_of_arch(m, cell.arch)


VARIANT_FIELDS = ("version", "cuda_tag", "machine", "asset_tags")


class UnknownAssetTags(Exception):
    """No `asset_tags` range of a variant covers the engine version: its file name is unknown."""

    def __init__(self, message: str, source: str) -> None:
        super().__init__(message)
        self.source = source


def variant_url(cell: Cell, m: Matrix, variant: dict[str, Any], machine: str
                ) -> tuple[str, str | None]:
    """(URL, source of its tags) of an engine variant for the cell's machine.

    `{asset_tags}` is the release asset's own python-abi-platform tags from the variant's
    `asset_tags` (per version range, with its source): an asset off PyPI need not carry the
    tags of the release's PyPI wheel (vLLM's +cu130 assets are manylinux_2_35 where PyPI's
    wheel is manylinux_2_31), so they are data, never copied from that wheel."""
    import string

    key = "wheel" if variant.get("wheel") else "index"
    template = variant.get(key) or ""
    where = ("engines", cell.engine, "variants", cell.cuda)
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise m.error(f"variant {cell.cuda} of engine {cell.engine}: {key} {template!r}: {exc}",
                      *where, key) from None
    unknown = sorted(used - set(VARIANT_FIELDS))
    if unknown:
        raise m.error(f"variant {cell.cuda} of engine {cell.engine}: {key} {template!r} has "
                      f"unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}",
                      *where, key, fix="use " + ", ".join("{" + f + "}" for f in VARIANT_FIELDS)
                      + " ({asset_tags}: the asset's own tags, from the variant's asset_tags)")
    fields = {"version": cell.engine_version, "cuda_tag": cell.cuda_tag, "machine": machine}
    tags_source = None
    if "asset_tags" in used:
        entry = None
        for index, candidate in enumerate(variant.get("asset_tags", [])):
            try:
                spec = SpecifierSet(candidate["versions"])
            except ValueError as exc:
                raise m.error(f"variant {cell.cuda} of engine {cell.engine}: asset_tags[{index}]"
                              f" versions {candidate['versions']!r}: {exc}",
                              *where, "asset_tags", index, "versions") from None
            if spec.contains(cell.engine_version, prereleases=True):
                entry = candidate
                break
        if entry is None:
            raise UnknownAssetTags(
                f"{cell.engine} {cell.engine_version} {cell.cuda_tag} wheel: no asset_tags range "
                f"of engines.{cell.engine}.variants.{cell.cuda} covers {cell.engine_version}, so "
                "the release asset's file name is not known (its tags need not be the PyPI "
                "wheel's): add the range with its tags and source",
                variant.get("source", "matrix.yaml"))
        fields["asset_tags"], tags_source = entry["tags"], entry["source"]
    return template.format(**fields), tags_source


def settings_for(cell: Cell, m: Matrix, facts: EngineFacts | None,
                 backend: str | None) -> CellSettings:
    """Everything render, lock and build need for a planned cell."""
    engine = m.engines[cell.engine]
    per_arch = engine.get("arch", {}).get(cell.arch, {})
    args = serve_args(m, cell, backend)
    env = engine_env(cell, m, facts)
    variant = engine.get("variants", {}).get(cell.cuda) if cell.cuda != CPU else None
    torch_index = None
    pypi_cuda = facts.cell_torch_cuda if facts else None
    if cell.cuda != CPU and pypi_cuda is not None and pypi_cuda != cell.cuda:
        index = from_environment("torch_index") or load_rules()["torch-cuda-variant"]["index"]
        torch_index = index.format(cuda_tag=cell.cuda_tag)
    sources = {}
    if facts and facts.metadata_url:
        sources["engine_metadata"] = facts.metadata_url
    flashinfer = flashinfer_version(facts)
    if flashinfer and FLASHINFER_ARCH_ENV in env and \
            FLASHINFER_ARCH_ENV not in engine.get("env", {}) | per_arch.get("env", {}):
        sources["flashinfer_arch"] = (
            f"{FLASHINFER_ARCH_ENV}={env[FLASHINFER_ARCH_ENV]} for flashinfer-python {flashinfer}: "
            "a suffixed target FlashInfer uses as-is (its JIT then compiles with this image's "
            "nvcc) - rules.yaml flashinfer-jit-arch, " + load_rules()["flashinfer-jit-arch"]
            ["refuses"][0]["source"].split(" (")[0])
    engine_index = None
    if variant and facts and facts.torch_cuda and facts.torch_cuda != cell.cuda:
        if pypi_build_covers(variant, cell.engine_version):
            sources["engine_variant"] = variant["pypi_build"]["source"]
        else:
            sources["engine_variant"] = variant["source"]
            engine_index, tags_source = variant_url(cell, m, variant,
                                                    machine_of(platform_for(cell, m)))
            if tags_source:
                sources["engine_variant_tags"] = tags_source
    # From what the engine ships (index facts); without them nothing is known to floor on.
    floor, floor_reason = driver_floor(cell, facts) if facts is not None else (None, None)
    return CellSettings(
        python=m.python, base=base_for(cell, m), platform=platform_for(cell, m),
        engine_package=engine.get("package"),
        kernels=list(per_arch.get("kernels", engine.get("kernels", []))),
        attention_backend=backend, engine_args=args, env=dict(sorted(env.items())),
        torch_index=torch_index, engine_index=engine_index,
        engine_cuda=facts.torch_cuda if facts else None, source_urls=sources,
        driver_floor=floor, driver_floor_reason=floor_reason)


def variant_sources(cell: Cell, settings: CellSettings) -> list[tuple[str, str, str]]:
    """(what, url to check, how) of each source off the default index a cell installs from."""
    checks = []
    if settings.torch_index:
        checks.append((f"torch {cell.torch}+{cell.cuda_tag}", settings.torch_index.rstrip("/")
                       + "/torch/", f"torch-{cell.torch}+{cell.cuda_tag}-"))
    if settings.engine_index:
        if settings.engine_index.endswith(".whl"):
            checks.append((f"{settings.engine_package} {cell.engine_version} {cell.cuda_tag} wheel",
                           settings.engine_index, ""))
        else:
            package = settings.engine_package or cell.engine
            checks.append((f"{package} {cell.engine_version} ({cell.cuda_tag} index)",
                           settings.engine_index.rstrip("/") + f"/{package}/",
                           f"{package.replace('-', '_')}-{cell.engine_version}"))
    return checks


@dataclass
class VariantAnswers:
    """Answers of the indexes off PyPI (does this page list that file / does this URL exist?),
    cached on disk: a found/not-found answer is kept, so an offline plan answers from the cache;
    an unreachable index with no cached answer is None (the cell is "unverified")."""

    path: Path
    offline: bool = False
    _answers: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        if self._answers is None:
            try:
                self._answers = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._answers = {}
        return self._answers

    def __call__(self, url: str, prefix: str = "") -> bool | None:
        key = f"{url} {prefix}".strip()
        cached = self._load().get(key)
        if self.offline:
            return cached["found"] if cached else None
        found = url_exists(url) if not prefix else index_lists(url, prefix)
        if found is None:
            return cached["found"] if cached else None
        self._load()[key] = {"found": found,
                             "checked": datetime.datetime.now(datetime.UTC).isoformat(
                                 timespec="seconds")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self._answers, indent=1, sort_keys=True),
                             encoding="utf-8")
        return found


def _torch_table_note(cell: Cell) -> str:
    """Why a torch variant was asked of the index: what the rules.yaml table says of it."""
    variant = torch_variant(cell)
    if torch_variant_known(cell) is True:
        return f"rules.yaml lists it, checked {(variant or {}).get('checked')}"
    if variant is None:
        return f"torch {cell.torch}'s minor is not in the rules.yaml variant table"
    return f"the rules.yaml variant table does not list {cell.cuda_tag} for torch {cell.torch}"


def check_variants(cell: Cell, settings: CellSettings, exists: ExistsCheck | None,
                   answers: VariantAnswers | None = None
                   ) -> tuple[list[Verdict], list[Verdict]]:
    """(missing, unverifiable): a declared variant is checked to exist before it is planned.
    `exists` (tests) answers by URL; else `answers` (cached) or the network."""
    missing: list[Verdict] = []
    unverified: list[Verdict] = []
    for what, url, prefix in variant_sources(cell, settings):
        if exists is not None:
            found = exists(url)
        elif answers is not None:
            found = answers(url, prefix)
        else:
            found = url_exists(url) if not prefix else index_lists(url, prefix)
        note = f" ({_torch_table_note(cell)})" if what.startswith("torch ") else ""
        if found is False:
            missing.append(Verdict("variant-missing", f"{what} is not at {url}{note}", url))
        elif found is None:
            host = urlparse(url).netloc
            unverified.append(Verdict("variant-unverified", f"{what}: {host} cannot be reached "
                                      f"from here to check it{note}; not planned on an "
                                      "unchecked URL", url))
    return missing, unverified


def wheel_coverage(cell: Cell, m: Matrix, facts: EngineFacts | None, code: WheelCodeCache,
                   machine: str) -> tuple[list[Verdict], dict[str, str], list[str]]:
    """(verdicts, PTX ISA of each PTX-only object, what was read) for the objects the engine
    loads (engines.<e>.coverage), read from the wheels before any build."""
    engine = m.engines[cell.engine]
    pins = dict(facts.exact_pins) if facts else {}
    verdicts: list[Verdict] = []
    ptx_only: dict[str, str] = {}
    read: list[str] = []
    for entry in engine.get("coverage", []):
        package = entry["package"]
        version = cell.engine_version if package == engine.get("package") \
            else pins.get(canonicalize_name(package))
        if version is None:
            continue  # the engine does not pin it on this machine: nothing to read
        ref, objects = code.objects(package, version, machine, list(entry["objects"]))
        read.append(f"{package}=={version} ({ref.filename if ref else '?'})")
        for obj in objects:
            decision = decide(obj.code, cell.arch)
            where = f"{package} {version}: {obj.member}"
            if decision.coverage is Coverage.UNCOVERED:
                verdicts.append(Verdict("wheel-coverage", f"{where} cannot run on {cell.arch}: "
                                        f"{decision.note}", ref.url if ref else package))
            elif decision.coverage is Coverage.PTX_JIT and obj.ptx_isa:
                ptx_only[f"{package}:{obj.member}"] = obj.ptx_isa
    return verdicts, ptx_only, read


def _cell_torch_cuda(gatherer: FactGatherer, cell: Cell, machine: str,
                     has_package: bool) -> str | None:
    """CUDA of PyPI's wheel of the cell's torch. A package-less (fixture) engine needs no index
    otherwise, so offline without a cache it plans on the cell's own CUDA (None: unknown)."""
    if cell.cuda == CPU:
        return None
    try:
        return gatherer.torch_cuda(cell.torch, machine)
    except IndexUnavailable:
        if has_package:
            raise
        return None


def plan_cell(cand: ExpandedCell, m: Matrix, gatherer: FactGatherer,
              exists: ExistsCheck | None = None, code: WheelCodeCache | None = None,
              answers: VariantAnswers | None = None) -> CellPlan:
    cell, origin = cand.cell, cand.origin
    resolution = cand.choice.record() if cand.choice else None
    engine = m.engines[cell.engine]
    machine = machine_of(platform_for(cell, m))
    facts: EngineFacts | None = None
    unresolved = cand.unresolved
    verdicts: list[Verdict] = list(cand.verdicts)
    if unresolved and (cell.torch == FROM_ENGINE or (cand.choice and cand.choice.unresolved)):
        # no release or torch to judge yet: the index must answer first
        return CellPlan(cell, "unresolved", [Verdict("index-unreachable", unresolved, "network")],
                        None, origin, resolution)
    if not unresolved and not verdicts:
        try:
            if engine.get("package"):
                facts = gatherer.facts(engine["package"], cell.engine_version, machine)
            facts = replace(facts or EngineFacts("", (), None, None),
                            cell_torch_cuda=_cell_torch_cuda(gatherer, cell, machine,
                                                             bool(engine.get("package"))))
        except NotOnIndex as exc:
            verdicts.append(Verdict("engine-on-index", f"not on the package index for Linux "
                                    f"{machine}: {exc}", str(exc).split(": ")[0]))
        except IndexUnavailable as exc:
            unresolved = f"index unreachable: {exc}"
    verdicts += evaluate(cell, m, facts)
    if verdicts:
        return CellPlan(cell, "pruned", verdicts, None, origin, resolution)
    if unresolved:
        return CellPlan(cell, "unresolved", [Verdict("index-unreachable", unresolved, "network")],
                        None, origin, resolution)
    choice = backend_choice(cell, m)
    backend = choice.backend
    try:
        settings = settings_for(cell, m, facts, backend)
        if choice.why:
            settings.source_urls["attention_backend"] = f"{choice.why} — {choice.source}"
    except UnknownAssetTags as exc:
        return CellPlan(cell, "pruned", [Verdict("variant-missing", str(exc), exc.source)],
                        None, origin, resolution)
    missing, unverified = check_variants(cell, settings, exists, answers)
    if missing:
        return CellPlan(cell, "pruned", missing, None, origin, resolution)
    # The engine's objects are read from PyPI's wheels: for an unverified cell too when that is
    # where its engine comes from (only torch is off PyPI), so a cell the index could not
    # confirm is still pruned when its engine's code cannot run on the arch.
    if unverified and settings.engine_index is not None:
        return CellPlan(cell, "unverified", unverified, settings, origin, resolution)
    if code is not None and cell.is_gpu and m.engines[cell.engine].get("coverage"):
        try:
            uncovered, ptx_only, read = wheel_coverage(cell, m, facts, code, machine)
        except IndexUnavailable as exc:
            settings.source_urls["wheel_coverage"] = f"not read: {exc}"
        else:
            if uncovered:
                return CellPlan(cell, "pruned", uncovered, None, origin, resolution)
            settings.source_urls["wheel_coverage"] = "; ".join(read)
            settings.driver_floor, settings.driver_floor_reason = driver_floor(
                cell, facts, ptx_only)
    if cell.is_gpu or m.data.get("profiles"):
        settings.profiles = [p.as_dict() for p in profile_plans(cell, m, facts, code, machine,
                                                                 settings)]
    if unverified:
        return CellPlan(cell, "unverified", unverified, settings, origin, resolution)
    return CellPlan(cell, "planned", [], settings, origin, resolution)


def read_gemm(cell: Cell, gemm: dict[str, Any], code: WheelCodeCache | None,
              machine: str) -> GemmRead:
    """What the wheel says of an FP8 GEMM path: its kernel's cubins/PTX in the object (kind
    `object`), or whether its JIT source is in the wheel (kind `jit`)."""
    if code is None:
        return GemmRead(error="the wheels were not read (planned from recorded facts)")
    try:
        if gemm["kind"] == "jit":
            ref, present = code.has_member(gemm["package"], cell.engine_version, machine,
                                           gemm["member"])
            return GemmRead(ref.url, present=present)
        ref, kernels = code.kernels(gemm["package"], cell.engine_version, machine,
                                    gemm["member"], [gemm["kernel"]])
    except (IndexUnavailable, CannotDecompress) as exc:
        return GemmRead(error=str(exc))
    return GemmRead(ref.url, kernel=None if kernels is None else kernels[gemm["kernel"]])


def profile_capacity(cell: Cell, profile: str) -> dict[str, Any] | None:
    """The capacity model's figure for a profile on the cell's GPU class at the planning
    context (model/capacity.py PLAN_*_TOKENS): max sequences and output tokens/s per GPU."""
    from ..model import capacity

    gpu = capacity.gpu_for_arch(cell.arch)
    if gpu is None or not cell.is_gpu or profile not in capacity.profile_names():
        return None
    e = capacity.estimate(gpu, profile, capacity.PLAN_CONTEXT_TOKENS,
                          capacity.PLAN_OUTPUT_TOKENS)
    return {"gpu": gpu, "context_tokens": e.context_tokens, "output_tokens": e.output_tokens,
            "max_sequences": e.sizing.max_sequences, "batch": e.ceiling.batch,
            "tokens_per_s": round(e.ceiling.tokens_per_s, 1), "efficiency": e.ceiling.efficiency}


def profile_plans(cell: Cell, m: Matrix, facts: EngineFacts | None,
                  code: WheelCodeCache | None, machine: str, settings: CellSettings
                  ) -> list[ProfilePlan]:
    """Every matrix profile's verdict on a cell the rules planned (model/profiles.py), its
    FP8 GEMM read from the engine's real wheel, and the capacity model's figure."""
    pins = dict(facts.exact_pins) if facts else {}
    entry = path_entry(cell.engine, cell.engine_version)
    plans = []
    for spec in profile_specs(m.data):
        gemm = (entry or {}).get("fp8-gemm") if "fp8-gemm" in spec.needs else None
        read = read_gemm(cell, gemm, code, machine) if gemm else None
        plan = judge_profile(cell, spec, entry, read, pins, settings.env,
                             settings.attention_backend)
        plan.capacity = profile_capacity(cell, spec.key)
        plans.append(plan)
    return plans


def _excluded(m: Matrix, cell: Cell) -> int | None:
    """Index of the first `exclude` selector matching the cell."""
    for i, pattern in enumerate(m.data.get("exclude", [])):
        if matches(pattern, cell.id):
            return i
    return None


@dataclass
class Plan:
    """Every cell's plan, plus the combinations that were never generated (and why)."""

    cells: list[CellPlan]
    not_generated: dict[str, int] = field(default_factory=dict)


def default_sources(ctx: Context) -> tuple[MetadataSource, ReleaseSource]:
    index, ttl_s = package_index(), from_environment("index_ttl_s")
    cache = MetadataCache(ctx.state.index_cache, offline=ctx.offline, index=index)
    return cache.release, lambda name: release_list(ctx.state.index_cache, name,
                                                    offline=ctx.offline, index=index,
                                                    ttl_s=ttl_s)


def plan_full(ctx: Context, select: Iterable[str] = (), skip: Iterable[str] = (),
              source: MetadataSource | None = None, releases: ReleaseSource | None = None,
              exists: ExistsCheck | None = None, code: WheelCodeCache | None = None) -> Plan:
    """The plan and its notes. With no `source`, facts come from the index (cached) and the
    wheels' GPU code is read too (`code`); a test passing recorded sources passes `code` if it
    wants coverage."""
    m = ctx.matrix
    if source is None:
        source, default_releases = default_sources(ctx)
        releases = releases or default_releases
        code = code or WheelCodeCache(ctx.state.index_cache / "wheel-code", package_index(),
                                      offline=ctx.offline)
    gatherer = FactGatherer(source)
    answers = VariantAnswers(ctx.state.index_cache / "variant-answers.json", ctx.offline) \
        if exists is None else None
    expansion = expand_axes(m, gatherer, releases)
    cells = [c.cell for c in expansion.candidates]
    _check_selectors(m, cells, select, skip)
    selection = Selection(list(select), list(skip))
    plans: list[CellPlan] = []
    for cand in expansion.candidates:
        cell = cand.cell
        if not selection(cell.id):
            continue
        excluded = _excluded(m, cell)
        if excluded is not None:
            pattern = m.data["exclude"][excluded]
            plans.append(CellPlan(cell, "pruned", [Verdict(
                "exclude", f"excluded by the selector {pattern!r} in {m.path.name}",
                f"{m.path}:{m.line_of('exclude', excluded)}")], None, cand.origin,
                cand.choice.record() if cand.choice else None))
            continue
        plans.append(plan_cell(cand, m, gatherer, exists, code, answers))
    return Plan(sorted(plans, key=lambda p: p.id), expansion.not_generated)


def plan_matrix(ctx: Context, select: Iterable[str] = (), skip: Iterable[str] = (),
                source: MetadataSource | None = None, releases: ReleaseSource | None = None,
                exists: ExistsCheck | None = None, code: WheelCodeCache | None = None
                ) -> list[CellPlan]:
    """Plan every cell of the matrix, sorted by id. `select`/`skip` narrow the result; a
    selector that matches no cell is a usage error (usually a typo)."""
    return plan_full(ctx, select, skip, source, releases, exists, code).cells


def _check_selectors(m: Matrix, cells: list[Cell], select: Iterable[str],
                     skip: Iterable[str]) -> None:
    ids = [c.id for c in cells]
    for i, pattern in enumerate(m.data.get("exclude", [])):
        if not any(matches(pattern, cid) for cid in ids):
            raise m.error(f"exclude selector {pattern!r} matches no cell", "exclude", i,
                          fix="check it against `infermatrix plan` ids")
    unmatched = Selection(list(select), list(skip)).unmatched(ids)
    if unmatched:
        raise UnknownChoice(f"selector {unmatched[0]!r} matches no cell of {m.path} "
                            f"(ids look like {ids[0] if ids else 'n/a'})",
                            fix="check it against `infermatrix plan` ids")

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """Every selected cell's plan outcome in the journal (the report shows pruned cells too):
    the run's plans, pruned and unresolved ones included; `cells` are the planned ones."""
    alive = run.plans
    for plan in alive:
        status = journal.Status.PASS if plan.planned else journal.Status.SKIP
        reason = "; ".join(v.reason for v in plan.verdicts) or None
        journal.record_stage(run.ctx.state, plan.id, "plan", status, reason=reason,
                             details=plan.as_dict())
    pruned = [p.id for p in alive if p.status == "pruned"]
    notes = [f"{len(pruned)} pruned", *passed_over_notes(alive)]
    return step_record("plan", [p.id for p in alive if p.planned],
                       [p.id for p in alive if p.status == "unresolved"],
                       note="; ".join(notes), dropped=pruned)
