"""The checks (pure: the probe's facts in, a Check out)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ... import journal, proc
from ...engine.docker import Engine
from ...model import loadedset
from ...model.cell import Cell
from ...model.spec import CellSpec
from ...model.coverage import Arch, DeviceCode, decide
from .cache import _CUDA_SONAME, _CUDA_WHEEL, FAIL, NOT_LOADED_GROUP, PASS, SKIP
from .probe import ImageFacts
from .result import AuditedObject, Check, object_groups

if TYPE_CHECKING:
    from ...context import Context

def check_kernels(objects: list[AuditedObject], targets: list[Arch]) -> Check:
    """Objects loaded (or not known to be unloaded) must cover every target; PTX-JIT ones are
    flagged with their JIT cost; the ones data says are not loaded are listed with why."""
    if not objects:
        return Check("kernels", FAIL, "no shared object with GPU code found under site-packages")
    bad = [o for o in objects if not o.covered]
    waived = []
    for obj in objects:
        idle = [str(d.target) for d in obj.decisions if obj.group(d) == NOT_LOADED_GROUP]
        reasons = dict.fromkeys(obj.waivers[t] for t in idle)
        if idle:
            waived.append(f"{obj.path} on {', '.join(idle)}: {' / '.join(reasons)}")
    jit = [o for o in objects if any(o.group(d) == "ptx-jit" for d in o.decisions)]
    names = ", ".join(str(t) for t in targets)
    groups = {str(t): object_groups(objects, t) for t in targets}
    data: dict[str, Any] = {"objects": len(objects), "uncovered": [o.path for o in bad],
            "ptx_jit": [o.path for o in jit], "not_loaded": waived,
            "counts": {t: g["counts"] for t, g in groups.items()}}
    counts = "; ".join(f"{t}: {c['covered']} covered, {c['ptx-jit']} PTX-JIT, "
                       f"{c[NOT_LOADED_GROUP]} not loaded" for t, c in data["counts"].items())
    if bad:
        listed = "; ".join(f"{o.path} [{o.package or '?'}]: {d.note}"
                           for o in bad for d in o.decisions if o.fails(d))
        return Check("kernels", FAIL, f"{len(bad)} of {len(objects)} objects do not run on "
                     f"{names}: {listed}", data)
    detail = f"{len(objects)} objects cover {names} ({counts})"
    if jit:
        detail += (f"; {len(jit)} only through PTX JIT (the driver compiles them at first load: "
                   "slower first start): " + ", ".join(o.path for o in jit))
    if waived:
        detail += f"; {len(waived)} not loaded there (loaded.yaml / audit.not_loaded): " + \
            "; ".join(waived)
    return Check("kernels", PASS, detail, data)


def cuda_majors(facts: ImageFacts, chosen_at_run_time: Iterable[str] = ()) -> dict[int, list[str]]:
    """CUDA major -> the evidence (linked sonames, bundled libraries, NVIDIA wheels). Objects in
    `chosen_at_run_time` (builds for another CUDA major that their package never loads on this
    CUDA, by loaded.yaml) are no evidence."""
    skip = set(chosen_at_run_time)
    found: dict[int, list[str]] = defaultdict(list)
    for obj in facts.objects:
        if obj["rel"] in skip:
            continue
        for needed in obj.get("needed", []):
            match = _CUDA_SONAME.match(needed)
            if match:
                found[int(match.group(2))].append(f"{obj['rel']} links {needed}")
        match = _CUDA_SONAME.match(Path(obj["rel"]).name)
        if match:
            found[int(match.group(2))].append(f"bundles {obj['rel']}")
    for name, version in facts.distributions.items():
        match = _CUDA_WHEEL.match(name)
        if match:
            major = int(match.group(2)) if match.group(2) else int(version.split(".")[0])
            found[major].append(f"wheel {name}=={version}")
    return dict(found)


def runtime_chosen_builds(facts: ImageFacts, load_ctx: loadedset.LoadContext) -> dict[str, str]:
    """rel path -> why: builds for another CUDA major that their package does not load here."""
    chosen = {}
    for obj in facts.objects:
        found = loadedset.load_verdict(obj["rel"], None, load_ctx)
        if found.runtime_cuda:
            chosen[obj["rel"]] = f"{found.reason} ({found.source})"
    return chosen


def check_cuda_major(facts: ImageFacts, cuda: str,
                     chosen_at_run_time: dict[str, str] | None = None) -> Check:
    expected = int(cuda.split(".")[0])
    chosen_at_run_time = chosen_at_run_time or {}
    majors = cuda_majors(facts, chosen_at_run_time)
    if not majors:
        return Check("cuda-major", FAIL, "no CUDA runtime library linked or bundled in the image")
    others = {m: ev for m, ev in majors.items() if m != expected}
    data = {"majors": {str(m): sorted(set(ev))[:20] for m, ev in majors.items()},
            "chosen_at_run_time": chosen_at_run_time}
    if others:
        evidence = "; ".join(f"CUDA {m}: " + ", ".join(sorted(set(ev))[:5])
                             for m, ev in sorted(others.items()))
        return Check("cuda-major", FAIL, f"the cell is CUDA {cuda} but the image mixes in "
                     f"{evidence}", data)
    detail = f"every CUDA runtime library is CUDA {expected}"
    if chosen_at_run_time:
        detail += (f"; {len(chosen_at_run_time)} builds for another CUDA major are never loaded "
                   "here (chosen at run time): " + ", ".join(sorted(chosen_at_run_time)))
    return Check("cuda-major", PASS, detail, data)


def check_torch_cuda(facts: ImageFacts, cuda: str, emulated: str | None = None) -> Check:
    """torch.version.cuda is the cell's CUDA. Under emulation (`emulated`: why, e.g. "linux/arm64
    under QEMU on linux/amd64") an import that cannot run there is no finding about the image:
    torch/version.py, which torch.version.cuda reads, answers instead, and the detail says so."""
    if facts.torch is None:
        return Check("torch-cuda", FAIL, "torch is not installed")
    torch_facts, how = facts.torch, ""
    if "error" in facts.torch:
        static = facts.torch.get("static")
        if not (emulated and static and static.get("cuda")):
            return Check("torch-cuda", FAIL,
                         "import torch failed: " + proc.tail(facts.torch["error"], 5))
        torch_facts = static
        how = (f" (read from torch/version.py: `import torch` cannot run {emulated}: "
               f"{proc.tail(facts.torch['error'], 1)})")
    got = torch_facts.get("cuda")
    data = {"torch": torch_facts.get("version"), "torch_cuda": got,
            "arch_list": torch_facts.get("arch_list"), "emulated": emulated,
            "import_error": proc.tail(facts.torch["error"], 5) if how else None}
    if got is None or ".".join(str(got).split(".")[:2]) != cuda:
        return Check("torch-cuda", FAIL, f"torch.version.cuda is {got}, the cell is CUDA {cuda}",
                     data)
    return Check("torch-cuda", PASS,
                 f"torch {torch_facts.get('version')} built for CUDA {got}{how}", data)


def expected_pins(spec: CellSpec) -> dict[str, tuple[str, str]]:
    """canonical name -> (version, where the pin comes from): the lock, then the cell."""
    from packaging.utils import canonicalize_name

    from ...model.spec import MATCH_ENGINE

    pins: dict[str, tuple[str, str]] = {}
    cell = spec.cell
    for name, version in spec.lock_pins.items():
        pins[name] = (version, f"lock {spec.lock_path.name}")
    pins["torch"] = (cell.torch, "cell axis torch")
    if spec.engine_package:
        pins[canonicalize_name(spec.engine_package)] = (cell.engine_version, "cell axis engine")
    for kernel in spec.serve_kernels:  # the training-only ones: the train image's (issue 47)
        if kernel.declared and kernel.scope != MATCH_ENGINE:
            pins[canonicalize_name(kernel.package)] = (kernel.declared,
                                                       f"build.kernels.{kernel.name}")
    return pins


def version_matches(pinned: str, installed: str) -> bool:
    """`==pinned` in PEP 440 terms: 2.11.0 accepts 2.11.0+cu130; 2.11.0+cu130 wants exactly it."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(f"=={pinned}").contains(installed, prereleases=True)
    except InvalidSpecifier:
        return pinned == installed


def check_pins(facts: ImageFacts,
               pins: dict[str, tuple[str, str]]) -> tuple[Check, dict[str, str]]:
    wrong, missing, versions = [], [], {}
    for name, (pinned, source) in sorted(pins.items()):
        installed = facts.distributions.get(name)
        if installed is None:
            missing.append(f"{name}=={pinned} ({source})")
            continue
        versions[name] = installed
        if not version_matches(pinned, installed):
            wrong.append(f"{name}: pinned {pinned} ({source}), installed {installed}")
    data = {"checked": len(pins), "mismatched": wrong, "missing": missing}
    if wrong or missing:
        parts = list(wrong)
        if missing:
            shown = "; ".join(missing[:8]) + (f"; and {len(missing) - 8} more" if len(missing) > 8
                                              else "")
            parts.append(f"{len(missing)} pinned packages not installed: {shown}")
        return Check("pins", FAIL, "; ".join(parts), data), versions
    return Check("pins", PASS, f"{len(pins)} pinned packages installed at their pins", data), \
        versions


def no_deps_packages(ctx: "Context", cell: Cell) -> list[str]:
    engine = ctx.matrix.engines.get(cell.engine, {})
    return list(engine.get("install", {}).get("no_deps", []))


def check_pip(facts: ImageFacts, waived: Iterable[str] = ()) -> Check:
    """`pip check` must be clean, except for packages the matrix installs with --no-deps on
    purpose (their unmet requirements are waived and listed)."""
    from packaging.utils import canonicalize_name

    result = facts.pip_check
    waived_names = {canonicalize_name(w) for w in waived}
    lines = [ln.strip() for ln in result.get("output", "").splitlines() if ln.strip()]
    problems = [ln for ln in lines if _pip_problem(ln)]
    sbsa = _sbsa_tagged(result)
    kept = [ln for ln in problems if canonicalize_name(_pip_subject(ln)) not in waived_names
            and _pip_subject(ln) not in sbsa]
    waived_lines = [ln for ln in problems if ln not in kept and _pip_subject(ln) not in sbsa]
    data = {"tool": result.get("tool"), "command": result.get("command"),
            "returncode": result.get("returncode"), "waived": waived_lines,
            "sbsa_tagged": sorted(sbsa)}
    if kept or (result.get("returncode") != 0 and not problems):
        return Check("pip-check", FAIL, "; ".join(kept) or proc.tail(result.get("output", ""), 5),
                     data)
    detail = f"{result.get('tool')} check clean"
    if waived_lines:
        detail += " (waived, installed with --no-deps: " + "; ".join(waived_lines) + ")"
    if sbsa:
        detail += (f"; {len(sbsa)} NVIDIA wheel(s) whose WHEEL file says `*_sbsa` (Arm's "
                   f"server architecture: aarch64) where the file name the installer matched "
                   f"says aarch64, accepted on {result.get('machine')}: " + ", ".join(sorted(sbsa)))
    return Check("pip-check", PASS, detail, data)


def _sbsa_tagged(result: dict[str, Any]) -> set[str]:
    """Packages pip/uv check calls "built for a different platform" only because their WHEEL
    file's tags are all `..._sbsa` (NVIDIA's name for aarch64 servers, e.g. nvidia-cusparselt-cu13
    0.8.1: `py3-none-manylinux2014_sbsa`), read from the image on an aarch64 interpreter."""
    if result.get("machine") != "aarch64":
        return set()
    return {name for name, tags in (result.get("wheel_tags") or {}).items()
            if tags and all(tag.endswith("_sbsa") for tag in tags)}


def _pip_subject(line: str) -> str:
    """The package a problem line is about: `The package `x` requires ...` (uv) or `x 1.0 has
    requirement ...` / `x 1.0 requires ...` (pip)."""
    match = re.match(r"^The package `([^`]+)`", line)
    return match.group(1) if match else line.split()[0]


def _pip_problem(line: str) -> bool:
    """A problem line of `pip check` / `uv pip check` output (not a summary or a header)."""
    lowered = line.lower()
    if lowered.startswith(("no broken requirements", "checked ", "found ", "all installed",
                           "using python", "warning")):
        return False
    return any(k in lowered for k in (" requires ", " has requirement ", "is not installed",
                                      " which is not", "but you have", "is incompatible",
                                      "the package", "requirement"))


def check_floor(ctx: "Context", spec: CellSpec, facts: ImageFacts) -> Check:
    from packaging.utils import canonicalize_name

    package, engine = spec.engine_package, spec.cell.engine
    floor = ctx.matrix.floors.get(engine)
    if not package:
        return Check("engine-floor", SKIP, f"engine {engine} installs no package")
    if floor is None:
        return Check("engine-floor", SKIP, f"model.floors names no floor for {engine}")
    installed = facts.distributions.get(canonicalize_name(package))
    if installed is None:
        return Check("engine-floor", FAIL, f"{package} is not installed")
    if not floor.contains(installed, prereleases=True):
        return Check("engine-floor", FAIL, f"{package} {installed} is below the model card's "
                     f"floor {floor}")
    return Check("engine-floor", PASS, f"{package} {installed} meets {floor}")


def loaded_set_context(ctx_matrix_data: dict[str, Any], facts: ImageFacts, cuda: str | None,
                       model: str | None) -> loadedset.LoadContext:
    """What loaded.yaml's verdicts depend on: installed versions, CUDA major, model traits."""
    traits = loadedset.model_traits(model)
    major = int(cuda.split(".")[0]) if cuda and cuda[0].isdigit() else None
    return loadedset.LoadContext(
        distributions=facts.distributions, cuda_major=major,
        traits=tuple(traits["traits"]) if traits else None,
        linked={name for obj in facts.objects for name in obj.get("needed", [])},
        entries=loadedset.entries(ctx_matrix_data))


def audited_objects(facts: ImageFacts, codes: dict[str, DeviceCode], targets: list[Arch],
                    load_ctx: loadedset.LoadContext | None = None) -> list[AuditedObject]:
    load_ctx = load_ctx or loaded_set_context({}, facts, None, None)
    objects = []
    for obj in facts.objects:
        if not obj.get("gpu_code"):
            continue
        code = codes[obj["sha256"]]
        if code.empty:  # a fat binary section with nothing cuobjdump can list
            continue
        loads = {str(t): loadedset.load_verdict(obj["rel"], t, load_ctx) for t in targets}
        waivers = {t: f"{v.reason} (loaded.yaml {v.entry}; {v.source})" if v.source
                   else f"{v.reason} ({v.entry})"
                   for t, v in loads.items() if not v.counts_as_loaded}
        objects.append(AuditedObject(obj["rel"], obj.get("dist"), obj["size"], code,
                                     [decide(code, t) for t in targets], waivers, loads))
    return objects


def recorded_mapped(ctx: "Context", cell_id: str, image: str, docker: Engine
                    ) -> dict[str, Any] | None:
    """The objects the `model` smoke level saw the server map, for this very image."""
    smoke = journal.cell_record(ctx.state, cell_id).smoke
    mapped = smoke.levels["model"].extra.get("mapped") if "model" in smoke.levels else None
    if not mapped or smoke.image_id not in (image, _image_id(image, docker)):
        return None
    return mapped


def _image_id(ref: str, docker: Engine) -> str | None:
    try:
        return docker.image_id_of(ref)
    except Exception:  # noqa: BLE001 - no engine: no observation to match
        return None


def check_loaded_set(mapped: dict[str, Any] | None, targets: list[Arch],
                     load_ctx: loadedset.LoadContext, rows: list[dict[str, Any]]) -> Check:
    """The server's mapped objects (when the model level recorded them) against loaded.yaml
    and the coverage verdicts."""
    if mapped is None:
        return Check("loaded-set", SKIP, "no server observation recorded for this image yet "
                     "(the model smoke level records /proc/<pid>/maps)")
    judged = loadedset.judge_mapped(mapped.get("objects", []), targets, load_ctx, rows)
    return Check("loaded-set", journal.Status(judged.status), judged.detail,
                 {"mapped": len(mapped.get("objects", [])), "notes": judged.notes,
                  "problems": judged.problems})
