"""The Triton kernels each engine version's serve path must compile (data/triton_kernels.yaml),
held against the kernels the audit's harness compiled (issue 48).

Family names alone would let a kernel vanish inside a family unnoticed. Here every expected
kernel name is looked up in each arch's census: one not compiled is `missing` (the check fails
and names it), one compiled and not listed is `unexpected` (named; the list is behind the
engine). FLA's chunk_o chooses its tiles when its module is imported, from the device's shared
memory: the tiles it reported and the BK/BV its compiled configs used are held against the rule
for the target's limit.

Pure: the caller gives the harness result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..datafiles import DATA_DIR, read_data

DATA = DATA_DIR / "triton_kernels.yaml"
IMPORT_TIME = "import-time"


@dataclass(frozen=True)
class TileRule:
    """How FLA's chunk_o picks BK/BV: `large` when the limit >= `threshold`, else `small`;
    its compiled configs use that list (`compiled` None) or fixed values."""
    family: str
    kernel: str
    threshold: int
    large: tuple[int, ...]
    small: tuple[int, ...]
    compiled: Mapping[str, int] | None
    source: str

    def tiles_for(self, limit: int) -> list[int]:
        return list(self.large if limit >= self.threshold else self.small)


@dataclass(frozen=True)
class ExpectedKernels:
    engine: str
    version: str
    families: Mapping[str, tuple[str, ...]]
    source: str
    chunk_o: TileRule | None = None


@dataclass
class KernelListVerdict:
    """What the census says against the list; `held` False: no list for this version."""
    engine: str
    version: str
    held: bool
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    tile_problems: list[str] = field(default_factory=list)
    tiles: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.missing or self.tile_problems)

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "version": self.version, "held": self.held,
                "missing": self.missing, "unexpected": self.unexpected,
                "tile_problems": self.tile_problems, "tiles": self.tiles,
                "source": f"src/infermatrix/data/{DATA.name}"}


def load_data() -> dict[str, Any]:
    return read_data(DATA)


def tile_rule(spec: Mapping[str, Any]) -> TileRule:
    compiled = spec["compiled"]
    if compiled != IMPORT_TIME and not isinstance(compiled, Mapping):
        raise ValueError(f"chunk_o.compiled: {IMPORT_TIME!r} or a mapping, not {compiled!r}")
    return TileRule(family=spec["family"], kernel=spec["kernel"],
                    threshold=int(spec["threshold"]), large=tuple(spec["large"]),
                    small=tuple(spec["small"]),
                    compiled=None if compiled == IMPORT_TIME else dict(compiled),
                    source=spec["source"])


def expected_kernels(engine: str, version: str,
                     data: Mapping[str, Any] | None = None) -> ExpectedKernels | None:
    """The expected list of `engine` `version` (None: not listed)."""
    data = data if data is not None else load_data()
    spec = (data.get(engine) or {}).get(version)
    if spec is None:
        return None
    return ExpectedKernels(engine=engine, version=version,
                           families={name: tuple(kernels)
                                     for name, kernels in spec["families"].items()},
                           source=spec["source"],
                           chunk_o=tile_rule(spec["chunk_o"]) if spec.get("chunk_o") else None)


def census(result: Mapping[str, Any]) -> dict[str, set[tuple[str, str]]]:
    """(family, kernel) pairs compiled per arch in a harness result."""
    return {arch.get("arch"): {(family.get("family"), kernel.get("kernel"))
                               for family in arch.get("families", [])
                               for kernel in family.get("kernels", []) if kernel.get("kernel")}
            for arch in result.get("archs", [])}


def compare_census(expected: ExpectedKernels, compiled: Mapping[str, set[tuple[str, str]]]
                   ) -> tuple[list[str], list[str]]:
    """(missing, unexpected), each `kernel[family]@arch`, in the list's order."""
    wanted = [(family, kernel) for family, kernels in expected.families.items()
              for kernel in kernels]
    missing, unexpected = [], []
    for arch, pairs in compiled.items():
        missing += [f"{k}[{f}]@{arch}" for f, k in wanted if (f, k) not in pairs]
        unexpected += [f"{k}[{f}]@{arch}" for f, k in sorted(pairs) if (f, k) not in wanted]
    return missing, unexpected


def compiled_tiles(family: Mapping[str, Any], kernel: str) -> dict[str, set[int]]:
    """BK and BV values over the compiled configs of `kernel` in one family record."""
    seen: dict[str, set[int]] = {"BK": set(), "BV": set()}
    for record in family.get("kernels", []):
        if record.get("kernel") == kernel and "compile_error" not in record:
            for key in seen:
                value = (record.get("constexprs") or {}).get(key)
                if value is not None:
                    seen[key].add(int(value))
    return seen


def tile_problems(rule: TileRule, arch: str, limit: int,
                  family: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with chunk_o's tiles on `arch` (empty: as the rule says)."""
    where = f"{rule.kernel}@{arch}"
    if family is None:
        return [f"{where}: family {rule.family} is not in the result"]
    reported = family.get("tiles") or {}
    if not reported or "error" in reported:
        return [f"{where}: the import-time tile choice was not reported "
                f"({reported.get('error', 'no record')})"]
    want = rule.tiles_for(limit)
    problems = []
    if list(reported.get("BKV_LIST") or []) != want:
        problems.append(f"{where}: BKV_LIST {reported.get('BKV_LIST')} chosen at import, the "
                        f"rule gives {want} for a {limit} B limit (threshold {rule.threshold})")
    if reported.get("imported_under_driver") is False:
        problems.append(f"{where}: its module was imported while the compile-only driver "
                        "was not active: its tiles were not chosen from the target's limit")
    if list(reported.get("limit_seen") or []) != [limit]:
        problems.append(f"{where}: the import-time query saw {reported.get('limit_seen')}, "
                        f"not the target's [{limit}]")
    seen = compiled_tiles(family, rule.kernel)
    expect = ({"BK": set(want), "BV": set(want)} if rule.compiled is None else
              {key: {int(value)} for key, value in rule.compiled.items()})
    for key, values in expect.items():
        if seen.get(key, set()) != values:
            problems.append(f"{where}: compiled {key} {sorted(seen.get(key, set()))}, "
                            f"expected {sorted(values)}")
    return problems


def hold(expected: ExpectedKernels | None, engine: str, version: str,
         result: Mapping[str, Any]) -> KernelListVerdict:
    """The harness result (the archs judged) against the expected list."""
    if expected is None:
        return KernelListVerdict(engine=engine, version=version, held=False)
    missing, unexpected = compare_census(expected, census(result))
    verdict = KernelListVerdict(engine=engine, version=version, held=True, missing=missing,
                                unexpected=unexpected)
    if expected.chunk_o is not None:
        rule = expected.chunk_o
        for arch in result.get("archs", []):
            family = next((f for f in arch.get("families", [])
                           if f.get("family") == rule.family), None)
            verdict.tiles[arch.get("arch")] = (family or {}).get("tiles")
            verdict.tile_problems += tile_problems(rule, arch.get("arch"),
                                                   int(arch.get("limit") or 0), family)
    return verdict


def verdict_text(verdict: KernelListVerdict) -> str:
    """The verdict's part of the check's detail: every missing and unexpected kernel named."""
    what = f"{verdict.engine} {verdict.version}"
    if not verdict.held:
        return (f"kernel names not held: no expected list for {what} in "
                f"data/{DATA.name}")
    parts = []
    if verdict.missing:
        parts.append(f"expected kernels not compiled ({what}, data/{DATA.name}): "
                     + ", ".join(verdict.missing))
    if verdict.tile_problems:
        parts.append("chunk_o tiles: " + "; ".join(verdict.tile_problems))
    if verdict.unexpected:
        parts.append(f"compiled but not in the expected list of {what}: "
                     + ", ".join(verdict.unexpected))
    if not parts:
        tiles = "; ".join(f"{arch}: chunk_o BKV_LIST {t.get('BKV_LIST')}"
                          for arch, t in verdict.tiles.items() if t)
        parts.append(f"every expected kernel of {what} compiled, none unexpected"
                     + (f" ({tiles})" if tiles else ""))
    return "; ".join(parts)

