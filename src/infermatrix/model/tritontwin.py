"""The native twin of a cell built for another CPU (issue 27): whose Triton check stands for it.

Triton cannot start under qemu-user, so the Triton compile check of a linux/arm64 cell (the GB10
one) cannot run in its own image on an x86_64 build machine. Its Triton kernels are Python
source compiled by Triton for a target arch; the CPU the compiler runs on does not enter the
result. So the check runs in the image of a *twin*: a cell of the same matrix with the same
CUDA, torch, engine and engine version, built for the build machine's CPU. The twin's harness
compiles for the foreign cell's arch as well (`twin_archs_for`), and the foreign cell adopts
that part of the result (`adopt`) only when the Python sources that decide the kernels are
proven the same in both images: the sha256 of every `.py` file (from each distribution's
RECORD, hashed in the image) of the engine package, triton, torch and flashinfer-python, and the
same distribution versions and Python version.

Pure: the caller reads the images and the journal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .cell import CellPlan

# The distributions whose Python sources decide which Triton kernels the serve path builds,
# with which tiles: the engine's launchers and kernels, Triton's front end, torch (the tensors'
# strides and dtypes), FlashInfer (the GDN prefill choice). Those present must all agree.
DIGEST_DISTRIBUTIONS = ("triton", "torch", "flashinfer-python")


def digest_distributions(engine_package: str | None) -> list[str]:
    return ([engine_package] if engine_package else []) + list(DIGEST_DISTRIBUTIONS)


def twin_prefix(cell_id: str) -> str:
    """The cell id without its arch part: cells that differ only in arch share it."""
    return cell_id.rsplit("-", 1)[0]


def twin_archs_for(plan: CellPlan, plans: Iterable[CellPlan], host_platform: str) -> list[str]:
    """Archs of the cells this (native) cell is the twin of: planned cells of the same CUDA,
    torch, engine and version whose platform is not the build machine's."""
    mine = plan.settings.platform if plan.settings else host_platform
    if mine != host_platform or not plan.cell.is_gpu:
        return []
    found = []
    for other in plans:
        if (other.planned and other.settings and other.id != plan.id
                and twin_prefix(other.id) == twin_prefix(plan.id)
                and other.settings.platform != host_platform
                and other.cell.arch != plan.cell.arch):
            found.append(other.cell.arch)
    return sorted(set(found))


def natives_first(plans: list[CellPlan], host_platform: str) -> list[CellPlan]:
    """The audit order: cells for the build machine's CPU first, so that a twin's result is
    in the journal before the foreign cell that adopts it is audited."""
    return sorted(plans, key=lambda p: (p.settings.platform if p.settings else host_platform)
                  != host_platform)


def restrict_to_archs(result: Mapping[str, Any], archs: Iterable[str]) -> dict[str, Any]:
    """The harness result for `archs` only, its status and reason recomputed as the harness
    computes them over its archs."""
    wanted = set(archs)
    kept = [a for a in result.get("archs", []) if a.get("arch") in wanted]
    statuses = {a.get("status") for a in kept}
    status = "fail" if "fail" in statuses else "skip" if "skip" in statuses or not kept \
        else "pass"
    reasons = [f"{a['arch']}: {a['reason']}" for a in kept if a.get("reason")]
    return {**result, "archs": kept, "status": status,
            "reason": "; ".join(reasons) or (None if kept else
                                             f"the twin compiled none of {sorted(wanted)}")}


@dataclass
class TwinMatch:
    cell_id: str
    image: str | None
    result: dict[str, Any]  # the harness result, for the wanted archs only
    digests: dict[str, dict[str, Any]]


def digest_mismatch(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> str | None:
    """Why two images' source digests do not prove the same kernels, or None."""
    if not mine:
        return "this image's Python sources were not hashed"
    for name in sorted(set(mine) | set(theirs)):
        a, b = mine.get(name), theirs.get(name)
        if a is None or b is None:
            return f"{name} is in {'the twin' if a is None else 'this image'} only"
        if a.get("version") != b.get("version"):
            return f"{name} {a.get('version')} here, {b.get('version')} in the twin"
        if a.get("sha256") != b.get("sha256"):
            return f"{name} {a.get('version')}: its .py files differ ({a.get('files')} here, " \
                   f"{b.get('files')} files in the twin)"
    return None


def adopt(cell_id: str, python: str, digests: Mapping[str, Any], archs: list[str],
          audits: Mapping[str, Mapping[str, Any]]) -> tuple[TwinMatch | None, list[str]]:
    """The twin whose recorded Triton check covers `archs` with identical sources, and why each
    candidate was passed over. `audits`: cell id -> its journal's audit details."""
    why: list[str] = []
    for other_id, audit in sorted(audits.items()):
        if other_id == cell_id or twin_prefix(other_id) != twin_prefix(cell_id):
            continue
        check = next((c for c in audit.get("checks", []) if c.get("name") == "triton-smem"),
                     None) or {}
        harness = check.get("harness")
        if not harness:
            why.append(f"{other_id}: its audit has no Triton result")
            continue
        compiled = {a.get("arch") for a in harness.get("archs", [])}
        if not set(archs) <= compiled:
            why.append(f"{other_id}: its Triton check compiled for {', '.join(sorted(compiled))}"
                       f", not {', '.join(archs)} (audit it again: the main job adds a twin's "
                       "archs)")
            continue
        theirs = check.get("py_digests") or {}
        if check.get("python") != python:
            why.append(f"{other_id}: Python {check.get('python')} there, {python} here")
            continue
        mismatch = digest_mismatch(digests, theirs)
        if mismatch:
            why.append(f"{other_id}: {mismatch}")
            continue
        return TwinMatch(other_id, audit.get("image"), restrict_to_archs(harness, archs),
                         dict(theirs)), why
    return None, why
