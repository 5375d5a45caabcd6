"""The audit stage: one built image against its cell, recorded in the journal."""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Iterable

from ... import journal
from ...engine.docker import Engine
from ...errors import MissingPrerequisite, StageFailure, UnknownChoice, UsageError
from ...model import tritontwin
from ...model.cell import CellPlan
from ...model.spec import CellSpec
from ...model.coverage import Arch
from ...watch import Heartbeat
from .cache import FAIL, SKIP
from .checks import (
    audited_objects,
    check_cuda_major,
    check_floor,
    check_kernels,
    check_loaded_set,
    check_pins,
    check_pip,
    check_torch_cuda,
    expected_pins,
    loaded_set_context,
    no_deps_packages,
    recorded_mapped,
    runtime_chosen_builds,
)
from .probe import ImageFacts, device_code_of, probe_image
from .result import AuditResult, Check, default_targets, parse_targets
from .triton import check_triton_smem, judge_triton
from ..steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401

if TYPE_CHECKING:
    from ...context import Context

def audit_cell(ctx: "Context", spec: CellSpec, image_ref: str,
               targets: Iterable[Arch | str] | None = None, *, record: bool = True,
               twin_archs: Iterable[str] = (), docker: Engine) -> AuditResult:
    """Audit one built image of `docker` against its cell (the run's CellSpec); record it in
    the journal (stage `audit`). `twin_archs`: archs of foreign-CPU cells this native cell is
    the twin of (tritontwin): its Triton check compiles for them too, for those cells to adopt."""
    started = time.monotonic()
    cell = spec.cell
    arch_targets = [Arch.parse(t).device if isinstance(t, str) else t.device
                    for t in targets] if targets else default_targets(cell)
    log_path = ctx.state.cell_log(cell.id, "audit")
    result = AuditResult(cell.id, image_ref, arch_targets)
    runs_emulated = docker.emulation_of(image_ref)
    emulated = runs_emulated if cell.is_gpu else None
    extra = [Arch.parse(a).device for a in twin_archs
             if a not in {t.sm for t in arch_targets}]
    # under emulation Triton cannot start: a native twin's recorded result is looked for first
    triton = start_triton_check(ctx, spec, image_ref, arch_targets, extra, docker) \
        if cell.is_gpu and not emulated else None
    try:
        with Heartbeat(f"{cell.id}: audit probe of {image_ref[:19]}"):
            digest_dists = tritontwin.digest_distributions(spec.engine_package) \
                if cell.is_gpu else ()
            facts = probe_image(image_ref, docker, log_path, digest_dists=digest_dists,
                                emulated=runs_emulated)
        result.phase_s["probe"] = time.monotonic() - started
        load_ctx = loaded_set_context(ctx.matrix.data, facts, cell.cuda if cell.is_gpu else None,
                                      (ctx.matrix.model or {}).get("name"))
        if cell.is_gpu:
            gpu = [o for o in facts.objects if o.get("gpu_code")]
            mark = time.monotonic()
            codes = device_code_of(image_ref, gpu, ctx.state, docker, log_path)
            result.phase_s["device_code"] = time.monotonic() - mark
            result.objects = audited_objects(facts, codes, arch_targets, load_ctx)
            result.checks.append(check_kernels(result.objects, arch_targets))
            result.checks.append(check_cuda_major(facts, cell.cuda,
                                                  runtime_chosen_builds(facts, load_ctx)))
            result.checks.append(check_torch_cuda(facts, cell.cuda, emulated))
            mark = time.monotonic()
            if triton is None:
                triton_check = twin_or_own_triton_check(ctx, spec, image_ref, arch_targets,
                                                        facts, emulated, docker)
            else:
                triton_check = triton.result()
                triton_check.data.update(python=facts.python, py_digests=facts.py_digests)
            result.checks.append(triton_check)
            result.phase_s["triton_wait"] = time.monotonic() - mark  # beyond the overlap
            result.phase_s["triton"] = triton_check.data.get("seconds", 0.0)
        else:
            reason = "arch cpu: no GPU code to audit"
            result.checks += [Check("kernels", SKIP, reason),
                              Check("cuda-major", SKIP, "CPU lane: torch's CUDA libraries are "
                                    "not used"),
                              Check("torch-cuda", SKIP, "CPU lane")]
        pins_check, result.versions = check_pins(facts, expected_pins(spec))
        result.checks.append(pins_check)
        result.checks.append(check_pip(facts, no_deps_packages(ctx, cell)))
        result.checks.append(check_floor(ctx, spec, facts))
        result.checks.append(check_loaded_set(recorded_mapped(ctx, cell.id, image_ref, docker),
                                              arch_targets, load_ctx,
                                              [o.row() for o in result.objects]))
    except StageFailure as exc:  # the probe or cuobjdump failed: the audit fails, with why
        result.checks.append(Check("probe", FAIL, str(exc)))
    finally:
        if triton is not None:  # a failed probe: the check still ends, its container removed
            concurrent.futures.wait([triton])
    result.duration_s = time.monotonic() - started
    if record:
        journal.record_stage(ctx.state, cell.id, "audit", result.status,
                             duration_s=result.duration_s, log=log_path, reason=result.reason,
                             details=result.as_dict())
    return result


def timed_triton_check(ctx: "Context", spec: CellSpec, image_ref: str, targets: list[Arch],
                       docker: Engine, extra: Iterable[Arch] = (), emulated: str | None = None
                       ) -> Check:
    """check_triton_smem for the cell, with a heartbeat and its seconds in the data; its
    harness output goes to the cell's audit log."""
    cell, extra = spec.cell, list(extra)
    began = time.monotonic()
    with Heartbeat(f"{cell.id}: Triton kernels compiled for "
                   f"{', '.join(str(t) for t in [*targets, *extra])}"):
        check = check_triton_smem(
            image_ref, docker, cell.engine, spec.attention_backend, targets,
            (ctx.matrix.model or {}).get("name"), ctx.state.cell_log(cell.id, "audit"),
            emulated=emulated,
            serve_args=spec.launch.args if spec.launch else (), extra_archs=extra,
            engine_version=cell.engine_version, cache=ctx.state.triton_cache)
    check.data["seconds"] = round(time.monotonic() - began, 1)
    return check


def start_triton_check(ctx: "Context", spec: CellSpec, image_ref: str, targets: list[Arch],
                       extra: list[Arch], docker: Engine) -> concurrent.futures.Future[Check]:
    """The Triton compile check, started in a thread of its own: it needs only the image, so
    it runs while the probe and cuobjdump read the objects (both mostly one CPU each, so on a
    2-core machine the audit takes about the longer of the two instead of their sum). The
    thread talks to the audit's engine, `docker`."""
    def run() -> Check:
        return timed_triton_check(ctx, spec, image_ref, targets, docker, extra)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="infermatrix-triton")
    try:
        return pool.submit(run)
    finally:
        pool.shutdown(wait=False)


def twin_or_own_triton_check(ctx: "Context", spec: CellSpec, image_ref: str,
                             targets: list[Arch], facts: ImageFacts, emulated: str | None,
                             docker: Engine) -> Check:
    """A cell whose image runs emulated here: the Triton result of its native twin when the
    journal holds one for these archs with identical sources (tritontwin), else the harness
    in its own image (which cannot start under qemu-user: a skip that names the fix)."""
    audits = {cell_id: record.details_of("audit")
              for cell_id, record in journal.load_records(ctx.state).items()}
    archs = [t.sm for t in targets]
    match, passed_over = tritontwin.adopt(spec.id, facts.python, facts.py_digests, archs,
                                          audits)
    backend = spec.attention_backend
    if match is None:
        check = timed_triton_check(ctx, spec, image_ref, targets, docker, emulated=emulated)
        if check.status == SKIP:
            check.detail += ("; no native twin stands for it: " + "; ".join(passed_over)
                             if passed_over else
                             "; no native twin (a cell of the same CUDA, torch and engine "
                             "for this machine's CPU) is audited in this state directory")
        return check
    check = judge_triton(match.result, backend, engine=(spec.cell.engine,
                                                        spec.cell.engine_version))
    names = ", ".join(f"{n} {d.get('version')}" for n, d in sorted(match.digests.items()))
    check.detail = (f"compiled in the image of its native twin {match.cell_id}, whose Python "
                    f"sources are identical ({names}: every .py file's sha256): "
                    + check.detail)
    check.data.update(twin={"cell": match.cell_id, "image": match.image,
                            "digests": match.digests, "emulated": emulated},
                      python=facts.python, py_digests=facts.py_digests)
    return check


def images_to_audit(ctx: "Context", plans: list[CellPlan], refs: list[str],
                    select: list[str], docker: Engine) -> list[tuple[CellPlan, str]]:
    """(plan, image) pairs to audit, from cell ids, image references (in `docker`) or the
    journal."""
    by_id = {p.id: p for p in plans}
    pairs = []
    if not refs:
        for plan in plans:
            if not plan.planned:
                continue
            image = journal.cell_record(ctx.state, plan.id).image_id
            if image:
                pairs.append((plan, image))
        if not pairs:
            raise MissingPrerequisite("no built cell to audit" + (
                f" among {', '.join(select)}" if select else ""),
                fix="run `infermatrix build` first, or name an image")
        return pairs
    for ref in refs:
        if ref in by_id:
            plan = by_id[ref]
            image = journal.cell_record(ctx.state, ref).image_id
            if not image:
                raise StageFailure(f"{ref} has no built image in the journal",
                                   fix=f"infermatrix build --select {ref}")
        else:
            if not docker.image_exists(ref):
                raise UnknownChoice(f"{ref!r} is neither a cell of {ctx.matrix.path} nor a "
                                    "local image")
            cell_id = docker.image_labels(ref).get("io.infermatrix.cell")
            if not cell_id or cell_id not in by_id:
                raise UsageError(f"image {ref} has no io.infermatrix.cell label naming a cell of "
                                 f"{ctx.matrix.path} (label: {cell_id!r})")
            plan, image = by_id[cell_id], ref
        if not plan.planned:
            raise UsageError(f"{plan.id} is pruned: "
                             + "; ".join(v.reason for v in plan.verdicts))
        pairs.append((plan, image))
    return pairs

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """Kernel coverage, CUDA major, pins, pip check and the engine floor of each built image
    (`run.images`' if named, else the journal's), without a GPU (smoke's static level then
    reuses this record for the same image). The record's `results` are the AuditResults."""
    from ...engine.docker import host_platform
    from ...errors import InfermatrixError
    from ...model.tritontwin import natives_first, twin_archs_for
    passed: list[str] = []
    failed: list[str] = []
    results = {}
    host = host_platform()
    targets = parse_targets(run.options.audit_targets)
    specs = {c.id: c for c in cells}
    # a native twin's Triton result is recorded before its foreign cell looks for it
    for plan in natives_first([c.plan for c in cells], host):
        image = run.images.get(plan.id) or journal.cell_record(run.ctx.state, plan.id).image_id
        try:
            if not image:  # a typed check: audit_cell needs an image reference
                raise StageFailure(f"{plan.id} has no built image in the journal",
                                   fix=f"infermatrix build --select {plan.id}")
            result = audit_cell(run.ctx, specs[plan.id], image, targets,
                                record=run.options.record_audit,
                                twin_archs=twin_archs_for(plan, run.plans, host),
                                docker=run.docker)
            results[plan.id], ok = result, result.passed
            echo(f"{plan.id}: audit {result.status}" +
                 (f": {result.reason}" if result.reason else ""))
        except InfermatrixError as exc:
            ok = False
            echo(f"{plan.id}: audit failed: {exc}")
        (passed if ok else failed).append(plan.id)
    record = step_record("audit", passed, failed)
    record.results = results
    return record
