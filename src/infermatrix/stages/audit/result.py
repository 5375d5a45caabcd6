"""An audit's result: its checks, the audited objects and their groups, the target archs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ...errors import UsageError
from ...journal import Status
from ...model.cell import Cell
from ...model.coverage import Arch, Coverage, Decision, DeviceCode
from ...model.loadedset import LoadVerdict
from .cache import FAIL, NOT_LOADED_GROUP, PASS


@dataclass
class Check:
    name: str  # kernels, cuda-major, torch-cuda, pins, pip-check, engine-floor
    status: Status  # pass, fail, skip
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, **self.data}


@dataclass
class AuditedObject:
    path: str  # relative to site-packages: torch/lib/libtorch_cuda.so
    package: str | None
    size: int
    code: DeviceCode
    decisions: list[Decision]
    waivers: dict[str, str] = field(default_factory=dict)  # target -> why it never loads there
    loads: dict[str, LoadVerdict] = field(default_factory=dict)  # target -> loaded-set verdict

    def fails(self, decision: Decision) -> bool:
        return not decision.covered and str(decision.target) not in self.waivers

    def group(self, decision: Decision) -> str:
        """covered | ptx-jit | not-loaded | uncovered, for one target."""
        if str(decision.target) in self.waivers:
            return NOT_LOADED_GROUP
        if not decision.covered:
            return "uncovered"
        return "ptx-jit" if decision.coverage is Coverage.PTX_JIT else "covered"

    @property
    def covered(self) -> bool:
        return not any(self.fails(d) for d in self.decisions)

    def verdict_text(self, decision: Decision, short: bool = False) -> str:
        by = decision.as_dict()["by"]
        text = decision.coverage.value + (f" ({by})" if by else "")
        waiver = self.waivers.get(str(decision.target))
        if waiver and not decision.covered:
            text += " (not loaded)" if short else f" (not loaded: {waiver})"
        return text

    def row(self) -> dict[str, Any]:
        """One flat row for the journal and the report."""
        row: dict[str, Any] = {"object": self.path, "package": self.package, "size": self.size,
                               "cubins": " ".join(a.sm for a in self.code.cubins),
                               "ptx": " ".join(a.compute for a in self.code.ptx)}
        for decision in self.decisions:
            row[str(decision.target)] = self.verdict_text(decision)
        row["covered"] = self.covered
        row["group"] = "; ".join(self.group_text(d) for d in self.decisions)
        return row

    def group_text(self, decision: Decision) -> str:
        """`not-loaded (vllm-fa3)`, `ptx-jit`, `covered` (target-prefixed with several)."""
        load = self.loads.get(str(decision.target))
        group = self.group(decision)
        text = group + (f" ({load.entry})" if load and load.entry and group == NOT_LOADED_GROUP
                        else "")
        return text if len(self.decisions) == 1 else f"{decision.target}: {text}"


@dataclass
class AuditResult:
    cell_id: str
    image: str
    targets: list[Arch]
    objects: list[AuditedObject] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)  # probe, device code, Triton

    @property
    def status(self) -> Status:
        return FAIL if any(c.status == FAIL for c in self.checks) else PASS

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def uncovered(self) -> list[str]:
        """`object (target)` for every object a target cannot run."""
        return [f"{o.path} ({', '.join(str(d.target) for d in o.decisions if o.fails(d))})"
                for o in self.objects if not o.covered]

    def groups(self) -> dict[str, dict[str, Any]]:
        """Per target: the covered count, the PTX-JIT objects, the objects data says are not
        loaded (with entry, reason and source) and the uncovered ones."""
        return {str(t): object_groups(self.objects, t) for t in self.targets}

    @property
    def reason(self) -> str | None:
        failed = [f"{c.name}: {c.detail}" for c in self.checks if c.status == FAIL]
        return "; ".join(failed) if failed else None

    def as_dict(self) -> dict[str, Any]:
        return {"cell": self.cell_id, "image": self.image, "status": self.status,
                "targets": [str(t) for t in self.targets],
                "checks": [c.as_dict() for c in self.checks],
                "coverage": [o.row() for o in self.objects],
                "groups": self.groups(),
                "uncovered": self.uncovered, "versions": self.versions,
                "duration_s": round(self.duration_s, 3),
                "phase_s": {k: round(v, 1) for k, v in self.phase_s.items()}}


def object_groups(objects: list[AuditedObject], target: Arch) -> dict[str, Any]:
    groups: dict[str, Any] = {"covered": [], "ptx-jit": [], NOT_LOADED_GROUP: [], "uncovered": []}
    for obj in objects:
        decision = next((d for d in obj.decisions if d.target == target), None)
        if decision is None:
            continue
        group = obj.group(decision)
        if group == NOT_LOADED_GROUP:
            load = obj.loads.get(str(target))
            groups[group].append({"object": obj.path, "coverage": decision.coverage.value,
                                  "entry": load.entry if load else None,
                                  "key": (load.key if load else "") or "waived",
                                  "reason": obj.waivers[str(target)],
                                  "source": load.source if load else ""})
        elif group == "ptx-jit":
            groups[group].append({"object": obj.path, "ptx": decision.by.compute
                                  if decision.by else None, "jit_cost": decision.note})
        elif group == "uncovered":
            groups[group].append({"object": obj.path, "package": obj.package,
                                  "note": decision.note, "key": uncovered_key(obj.code, target)})
        else:
            groups[group].append(obj.path)
    groups["counts"] = {"covered": len(groups["covered"]), "ptx-jit": len(groups["ptx-jit"]),
                        NOT_LOADED_GROUP: len(groups[NOT_LOADED_GROUP]),
                        "uncovered": len(groups["uncovered"])}
    return groups


def uncovered_key(code: DeviceCode, target: Arch) -> str:
    """Short key of why an object cannot run on `target`: `no-gpu-code`, `sm_120a-only`,
    `built-for-sm_80-sm_90`, or `ptx-compute_100-too-new`."""
    if not code.cubins and not code.ptx:
        return "no-gpu-code"
    if code.cubins and all(a.sm.endswith("a") for a in code.cubins) and not code.ptx:
        return f"{'-'.join(a.sm for a in code.cubins)}-only"
    if code.ptx and not code.cubins:
        return f"ptx-{'-'.join(a.compute for a in code.ptx)}-not-for-{target.sm}"
    return f"built-for-{'-'.join(dict.fromkeys(a.sm for a in code.cubins))}"


def parse_targets(values: Iterable[str] | None) -> list[Arch] | None:
    if not values:
        return None
    try:
        return [Arch.parse(v).device for v in values]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def default_targets(cell: Cell) -> list[Arch]:
    return [Arch.parse(cell.arch).device] if cell.is_gpu else []
