"""Compatibility rules, evaluated by pure code over data (data/rules.yaml + matrix.yaml).

Each rule looks at one cell and returns the verdicts that prune it (empty: the rule passes).
Facts read from package metadata arrive as `EngineFacts`; gathering them is plan.py's job, so
everything here runs without a network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..config import Matrix
from ..datafiles import DATA_DIR, read_data
from .cell import CPU, Cell, Verdict

RULES_PATH = DATA_DIR / "rules.yaml"


def load_rules() -> dict[str, Any]:
    return read_data(RULES_PATH)


def in_range(entry: Mapping[str, Any], version: str | Version) -> bool:
    """Does the data entry's `versions` range hold `version` (pre-releases too)?"""
    return SpecifierSet(entry["versions"]).contains(version, prereleases=True)


@dataclass(frozen=True)
class EngineFacts:
    """What the package index says about one engine release."""

    metadata_url: str
    torch_pins: tuple[str, ...]  # e.g. ("torch==2.11.0",)
    pinned_torch: str | None  # the exact version the pin names, when it names one
    torch_cuda: str | None  # CUDA runtime of that torch's PyPI wheel: "12.8", "13.0", "cpu"
    wheel: str = ""  # the engine wheel the metadata was read from
    cell_torch_cuda: str | None = None  # CUDA runtime of PyPI's wheel of the cell's torch
    exact_pins: tuple[tuple[str, str], ...] = ()  # (name, version) of its `==` requirements


def cuda_of_requirements(requires_dist: tuple[str, ...]) -> str:
    """The CUDA runtime a torch wheel pulls ("12.8"), or "cpu" when it pulls none.

    torch <= 2.10 names `nvidia-cuda-runtime-cu12==12.8.90`; 2.11+ names
    `cuda-toolkit[cudart,...]==13.0.2`.
    """
    for line in requires_dist:
        req = Requirement(line)
        name = req.name.lower()
        if name.startswith("nvidia-cuda-runtime") or (
                name == "cuda-toolkit" and "cudart" in req.extras):
            for spec in req.specifier:
                if spec.operator == "==":
                    release = Version(spec.version.rstrip(".*")).release
                    return f"{release[0]}.{release[1]}"
    return CPU


def exact_pin(pins: tuple[str, ...]) -> str | None:
    for pin in pins:
        for spec in Requirement(pin).specifier:
            if spec.operator == "==" and "*" not in spec.version:
                return spec.version
    return None


def _cuda_tuple(cuda: str) -> tuple[int, ...]:
    return tuple(int(p) for p in cuda.split("."))


def _minor(version: str) -> str:
    release = Version(version).release
    return f"{release[0]}.{release[1]}"


def torch_satisfies(cell: Cell, pins: tuple[str, ...]) -> bool:
    """Does the cell's torch meet the engine's pins? A local label in a pin (`+cpu`) names a
    variant: it is met by the cell's own variant (the CPU lane meets `==2.13.0+cpu`)."""
    for pin in pins:
        spec = Requirement(pin).specifier
        candidate = cell.torch
        if any("+" in s.version for s in spec):
            candidate = f"{cell.torch}+{cell.cuda_tag}"
        if not spec.contains(candidate, prereleases=True):
            return False
    return True


# --- the driver a cell needs -------------------------------------------------------------------
DRIVERS_PATH = DATA_DIR / "drivers.yaml"


def load_drivers() -> dict[str, Any]:
    return read_data(DRIVERS_PATH)


def min_driver_for(cuda: str) -> str | None:
    """The minimum Linux driver for a CUDA version (None on the CPU lane or when unknown)."""
    return None if cuda == CPU else load_drivers()["min_driver"].get(cuda)


def known_bad_driver(driver: str, compute_cap: str) -> dict[str, Any] | None:
    """The data/drivers.yaml `known_bad` entry a GPU's driver falls in, else None."""
    from packaging.version import InvalidVersion

    try:
        have = Version(driver)
    except InvalidVersion:
        return None
    for entry in load_drivers().get("known_bad") or []:
        caps = entry.get("capabilities")
        if caps and compute_cap not in caps:
            continue
        if in_range(entry, have):
            return entry
    return None


def cuda_of_ptx_isa(isa: str) -> str | None:
    """The CUDA release that writes PTX ISA `isa` (e.g. "8.8" -> "12.9")."""
    return load_drivers()["ptx_isa"]["cuda"].get(isa)


def driver_floor(cell: Cell, facts: EngineFacts | None, ptx_isas: dict[str, str] | None = None
                 ) -> tuple[str | None, str | None]:
    """(oldest driver, why) for a cell: the CUDA runtime it links and the PTX ISA of PTX-only
    objects it loads (`ptx_isas`: object -> ISA, from reading the wheels), whichever needs more."""
    if cell.cuda == CPU:
        return None, None
    needs: list[tuple[Version, str, str]] = []
    runtime = min_driver_for(cell.cuda)
    if runtime:
        needs.append((Version(runtime), runtime, f"CUDA {cell.cuda} runtime needs >= {runtime}"))
    for obj, isa in sorted((ptx_isas or {}).items()):
        cuda = cuda_of_ptx_isa(isa)
        driver = min_driver_for(cuda) if cuda else None
        if driver:
            needs.append((Version(driver), driver, f"{obj} is PTX ISA {isa} only (JIT by the "
                          f"driver: CUDA {cuda}, >= {driver})"))
    if not needs:
        return None, f"no driver minimum known for CUDA {cell.cuda} (data/drivers.yaml)"
    _, driver, reason = max(needs)
    return driver, reason


# --- the rules ------------------------------------------------------------------------------

def arch_min_cuda(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    rule = load_rules()["arch-min-cuda"]
    if not cell.is_gpu or cell.cuda == CPU:
        return []
    minimum = rule["minimum"].get(cell.arch.rstrip("af"))
    if minimum and _cuda_tuple(cell.cuda) < _cuda_tuple(minimum):
        return [Verdict("arch-min-cuda", rule["reason"].format(
            arch=cell.arch, minimum=minimum, cuda=cell.cuda), rule["source"])]
    return []


def model_floor(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    rule = load_rules()["model-floor"]
    floor = m.floors.get(cell.engine)
    if floor is None or floor.contains(cell.engine_version, prereleases=True):
        return []
    return [Verdict("model-floor", rule["reason"].format(
        engine=cell.engine, version=cell.engine_version, floor=str(floor),
        model=m.model["name"]), rule["source"].format(card=m.model["card"]))]


def platform_match(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    rule = load_rules()["platform-match"]
    platform = m.engines[cell.engine]["platform"]
    cpu_lane = not cell.is_gpu
    if (platform == "cpu") == cpu_lane and (cell.cuda == CPU) == cpu_lane:
        return []
    return [Verdict("platform-match", rule["reason"].format(
        engine=cell.engine, platform=platform, arch=cell.arch), rule["source"])]


def torch_variant(cell: Cell) -> dict[str, Any] | None:
    return load_rules()["torch-cuda-variant"]["variants"].get(_minor(cell.torch))


def torch_variant_known(cell: Cell) -> bool | None:
    """What the table knows of the cell's torch CUDA variant: True (listed), False (known
    absent, with its source), None (the table cannot say: the index decides)."""
    variant = torch_variant(cell)
    if variant is None:
        return None
    if cell.cuda_tag in (variant.get("absent") or []):
        return False
    return True if cell.cuda_tag in variant.get("all", []) else None


def torch_cuda_variant(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    """PyPI's torch wheel is one CUDA build (read from its METADATA); any other CUDA must be a
    variant the torch index publishes. Only a variant the table records as absent (with its
    source and check date) prunes here; one the table does not list is asked of the index when
    the cell is planned (plan.check_variants): found, not found, or "unverified"."""
    rule = load_rules()["torch-cuda-variant"]
    if cell.cuda == CPU:
        return []
    if facts is not None and facts.cell_torch_cuda == cell.cuda:
        return []
    if torch_variant_known(cell) is not False:
        return []
    variant = torch_variant(cell) or {}
    pypi = f" (PyPI's wheel is CUDA {facts.cell_torch_cuda})" if facts and facts.cell_torch_cuda \
        else ""
    source = rule["source"]
    if variant.get("source"):
        source = f"{source}; {variant['source']} (checked {variant.get('checked')})"
    return [Verdict("torch-cuda-variant", rule["reason"].format(
        torch=cell.torch, cuda_tag=cell.cuda_tag, variants=", ".join(variant.get("all", []))) + pypi,
        source)]


def engine_torch_pin(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    rule = load_rules()["engine-torch-pin"]
    if facts is None or not facts.torch_pins or torch_satisfies(cell, facts.torch_pins):
        return []
    return [Verdict("engine-torch-pin", rule["reason"].format(
        engine=cell.engine, version=cell.engine_version, pin=", ".join(facts.torch_pins),
        torch=cell.torch), rule["source"].format(metadata_url=facts.metadata_url))]


def pypi_build_covers(variant: dict[str, Any], version: str) -> bool:
    """Is the engine's PyPI wheel itself the build for this variant's CUDA at `version`
    (matrix.yaml engines.<e>.variants.<cuda>.pypi_build: a version range with its source)?"""
    entry = variant.get("pypi_build")
    if not entry:
        return False
    return in_range(entry, version)


def engine_variant_serves(cell: Cell, m: Matrix) -> str | None:
    """How the engine gets a build for the cell's CUDA other than its PyPI torch pin's:
    "pypi" (the PyPI wheel is that CUDA's build; only torch comes from the torch index),
    "asset" (a release wheel/index declared in matrix.yaml), None (nothing declared)."""
    variant = m.engines[cell.engine].get("variants", {}).get(cell.cuda)
    if not variant:
        return None
    if pypi_build_covers(variant, cell.engine_version):
        return "pypi"
    return "asset" if variant.get("wheel") or variant.get("index") else None


def engine_cuda_build(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    rule = load_rules()["engine-cuda-build"]
    if cell.cuda == CPU or facts is None or facts.torch_cuda is None:
        return []
    if facts.torch_cuda == cell.cuda or engine_variant_serves(cell, m) is not None:
        return []
    return [Verdict("engine-cuda-build", rule["reason"].format(
        engine=cell.engine, version=cell.engine_version, pinned_torch=facts.pinned_torch,
        engine_cuda=facts.torch_cuda, cuda=cell.cuda),
        rule["source"].format(metadata_url=facts.metadata_url))]


# --- FlashInfer's JIT on SM 12.x ------------------------------------------------------------
FLASHINFER = "flashinfer-python"
FLASHINFER_ARCH_ENV = "FLASHINFER_CUDA_ARCH_LIST"


def flashinfer_version(facts: EngineFacts | None) -> str | None:
    """The flashinfer-python release the engine pins (from its METADATA), else None."""
    return dict(facts.exact_pins).get(FLASHINFER) if facts else None


def flashinfer_arch_value(cell: Cell) -> str | None:
    """The runtime FLASHINFER_CUDA_ARCH_LIST for the cell's arch, always suffixed (rules.yaml
    flashinfer-jit-arch.arch_list): the family target where nvcc makes it, else the arch's own."""
    table = load_rules()["flashinfer-jit-arch"]["arch_list"]
    arch = cell.arch.rstrip("af")
    if not cell.is_gpu or cell.cuda == CPU:
        return None
    if arch in table.get("family", {}) and \
            _cuda_tuple(cell.cuda) >= _cuda_tuple(table["family_min_nvcc"]):
        return table["family"][arch]
    return table["specific"].get(arch)


def engine_env(cell: Cell, m: Matrix, facts: EngineFacts | None) -> dict[str, str]:
    """The image's environment: matrix.yaml's (engine, then per arch), plus FlashInfer's arch
    list where the engine pins flashinfer-python and matrix.yaml does not set it."""
    engine = m.engines[cell.engine]
    env = {**engine.get("env", {}), **engine.get("arch", {}).get(cell.arch, {}).get("env", {})}
    value = flashinfer_arch_value(cell) if flashinfer_version(facts) else None
    if value and FLASHINFER_ARCH_ENV not in env:
        env[FLASHINFER_ARCH_ENV] = value
    return dict(sorted(env.items()))


def _suffixed(value: str) -> bool:
    """Does every entry of a FLASHINFER_CUDA_ARCH_LIST carry a suffix (used as-is)?"""
    entries = value.split()
    return bool(entries) and all(e.partition(".")[2][-1:].isalpha() for e in entries)


def flashinfer_jit_arch(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    """A FlashInfer release that refuses SM 12.x below an nvcc, in a cell whose nvcc (its CUDA)
    is below it, runs only where FLASHINFER_CUDA_ARCH_LIST names a suffixed target."""
    rule = load_rules()["flashinfer-jit-arch"]
    version = flashinfer_version(facts)
    if version is None or not cell.is_gpu or cell.cuda == CPU:
        return []
    for entry in rule["refuses"]:
        if cell.arch.rstrip("af") not in entry["archs"] or not in_range(entry, version) or \
                _cuda_tuple(cell.cuda) >= _cuda_tuple(entry["below_nvcc"]):
            continue
        value = engine_env(cell, m, facts).get(FLASHINFER_ARCH_ENV)
        if value and _suffixed(value):
            return []
        return [Verdict("flashinfer-jit-arch", rule["reason"].format(
            version=version, arch=cell.arch, cuda=cell.cuda, message=entry["message"],
            value=value or "unset"), f"{entry['source']} (checked {entry['checked']})")]
    return []


def backend_runs_on(backend: str, arch: str, cell: Cell | None = None) -> bool:
    """Can the backend's kernels run on the arch? An engine release may add archs its own
    backend reaches (backends.<b>.engines.<engine>: versions, archs)."""
    spec = load_rules()["attention-backend-arch"]["backends"].get(backend)
    if spec is None:
        return False
    plain = arch.rstrip("af")
    if spec["archs"] == "any" or arch in spec["archs"] or plain in spec["archs"]:
        return True
    if cell is None:
        return False
    for entry in (spec.get("engines") or {}).get(cell.engine, []):
        if plain in entry["archs"] and in_range(entry, cell.engine_version):
            return True
    return False


def hybrid_gdn_allowed(cell: Cell, m: Matrix) -> tuple[list[str], str] | None:
    """(backends, source) an engine version accepts for a hybrid Gated DeltaNet model on the
    cell's arch (rules.yaml attention-backend-arch.hybrid_gdn); None: no gate applies."""
    from .loadedset import model_traits

    traits = model_traits(m.model.get("name")) or {}
    if "hybrid-gdn" not in traits.get("traits", []):
        return None
    gates = load_rules()["attention-backend-arch"].get("hybrid_gdn", {}).get(cell.engine, [])
    for gate in gates:
        if cell.arch.rstrip("af") in gate["archs"] and in_range(gate, cell.engine_version):
            return list(gate["allowed"]), gate["source"]
    return None


def engine_default_backend(cell: Cell) -> dict[str, Any] | None:
    """The rules.yaml engine_default entry for the cell's engine, version and arch, else None."""
    entries = load_rules()["attention-backend-arch"].get("engine_default", {}).get(cell.engine, [])
    for entry in entries:
        if cell.arch.rstrip("af") in entry["archs"] and in_range(entry, cell.engine_version):
            return entry
    return None


@dataclass(frozen=True)
class BackendChoice:
    """The full-attention backend a cell serves with, why, and what prunes it."""

    backend: str | None  # passed with the engine's attention flag; None: the engine picks
    why: str  # "engine default", "matrix.yaml ...": shown by `plan`
    source: str
    verdicts: tuple[Verdict, ...] = ()


def _gate_verdicts(cell: Cell, backend: str, gate: tuple[list[str], str] | None,
                   what: str, check_arch: bool = True) -> list[Verdict]:
    rule = load_rules()["attention-backend-arch"]
    backends = rule["backends"]
    verdicts = []
    if check_arch and not backend_runs_on(backend, cell.arch, cell):
        note = backends.get(backend, {}).get("note", "unknown backend")
        verdicts.append(Verdict("attention-backend-arch", f"{what} {backend} cannot run on "
                                f"{cell.arch}: {note}",
                                backends.get(backend, {}).get("source", rule["source"])))
    if gate and backend not in gate[0]:
        verdicts.append(Verdict("attention-backend-arch",
                                f"{cell.engine} {cell.engine_version} accepts only "
                                f"{', '.join(gate[0])} for hybrid GDN models on {cell.arch}, "
                                f"not {backend}", gate[1]))
    return verdicts


def backend_choice(cell: Cell, m: Matrix) -> BackendChoice:
    """Which full-attention backend and why: an explicit per-arch choice, else matrix.yaml's
    preference order (an override, with its reason), else the engine's own default on the arch
    read from its released code (rules.yaml engine_default). A choice the arch or the engine's
    hybrid GDN gate refuses prunes the cell instead of being silently replaced."""
    rule = load_rules()["attention-backend-arch"]
    engine = m.engines[cell.engine]
    if not cell.is_gpu:
        return BackendChoice(None, "", "")
    per_arch = engine.get("arch", {}).get(cell.arch, {})
    explicit = per_arch.get("attention_backend")
    gate = hybrid_gdn_allowed(cell, m)
    if explicit:
        reason = per_arch.get("attention_backend_reason") or "no reason given"
        verdicts = _gate_verdicts(cell, explicit, gate, "attention backend")
        return BackendChoice(None if verdicts else explicit,
                             f"matrix.yaml engines.{cell.engine}.arch.{cell.arch}: {reason}",
                             "matrix.yaml", tuple(verdicts))
    preferences = engine.get("attention_backends", [])
    if preferences:
        reason = engine.get("attention_backends_reason") or "no reason given"
        why = (f"matrix.yaml engines.{cell.engine}.attention_backends "
               f"[{', '.join(preferences)}]: {reason}")
        for backend in preferences:
            if gate and backend not in gate[0]:
                continue
            if backend_runs_on(backend, cell.arch, cell):
                return BackendChoice(backend, why, "matrix.yaml")
        return BackendChoice(None, why, "matrix.yaml", (Verdict(
            "attention-backend-arch", f"none of {cell.engine}'s attention backends "
            f"({', '.join(preferences)}) runs on {cell.arch}", rule["source"]),))
    default = engine_default_backend(cell)
    if default is None:
        return BackendChoice(None, f"{cell.engine} {cell.engine_version}'s default on "
                             f"{cell.arch} is not recorded (rules.yaml engine_default): the "
                             "engine picks at run time", rule["source"])
    source = f"{default['source']} (checked {default.get('checked')})"
    why = f"{cell.engine}'s own default on {cell.arch}" + (
        f" ({default['when']})" if default.get("when") else "")
    backend = default["backend"]
    # an engine_default entry is per arch already (the engine's own pick there); its hybrid
    # GDN gate is checked all the same, so conflicting data prunes instead of passing
    verdicts = _gate_verdicts(cell, backend, gate, f"{cell.engine}'s default backend",
                              check_arch=False)
    if not engine.get("attention_flag"):  # nothing to pass: the engine picks it itself
        return BackendChoice(None, f"{why}: {backend} (no attention flag: the engine picks "
                             "it itself)", source, tuple(verdicts))
    return BackendChoice(None if verdicts else backend, why, source, tuple(verdicts))


def choose_attention_backend(cell: Cell, m: Matrix) -> tuple[str | None, list[Verdict]]:
    """(backend, verdicts) of backend_choice."""
    choice = backend_choice(cell, m)
    return choice.backend, list(choice.verdicts)


def attention_backend_arch(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    return choose_attention_backend(cell, m)[1]


Rule = Callable[[Cell, Matrix, "EngineFacts | None"], list[Verdict]]

# Rules that need no package metadata come first; all of them run for every cell so that a
# pruned cell shows every reason at once.
STATIC_RULES: tuple[Rule, ...] = (platform_match, arch_min_cuda, model_floor, torch_cuda_variant,
                                  attention_backend_arch)
METADATA_RULES: tuple[Rule, ...] = (engine_torch_pin, engine_cuda_build, flashinfer_jit_arch)


def evaluate(cell: Cell, m: Matrix, facts: EngineFacts | None) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for rule in (*STATIC_RULES, *METADATA_RULES):
        verdicts.extend(rule(cell, m, facts))
    return verdicts
