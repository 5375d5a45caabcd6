"""Serve profiles (issue 46): each planned cell judged once per precision profile.

A profile (matrix.yaml `profiles`) is a checkpoint and launch flags per engine; the same image
serves every profile, so a profile is a verdict on a cell, not an axis of new cells. What a
profile needs from the kernels (`needs`: fp8-gemm, fp8-kv) is judged against the engine
release's path, recorded with its sources in data/profiles.yaml: the FP8 GEMM the engine picks
on the arch (an object's kernel whose cubins are read from the wheel, or a kernel JIT-compiled
from a source file in the wheel with the image's nvcc) and the attention backend it switches to
for an FP8 KV cache.

Pure: the wheel reading is the caller's (stages/plan.py profile_plans), handed in as
`GemmRead`; this module only decides, so the verdicts can be tested on recorded wheel facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping


from . import engines
from ..datafiles import DATA_DIR, read_data
from .cell import Cell, Verdict
from .coverage import Coverage, decide
from .kernelsyms import KernelCode
from .rules import _cuda_tuple, backend_runs_on, in_range

PATHS_FILE = DATA_DIR / "profiles.yaml"
BASELINE = "bf16"
ProfileStatus = Literal["planned", "pruned", "unverified"]


def load_paths() -> dict[str, Any]:
    return read_data(PATHS_FILE)


@dataclass(frozen=True)
class ProfileSpec:
    """One matrix.yaml profile."""

    key: str
    checkpoint: str
    needs: tuple[str, ...] = ()
    launch: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    description: str = ""

    def args_for(self, engine: str) -> list[str]:
        """The profile's flags for an engine key, else for the engine whose flags it takes
        (data/engines.yaml flags_of: `vllm-cpu` takes `vllm`'s)."""
        like = engines.row(engine).get("flags_of")
        return list(self.launch.get(engine, self.launch.get(like, ()) if like else ()))


def profile_specs(matrix_data: Mapping[str, Any]) -> list[ProfileSpec]:
    """The matrix's profiles in their order; a matrix without the block has the baseline only
    (its model, no flags), so older matrix files plan as before."""
    table = matrix_data.get("profiles") or {
        BASELINE: {"checkpoint": matrix_data.get("model", {}).get("name", ""), "needs": []}}
    return [ProfileSpec(key, str(row["checkpoint"]), tuple(row.get("needs") or ()),
                        {e: tuple(f) for e, f in (row.get("launch") or {}).items()},
                        str(row.get("description", ""))) for key, row in table.items()]


def path_entry(engine: str, version: str, data: Mapping[str, Any] | None = None
               ) -> dict[str, Any] | None:
    """The data/profiles.yaml entry covering an engine release, or None."""
    for entry in (data or load_paths())["engines"].get(engine, []):
        if in_range(entry, version):
            return entry
    return None


def _read_releases(engine: str, data: Mapping[str, Any] | None = None) -> str:
    entries = (data or load_paths())["engines"].get(engine, [])
    return "; ".join(e["read"] for e in entries) or "none"


def _verdict(name: str, source: str, data: Mapping[str, Any] | None = None,
             **fields: Any) -> Verdict:
    """Rule `name`'s verdict, its data/profiles.yaml reason filled with `fields`."""
    text = (data or load_paths())["rules"][name]["reason"].format(**fields)
    return Verdict(name, " ".join(text.split()), source)


# --- what the caller read from the wheels -----------------------------------------------------

@dataclass(frozen=True)
class GemmRead:
    """What the planner read of the FP8 GEMM's wheel: the kernel's code in its object (kind
    `object`; None: the wheel has no such member) or whether the JIT source is in the wheel
    (kind `jit`). `error`: why nothing could be read (offline, index unreachable)."""

    url: str = ""
    kernel: KernelCode | None = None
    present: bool | None = None
    error: str | None = None


# --- the verdicts -----------------------------------------------------------------------------

@dataclass(frozen=True)
class NeedVerdict:
    """One need's path on the cell: what runs it and how it covers the arch."""

    need: str
    path: dict[str, Any]
    pruned: tuple[Verdict, ...] = ()
    unverified: tuple[Verdict, ...] = ()
    notes: tuple[str, ...] = ()


def _pruned(need: str, path: dict[str, Any], rule: str, source: str,
            data: Mapping[str, Any] | None, **fields: Any) -> NeedVerdict:
    """`need` pruned by `rule` (its reason filled with `fields`)."""
    return NeedVerdict(need, path, (_verdict(rule, source, data, **fields),))


def judge_fp8_gemm(cell: Cell, gemm: Mapping[str, Any], read: GemmRead,
                   data: Mapping[str, Any] | None = None) -> NeedVerdict:
    """The FP8 GEMM path: selected only on its archs; an object's kernel must carry code that
    runs on the arch (coverage.decide on the kernel's own cubins/PTX); a JIT one needs its
    source in the wheel and an nvcc of at least `min_cuda` (the cell's CUDA)."""
    package, version = gemm["package"], cell.engine_version
    path = {"kind": gemm["kind"], "package": package, "member": gemm["member"],
            "selected": gemm["selected"], "source": " ".join(str(gemm["source"]).split())}
    if gemm.get("kernel"):
        path["kernel"] = gemm["kernel"]
    fields = dict(engine=cell.engine, version=version, package=package, member=gemm["member"],
                  selected=gemm["selected"], arch=cell.arch, kernel=gemm.get("kernel", ""))
    where = read.url or package
    if cell.arch.rstrip("af") not in gemm.get("archs", [cell.arch]):
        return _pruned("fp8-gemm", path, "profile-fp8-gemm-arch", path["source"], data,
                       archs=", ".join(gemm["archs"]), **fields)
    if gemm["kind"] == "jit" and cell.cuda != "cpu" and \
            _cuda_tuple(cell.cuda) < _cuda_tuple(str(gemm["min_cuda"])):
        return _pruned("fp8-gemm", path, "profile-jit-cuda", path["source"], data,
                       min_cuda=gemm["min_cuda"], cuda=cell.cuda, **fields)
    if read.error is not None:
        return NeedVerdict("fp8-gemm", path, (), (Verdict(
            "profile-unread", f"{package} {version}: {gemm['member']} not read: {read.error}",
            where),))
    if gemm["kind"] == "jit":
        if not read.present:
            return _pruned("fp8-gemm", path, "profile-jit-source", where, data, **fields)
        compiler = gemm.get("compiler") or f"the image's nvcc {cell.cuda}"
        path.update(coverage="jit", by=f"{compiler} at first use")
        return NeedVerdict("fp8-gemm", path, notes=(
            f"FP8 GEMM {gemm['selected']} JIT-compiles at first use with {compiler} for "
            f"{cell.arch} (its source {gemm['member']} is in the wheel)",))
    if read.kernel is None:
        return _pruned("fp8-gemm", path, "profile-fp8-gemm-missing", where, data, **fields)
    decision = decide(read.kernel.code, cell.arch)
    path.update(coverage=decision.coverage.value, by=decision.as_dict()["by"],
                kernels=read.kernel.kernels, cubins=[a.sm for a in read.kernel.code.cubins],
                ptx=[a.compute for a in read.kernel.code.ptx])
    if decision.coverage is Coverage.UNCOVERED and \
            decide(read.kernel.unreadable_code, cell.arch).covered:
        return NeedVerdict("fp8-gemm", path, (), (Verdict(
            "profile-unread", f"{package} {version}: {gemm['member']} has no readable "
            f"{gemm.get('kernel')} code for {cell.arch}, but {read.kernel.unreadable} entries "
            "that could run there could not be read", where),))
    if decision.coverage is Coverage.UNCOVERED:
        have = ", ".join(path["cubins"] + path["ptx"]) or "no architecture (no such kernel)"
        return _pruned("fp8-gemm", path, "profile-fp8-gemm-code", where, data, have=have,
                       **fields)
    notes = (decision.note,) if decision.coverage is Coverage.PTX_JIT else ()
    return NeedVerdict("fp8-gemm", path, notes=notes)


def judge_fp8_kv(cell: Cell, kv: Mapping[str, Any], pins: Mapping[str, str],
                 env: Mapping[str, str], data: Mapping[str, Any] | None = None) -> NeedVerdict:
    """The FP8 KV cache's attention backend: its kernels must run on the arch, its package be
    pinned by the engine; modules not compiled ahead of time are said (JIT at first use)."""
    backend = kv["backend"]
    path = {"backend": backend, "instead_of": kv.get("instead_of"), "package": kv.get("package"),
            "modules": kv.get("modules"), "source": " ".join(str(kv["source"]).split())}
    fields = dict(engine=cell.engine, version=cell.engine_version, backend=backend,
                  arch=cell.arch, package=kv.get("package"))
    if not backend_runs_on(backend, cell.arch, cell):
        return _pruned("fp8-kv", path, "profile-kv-backend-arch", path["source"], data, **fields)
    package = kv.get("package")
    if package and package not in pins:
        return _pruned("fp8-kv", path, "profile-kv-backend-package", path["source"], data,
                       **fields)
    notes = []
    if kv.get("modules") == "jit":
        arch_list = env.get("FLASHINFER_CUDA_ARCH_LIST")
        notes.append(f"FP8-KV {backend} modules are not compiled ahead of time: they JIT-compile "
                     f"at first use with the image's nvcc {cell.cuda}"
                     + (f" for FLASHINFER_CUDA_ARCH_LIST={arch_list}" if arch_list else ""))
    if kv.get("instead_of") and kv["instead_of"] != backend:
        notes.append(f"an FP8 KV cache moves the full-attention layers from {kv['instead_of']} "
                     f"to {backend}")
    return NeedVerdict("fp8-kv", path, notes=tuple(notes))


@dataclass
class ProfilePlan:
    """One profile's verdict on one cell."""

    profile: str
    status: ProfileStatus
    checkpoint: str
    engine_args: list[str]
    attention_backend: str | None = None  # the full-attention backend this profile runs
    fp8_gemm: dict[str, Any] | None = None
    fp8_kv: dict[str, Any] | None = None
    reasons: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    capacity: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "status": self.status, "checkpoint": self.checkpoint,
                "engine_args": list(self.engine_args),
                "attention_backend": self.attention_backend, "fp8_gemm": self.fp8_gemm,
                "fp8_kv": self.fp8_kv, "reasons": [v.as_dict() for v in self.reasons],
                "notes": list(self.notes), "capacity": self.capacity}


def judge_profile(cell: Cell, spec: ProfileSpec, entry: Mapping[str, Any] | None,
                  gemm_read: GemmRead | None, pins: Mapping[str, str], env: Mapping[str, str],
                  cell_backend: str | None, data: Mapping[str, Any] | None = None
                  ) -> ProfilePlan:
    """A profile's verdict: pruned when a need's path cannot run, unverified when it was not
    read (no data/profiles.yaml entry for the release, or the wheel not reachable), else
    planned. `cell_backend`: the backend the cell's plan names (None: the engine's default)."""
    plan = ProfilePlan(spec.key, "planned", spec.checkpoint, spec.args_for(cell.engine),
                       cell_backend)
    unverified: list[Verdict] = []
    for need in spec.needs:
        if entry is None or need not in entry:
            unverified.append(_verdict(
                "profile-path-unread", "src/infermatrix/data/profiles.yaml", data, need=need,
                engine=cell.engine, version=cell.engine_version,
                read=_read_releases(cell.engine, data)))
            continue
        if need == "fp8-gemm":
            verdict = judge_fp8_gemm(cell, entry[need], gemm_read or GemmRead(
                error="not read"), data)
            plan.fp8_gemm = verdict.path
        else:
            verdict = judge_fp8_kv(cell, entry[need], pins, env, data)
            plan.fp8_kv = verdict.path
            plan.attention_backend = verdict.path["backend"]
        plan.reasons += verdict.pruned
        unverified += verdict.unverified
        plan.notes += verdict.notes
    if plan.reasons:
        plan.status = "pruned"
    elif unverified:
        plan.status, plan.reasons = "unverified", unverified
    return plan
