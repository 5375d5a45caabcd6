"""The loaded set: which compiled objects a cell's serving process loads (data/loaded.yaml).

Two sides of evidence:
- data: per package version range, model traits and arch, each entry with a reason and a source
  (read from the released wheels' loader code); `load_verdict()` says for one object on one target
  whether it is loaded or not, and why;
- observation: the objects the server really maps (/proc/<pid>/maps, recorded by the `model`
  smoke level); `judge_mapped()` fails a mapped object that data called never mapped, a mapped
  object that does not cover the target, and a runtime choice that does not hold.

Pure code: data in, verdicts out (no Docker, no files but the packaged data).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from ..datafiles import DATA_DIR, read_data
from .coverage import Arch

DATA = DATA_DIR / "loaded.yaml"
LOADED, NOT_LOADED = "loaded", "not-loaded"
UNKNOWN = "unknown"  # no entry: not known to be unloaded, so it counts as loaded


def load_data() -> dict[str, Any]:
    return read_data(DATA)


def model_traits(model: str | None, data: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The traits loaded.yaml records for a model (None: unknown model)."""
    data = data if data is not None else load_data()
    return (data.get("models") or {}).get(model or "")


def cc_matches(spec: str, target: Arch) -> bool:
    """`9.x` any 9.y; `9.0` exactly; `!9.0` anything but; `sm_90` like `9.0`."""
    negate = spec.startswith("!")
    spec = spec.lstrip("!")
    if spec.endswith(".x"):
        hit = target.major == int(spec[:-2])
    else:
        hit = Arch.parse(spec).cc == target.cc
    return hit != negate


@dataclass(frozen=True)
class LoadedEntry:
    id: str
    paths: tuple[str, ...]
    reason: str
    source: str = ""
    package: str | None = None
    versions: str | None = None
    used_on: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    mapped: bool | None = None  # where not used: False never mapped, True mapped but idle
    loaded: bool = False
    cuda_major: str | None = None
    one_of: bool = False
    chosen_by: str = ""
    only_if_unlinked: bool = False
    features: tuple[str, ...] = ()  # loaded only when the cell's launch enables one of these
    key: str = ""  # short reason key for terminal lines; default: from the condition that held

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LoadedEntry:
        return cls(id=raw["id"], paths=tuple(raw.get("paths") or [raw["path"]]),
                   reason=" ".join(str(raw["reason"]).split()), source=raw.get("source", ""),
                   package=raw.get("package"), versions=raw.get("versions"),
                   used_on=tuple(raw.get("used_on", ())), models=tuple(raw.get("models", ())),
                   mapped=raw.get("mapped"), loaded=bool(raw.get("loaded", False)),
                   cuda_major=raw.get("cuda_major"), one_of=bool(raw.get("one_of", False)),
                   chosen_by=raw.get("chosen_by", ""),
                   only_if_unlinked=bool(raw.get("only_if_unlinked", False)),
                   features=tuple(raw.get("features", ())), key=raw.get("key", ""))

    def matches_path(self, path: str) -> bool:
        return any(fnmatchcase(path, p) for p in self.paths)

    def in_range(self, distributions: dict[str, str]) -> bool:
        """The entry's package is installed at a version in its range (no package: always)."""
        if self.package is None:
            return True
        from packaging.specifiers import SpecifierSet
        from packaging.utils import canonicalize_name

        installed = distributions.get(canonicalize_name(self.package))
        if installed is None:
            return False
        return not self.versions or SpecifierSet(self.versions).contains(installed,
                                                                         prereleases=True)

    def cuda_major_of(self, path: str) -> int | None:
        """The CUDA major a `cuda_major` pattern names in this path (None: not such a build)."""
        if not self.cuda_major:
            return None
        regex = re.escape(self.cuda_major).replace(re.escape("{major}"), r"(\d+)")
        subject = path if "/" in self.cuda_major else Path(path).name
        match = re.fullmatch(regex.replace(r"\*", "[^/]*"), subject)
        return int(match.group(1)) if match else None


@dataclass(frozen=True)
class LoadVerdict:
    """Whether one object is loaded on one target, and which data says so."""

    state: str  # loaded | not-loaded | unknown
    entry: str | None = None
    reason: str = ""
    source: str = ""
    mapped: bool | None = None  # for not-loaded: may the process still map it?
    runtime_cuda: bool = False  # not loaded because another CUDA major's build is chosen
    key: str = ""  # for not-loaded: the condition that held, short (`mla-only`, `hopper-only`)

    @property
    def counts_as_loaded(self) -> bool:
        return self.state != NOT_LOADED

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "entry": self.entry, "reason": self.reason,
                "source": self.source, "mapped": self.mapped, "key": self.key}


def entries(matrix_data: dict[str, Any] | None = None) -> list[LoadedEntry]:
    """The packaged entries, then the matrix's own `audit.not_loaded` rules."""
    found = [LoadedEntry.from_dict(e) for e in load_data().get("entries", [])]
    for index, raw in enumerate((matrix_data or {}).get("audit", {}).get("not_loaded", [])):
        # "not loaded on these archs" = used on every device but these; no archs: never used
        archs = tuple(f"!{Arch.parse(a).major}.{Arch.parse(a).minor}" for a in raw.get("arch", []))
        found.append(LoadedEntry(id=f"matrix audit.not_loaded[{index}]", paths=(raw["path"],),
                                 reason=" ".join(raw["reason"].split()),
                                 source=raw.get("source", "matrix.yaml"),
                                 used_on=archs or ("none",), mapped=raw.get("mapped"),
                                 key="matrix-waiver"))
    return found


@dataclass
class LoadContext:
    """What the verdict depends on besides the object: the image and the cell."""

    distributions: dict[str, str]
    cuda_major: int | None
    traits: tuple[str, ...] | None  # None: unknown model
    linked: set[str] = field(default_factory=set)  # sonames some object of the image links
    entries: list[LoadedEntry] = field(default_factory=list)
    features: tuple[str, ...] = ()  # optional engine features the cell's launch enables


def _used_on(entry: LoadedEntry, target: Arch | None) -> bool:
    if not entry.used_on:
        return True
    if entry.used_on == ("none",):
        return False
    if target is None:  # a CPU cell: GPU-arch conditions do not decide
        return True
    positive = [s for s in entry.used_on if not s.startswith("!")]
    negative = [s for s in entry.used_on if s.startswith("!")]
    return (not positive or any(cc_matches(s, target) for s in positive)) and \
        all(cc_matches(s, target) for s in negative)


def load_verdict(path: str, target: Arch | None, ctx: LoadContext) -> LoadVerdict:
    """The first entry in range whose paths match decides; no entry: unknown (counts loaded)."""
    for entry in ctx.entries:
        if not entry.matches_path(path) or not entry.in_range(ctx.distributions):
            continue
        if entry.only_if_unlinked and Path(path).name in ctx.linked:
            continue
        found = _entry_verdict(entry, path, target, ctx)
        if found is not None:
            return found
    return LoadVerdict(UNKNOWN)


def _entry_verdict(entry: LoadedEntry, path: str, target: Arch | None,
                   ctx: LoadContext) -> LoadVerdict | None:
    def not_loaded(why: str, key: str, mapped: bool | None = entry.mapped,
                   **extra: Any) -> LoadVerdict:
        return LoadVerdict(NOT_LOADED, entry.id, why, entry.source, mapped,
                           key=entry.key or key, **extra)

    if entry.features and not set(entry.features) & set(ctx.features):
        return not_loaded(f"loaded only with {' or '.join(entry.features)}, which this cell "
                          f"does not enable: {entry.reason}", "feature-off")
    if entry.cuda_major:
        major = entry.cuda_major_of(path)
        if major is not None and ctx.cuda_major is not None and major == ctx.cuda_major:
            return LoadVerdict(LOADED, entry.id, f"the CUDA {major} build, chosen at run time: "
                               + entry.reason, entry.source)
        built_for = f"a CUDA {major} build" if major is not None else "a non-CUDA build"
        return not_loaded(f"{built_for}, not chosen on CUDA {ctx.cuda_major}: {entry.reason}",
                          "other-cuda-major" if major is not None else "non-cuda-build",
                          mapped=False, runtime_cuda=True)
    if entry.one_of:
        return LoadVerdict(LOADED, entry.id, f"one of {len(entry.paths)} builds, chosen by "
                           f"{entry.chosen_by}: {entry.reason}", entry.source)
    other_models = bool(entry.models and ctx.traits is not None
                        and not set(entry.models) & set(ctx.traits))
    models_key = f"{'-'.join(entry.models)}-only"
    if not _used_on(entry, target):
        where = target.sm if target is not None else "this arch"
        # the key names the model condition when it holds too: it holds on every arch
        return not_loaded(f"not used on {where}: {entry.reason}",
                          models_key if other_models else used_on_key(entry.used_on))
    if other_models:
        return not_loaded(f"not used for this model (used for {', '.join(entry.models)} "
                          f"models only): {entry.reason}", models_key)
    if entry.loaded or entry.used_on or entry.models:  # used here (or model unknown)
        return LoadVerdict(LOADED, entry.id, entry.reason, entry.source)
    # an entry without conditions: never loaded
    return not_loaded(entry.reason, "unlinked-stub" if entry.only_if_unlinked else "never-loaded")


# GPU generations by compute-capability major, for short reason keys (`hopper-only`)
GENERATIONS = {7: "turing", 8: "ampere", 9: "hopper", 10: "blackwell-dc", 11: "thor",
               12: "blackwell-rtx"}


def used_on_key(used_on: tuple[str, ...]) -> str:
    """`hopper-only` (9.x), `sm90-only` (9.0), `ampere-hopper-only`, `not-sm90` (!9.0);
    `matrix-waiver` for a matrix rule that names the archs it is not loaded on."""
    if used_on == ("none",):
        return "never-loaded"
    positive = [s for s in used_on if not s.startswith("!")]
    if not positive:
        return "not-" + "-".join(f"sm{s.lstrip('!').replace('.', '')}" for s in used_on)
    names = [GENERATIONS.get(int(s[:-2]), f"sm{s[:-2]}x") if s.endswith(".x")
             else f"sm{s.replace('.', '')}" for s in positive]
    return "-".join(dict.fromkeys(names)) + "-only"


# --------------------------------------------------------------------------------------------
# Observation: what the server mapped
# --------------------------------------------------------------------------------------------

_SITE = re.compile(r"/(?:site|dist)-packages/(.+)$")


def site_relative(path: str, site_dirs: Iterable[str] = ()) -> str | None:
    """A mapped file's path under site-packages (None: not a package's file)."""
    for base in sorted(site_dirs, key=len, reverse=True):
        if path.startswith(base.rstrip("/") + "/"):
            return path[len(base.rstrip("/")) + 1:]
    match = _SITE.search(path)
    return match.group(1) if match else None


@dataclass
class MappedJudgement:
    status: str  # pass | fail
    detail: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "problems": self.problems,
                "notes": self.notes}


def judge_mapped(mapped: Iterable[str], targets: list[Arch], ctx: LoadContext,
                 coverage_rows: Iterable[dict[str, Any]] = ()) -> MappedJudgement:
    """Every mapped object must be loaded by data's account and cover each target.

    `mapped`: paths under site-packages; `coverage_rows`: the audit's object rows (object,
    per-target verdict text, `covered`)."""
    mapped = sorted(set(mapped))
    rows = {r["object"]: r for r in coverage_rows}
    problems, notes = [], []
    each_target: list[Arch | None] = [*targets] or [None]  # None: the cell has no target arch
    for path in mapped:
        for target in each_target:
            found = load_verdict(path, target, ctx)
            where = target.sm if target is not None else "this cell"
            if found.state == NOT_LOADED and not found.mapped:
                problems.append(f"{path} is mapped by the server on {where}, but loaded.yaml "
                                f"entry {found.entry} says it is not loaded ({found.reason}): "
                                "fix that entry")
            elif found.state == NOT_LOADED:
                notes.append(f"{path}: mapped, kernels unused on {where} ({found.entry})")
            row = rows.get(path)
            if target is not None and row is not None and found.state != NOT_LOADED \
                    and str(row.get(target.sm, "")).startswith("uncovered"):
                problems.append(f"{path} is mapped by the server and does not run on "
                                f"{target.sm}: {row.get(target.sm)}")
    for entry in ctx.entries:
        if entry.one_of and entry.in_range(ctx.distributions):
            chosen = [p for p in mapped if entry.matches_path(p)]
            if len(chosen) != 1:
                problems.append(f"loaded.yaml entry {entry.id}: exactly one of "
                                f"{', '.join(entry.paths)} should be mapped ({entry.chosen_by}); "
                                f"the server mapped {', '.join(chosen) or 'none'}")
            else:
                notes.append(f"{entry.id}: the server chose {chosen[0]} ({entry.chosen_by})")
    status = "fail" if problems else "pass"
    detail = "; ".join(problems) if problems else \
        f"{len(mapped)} mapped objects under site-packages agree with loaded.yaml"
    return MappedJudgement(status, detail, problems, notes)
