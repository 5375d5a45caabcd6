"""plan: expand matrix.yaml into cells and prune the impossible ones, each with its reasons.

Expansion and rule evaluation are pure; the only I/O is reading engine/torch metadata through
`index.MetadataCache` (disk-cached, offline-capable), once per distinct release.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .config import Matrix
from .context import Context
from .errors import UsageError
from .index import IndexUnavailable, MetadataCache, NotOnIndex, ReleaseMetadata
from .model import CPU, Cell, CellPlan, CellSettings, Verdict
from .rules import (EngineFacts, choose_attention_backend, cuda_of_requirements, evaluate,
                    exact_pin, load_rules, torch_variant)
from .selectors import Selection, matches

# (name, version, machine) -> metadata of that release's Linux wheel for the machine
MetadataSource = Callable[..., ReleaseMetadata]

MACHINES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def _parse_engine(spec: str) -> tuple[str, str]:
    name, _, version = spec.partition("==")
    return name, version


def expand(m: Matrix) -> list[tuple[Cell, str]]:
    """Every cell of the product of the axes, then the `include` entries; (cell, origin)."""
    axes = m.data["axes"]
    cells: list[tuple[Cell, str]] = []
    for cuda, torch, engine, arch in itertools.product(axes["cuda"], axes["torch"],
                                                       axes["engine"], axes["arch"]):
        name, version = _parse_engine(engine)
        cells.append((Cell(cuda, torch, name, version, arch), "axes"))
    for i, entry in enumerate(m.data.get("include", [])):
        name, version = _parse_engine(entry["engine"])
        cells.append((Cell(entry["cuda"], entry["torch"], name, version, entry["arch"]),
                      f"include[{i}]"))
    _refuse_duplicates(m, cells)
    return cells


def _refuse_duplicates(m: Matrix, cells: list[tuple[Cell, str]]) -> None:
    seen: dict[str, str] = {}
    for cell, origin in cells:
        if cell.id in seen:
            where = ("include", int(origin[8:-1])) if origin.startswith("include") else ("axes",)
            raise m.error(f"duplicate cell id {cell.id} ({origin} repeats {seen[cell.id]})",
                          *where, fix="remove the repeated entry")
        seen[cell.id] = origin


@dataclass
class FactGatherer:
    """Engine facts from package metadata, read once per release (memoised)."""

    source: MetadataSource
    _engine: dict[tuple[str, str, str], EngineFacts | Exception] = field(default_factory=dict)

    def facts(self, package: str, version: str, machine: str = "x86_64") -> EngineFacts:
        key = (package, version, machine)
        if key not in self._engine:
            try:
                self._engine[key] = self._read(package, version, machine)
            except (IndexUnavailable, NotOnIndex) as exc:
                self._engine[key] = exc
        value = self._engine[key]
        if isinstance(value, Exception):
            raise value
        return value

    def _read(self, package: str, version: str, machine: str) -> EngineFacts:
        meta = self._release(package, version, machine)
        pins = tuple(str(r) for r in meta.pins_for("torch", machine))
        pinned = exact_pin(pins) if pins else None
        torch_cuda = None
        if pinned:
            public = pinned.split("+", 1)[0]
            torch_meta = self._release("torch", public, machine)
            torch_cuda = cuda_of_requirements(torch_meta.requires_dist)
        return EngineFacts(metadata_url=meta.url, torch_pins=pins, pinned_torch=pinned,
                           torch_cuda=torch_cuda)

    def _release(self, name: str, version: str, machine: str) -> ReleaseMetadata:
        return self.source(name, version, machine)


def base_for(cell: Cell, m: Matrix) -> str:
    """The base of a cell: the first `bases.select` entry matching its id, else the default."""
    for entry in m.bases.get("select", []):
        if matches(entry["cells"], cell.id):
            return entry["base"]
    return m.bases["default"]


def platform_for(cell: Cell, m: Matrix) -> str:
    """The image platform: matrix.yaml `platforms:` first, then the arch's machines (rules)."""
    override = m.data.get("platforms", {}).get(cell.arch)
    if override:
        return override
    return load_rules()["arch-platform"]["platforms"].get(cell.arch.rstrip("af"), "linux/amd64")


def settings_for(cell: Cell, m: Matrix, facts: EngineFacts | None,
                 backend: str | None) -> CellSettings:
    """Everything render, lock and build need for a planned cell."""
    engine = m.engines[cell.engine]
    per_arch = engine.get("arch", {}).get(cell.arch, {})
    args = list(m.model["launch"].get(cell.engine, [])) + list(per_arch.get("args", []))
    if backend and engine.get("attention_flag"):
        args += [engine["attention_flag"], backend]
    env = {**engine.get("env", {}), **per_arch.get("env", {})}
    variant = engine.get("variants", {}).get(cell.cuda) if cell.cuda != CPU else None
    torch_index = None
    tv = torch_variant(cell)
    if cell.cuda != CPU and tv and tv["pypi"] != cell.cuda_tag:
        index = os.environ.get("INFERMATRIX_TORCH_INDEX") or load_rules()["torch-cuda-variant"]["index"]
        torch_index = index.format(cuda_tag=cell.cuda_tag)
    sources = {}
    if facts:
        sources["engine_metadata"] = facts.metadata_url
    if variant:
        sources["engine_variant"] = variant["source"]
    engine_index = None
    if variant and facts and facts.torch_cuda != cell.cuda:
        engine_index = (variant.get("wheel") or variant.get("index") or "").format(
            version=cell.engine_version)
    return CellSettings(
        python=m.python, base=base_for(cell, m), platform=platform_for(cell, m), engine_package=engine.get("package"),
        kernels=list(per_arch.get("kernels", engine.get("kernels", []))),
        attention_backend=backend, engine_args=args,
        env=dict(sorted(env.items())), torch_index=torch_index, engine_index=engine_index,
        engine_cuda=facts.torch_cuda if facts else None, source_urls=sources)


def plan_cell(cell: Cell, origin: str, m: Matrix, gatherer: FactGatherer) -> CellPlan:
    engine = m.engines[cell.engine]
    facts: EngineFacts | None = None
    unresolved: str | None = None
    verdicts: list[Verdict] = []
    machine = MACHINES[platform_for(cell, m)]
    if engine.get("package"):
        try:
            facts = gatherer.facts(engine["package"], cell.engine_version, machine)
        except NotOnIndex as exc:
            verdicts.append(Verdict("engine-on-index",
                                    f"{engine['package']} {cell.engine_version} is not on the "
                                    f"package index for Linux {machine} ({exc})",
                                    str(exc).split(":")[0]))
        except IndexUnavailable as exc:
            unresolved = f"index unreachable: {exc}"
    verdicts += evaluate(cell, m, facts)
    if verdicts:
        return CellPlan(cell, "pruned", verdicts, None, origin)
    if unresolved:
        return CellPlan(cell, "unresolved",
                        [Verdict("index-unreachable", unresolved, "network")], None, origin)
    backend, _ = choose_attention_backend(cell, m)
    return CellPlan(cell, "planned", [], settings_for(cell, m, facts, backend), origin)


def _excluded(m: Matrix, cell: Cell) -> int | None:
    """Index of the first `exclude` selector matching the cell."""
    for i, pattern in enumerate(m.data.get("exclude", [])):
        if matches(pattern, cell.id):
            return i
    return None


def plan_matrix(ctx: Context, select: Iterable[str] = (), skip: Iterable[str] = (),
                source: MetadataSource | None = None) -> list[CellPlan]:
    """Plan every cell of the matrix, sorted by id. `select`/`skip` narrow the result; a
    selector that matches no cell is a usage error (usually a typo)."""
    m = ctx.matrix
    if source is None:
        cache = MetadataCache(ctx.state.index_cache, offline=ctx.offline)
        source = cache.release
    gatherer = FactGatherer(source)
    cells = expand(m)
    _check_selectors(m, [c for c, _ in cells], select, skip)
    selection = Selection(list(select), list(skip))
    plans: list[CellPlan] = []
    for cell, origin in cells:
        if not selection(cell.id):
            continue
        excluded = _excluded(m, cell)
        if excluded is not None:
            pattern = m.data["exclude"][excluded]
            plans.append(CellPlan(cell, "pruned", [Verdict(
                "exclude", f"excluded by the selector {pattern!r} in {m.path.name}",
                f"{m.path}:{m.line_of('exclude', excluded)}")], None, origin))
            continue
        plans.append(plan_cell(cell, origin, m, gatherer))
    return sorted(plans, key=lambda p: p.id)


def _check_selectors(m: Matrix, cells: list[Cell], select: Iterable[str],
                     skip: Iterable[str]) -> None:
    ids = [c.id for c in cells]
    for i, pattern in enumerate(m.data.get("exclude", [])):
        if not any(matches(pattern, cid) for cid in ids):
            raise m.error(f"exclude selector {pattern!r} matches no cell", "exclude", i,
                          fix="check it against `infermatrix plan` ids")
    unmatched = Selection(list(select), list(skip)).unmatched(ids)
    if unmatched:
        raise UsageError(f"selector {unmatched[0]!r} matches no cell of {m.path} "
                         f"(ids look like {ids[0] if ids else 'n/a'})")
