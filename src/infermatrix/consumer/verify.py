"""`infermatrix verify`: the consumer's own check of a pulled image, on their host (issue 30).

From images.lock alone (no matrix): the image is the entry's digest reference, pulled before
(`infermatrix pull`), and its id must be the one images.lock records. Then the levels the
level table gives verify (infermatrix/levels.py: `Level.verify` names each one's function here).
The verdict (the host's facts: name, GPUs, driver; each level) is written as JSON for that host.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.docker import Engine
from ..errors import MissingPrerequisite, UsageError
from ..harness import probe as harness_probe
from ..levels import BY_NAME, VERIFY_LEVELS
from ..model.spec import CONTAINER_MODEL
from ..model.unifiedmem import GIB, Sizing, size_from_meminfo, with_fraction
from ..stages import smoke
from .pull import serve_command
from ..stages.smoke import CONTAINER_PORT, NO_GPU, Harness, LaunchSpec, LevelResult

VERIFY_ELSEWHERE = "run `infermatrix verify` on a {platform} host"


def image_of(entry: dict[str, Any], docker: Engine) -> str:
    """The pulled image's id; a UsageError when it is not here or is not images.lock's."""
    found = docker.inspect_image(entry["reference"])
    if found is None:
        raise MissingPrerequisite(f"{entry['reference']} is not in engine {docker.label()}",
                                  fix=f"run `infermatrix pull {entry['cell']}` first")
    if entry.get("image_id") and found["Id"] != entry["image_id"]:
        raise UsageError(f"{entry['reference']} is image {found['Id']}, images.lock records "
                         f"{entry['image_id']}",
                         fix=f"pull it again: `infermatrix pull {entry['cell']}`")
    return found["Id"]


def host_facts(docker: Engine) -> dict[str, Any]:
    from ..host import doctor

    facts = doctor.gather()
    return {"hostname": platform.node(), "machine": platform.machine(),
            "gpus": [g.__dict__ for g in facts.gpus], "gpu_error": facts.gpu_error,
            "engine": docker.label()}


@dataclass(frozen=True)
class Request:
    """What `infermatrix verify` asks of this host for one entry; cli/verify.py builds it."""
    entry: dict[str, Any]  # the verified images.lock entry
    model_dir: Path
    log_path: Path
    levels: list[str] | None = None  # None: VERIFY_LEVELS
    expect: str | None = "Paris"  # None: the answers' structure only (--no-answer-check)
    unified: Sizing | None = None  # the engine's memory on a unified-memory GPU host
    soak_s: float | None = None  # the workload level's soak (None: its default)


@dataclass(frozen=True, kw_only=True)
class VerifyRun(Request):
    """What each level's function (levels.py: Level.verify names it) is given: the request
    and what verify_entry set up for it on this host."""
    harness: Harness
    gpu_here: bool
    settings: harness_probe.ProbeSettings  # real_model: the answer is checked


def refusal(v: VerifyRun, level: str) -> LevelResult | None:
    """A level's skip when a GPU cell meets no GPU here, or the image's programs would run
    emulated; None when it can run."""
    if v.entry["run"].get("gpu") and not v.gpu_here:
        return LevelResult(level, "skip", NO_GPU, details={"needs_gpu": True})
    if v.harness.emulated:
        return smoke.emulated_skip(level, v.harness.emulated, VERIFY_ELSEWHERE)
    return None


def verify_gpu(v: VerifyRun) -> LevelResult:  # the device, torch, Triton and the GDN ops
    return smoke.gpu_level(v.harness, v.entry["arch"], (v.entry.get("labels") or {}).get(
        "io.infermatrix.engine", ""), [], BY_NAME["gpu"].timeout_s, v.gpu_here, VERIFY_ELSEWHERE)


def unified_sizing(entry: dict[str, Any], meminfo: Path) -> Sizing | None:
    """The engine's share of a unified-memory GPU host (an sm_121 cell: DGX Spark / GB10),
    sized from MemAvailable now, as deploy sizes it; None for other cells. Below the floor:
    UnifiedMemoryShort (exit 1), before anything starts."""
    if not entry["run"].get("gpu"):
        return None
    return size_from_meminfo(meminfo, entry["arch"], entry["labels"]["io.infermatrix.engine"])


def entry_launch(v: VerifyRun) -> LaunchSpec:
    """The serve command images.lock recorded, on `model_dir`; on a unified-memory GPU host
    with the engine's share of the host's memory (unified_sizing), not a GPU's."""
    run = v.entry["run"]
    launch = LaunchSpec(serve_command(v.entry, CONTAINER_PORT, v.model_dir),
                        dict(run.get("env") or {}), run.get("shm_size") or "1g",
                        v.settings.health_path, bool(run.get("gpu")))
    if v.unified is not None:
        launch.command = with_fraction(launch.command, v.unified)
        launch.shm_size, launch.mem_limit = v.unified.shm_size, f"{v.unified.budget // GIB}g"
    return launch


def verify_model(v: VerifyRun) -> LevelResult:
    """The serve command images.lock recorded, on the weights of `--model-dir` (with the MTP
    flags when the head is there), probed with thinking on and off, the answer checked against
    `--expect` unless `--no-answer-check` (random fixture weights)."""
    refused = refusal(v, "model")
    if refused:
        return refused
    launch = entry_launch(v)
    details: dict[str, Any] = {"model_source": str(v.model_dir), "command": launch.command,
                               "answer_checked": v.settings.real_model}
    return smoke.serve_image_and_probe(
        smoke.Server(v.harness, launch, v.model_dir, v.entry["cell"], details), v.settings)


def verify_workload(v: VerifyRun) -> LevelResult:
    """The job's shape against one server of the signed serve command on `model_dir`
    (stages/workload.py: sweep, soak, needle, backends used), its figure held to the one the
    cell was published with (a regression on this host is flagged)."""
    from ..stages import workload

    refused = refusal(v, "workload")
    if refused:
        return refused
    if not v.harness.docker.is_local():
        return LevelResult("workload", "skip", "not verified here: the load runs on this "
                           "machine and the server's port stays on the engine's host",
                           details={"not_verified": True})
    entry, launch = v.entry, entry_launch(v)
    settings = workload.WorkloadSettings.from_matrix(
        {"soak_s": v.soak_s, "cpu": {"soak_s": v.soak_s}} if v.soak_s else None,
        cpu=not launch.gpu, model_dir=v.model_dir, real_model=v.settings.real_model)
    details: dict[str, Any] = {"model_source": str(v.model_dir), "command": launch.command}
    backend = (entry.get("labels") or {}).get("io.infermatrix.attention_backend") or None
    server = smoke.Server(v.harness, launch, v.model_dir, entry["cell"], details)
    return smoke.workload_level(server, settings, BY_NAME["model"].timeout_s, entry["arch"],
                                (backend, None), smoke.published_figure(entry))


def verify_entry(ask: Request, docker: Engine, gpu_here: bool | None = None) -> dict[str, Any]:
    """The verdict of this host for one images.lock entry (levels run in order, in `docker`;
    `gpu_here` None: smoke.host_has_gpu)."""
    entry, unified = ask.entry, ask.unified
    image_id = image_of(entry, docker)
    ask.log_path.parent.mkdir(parents=True, exist_ok=True)
    ask.log_path.write_text(f"verify {entry['cell']} {entry['reference']}\n")
    harness = Harness.for_image(docker, image_id, ask.log_path)
    settings = harness_probe.ProbeSettings(
        expect=ask.expect, real_model=ask.expect is not None,
        health_path=entry["run"].get("health") or "/health",
        health_timeout_s=BY_NAME["model"].timeout_s)
    v = VerifyRun(**vars(ask), harness=harness, settings=settings,
                  gpu_here=smoke.host_has_gpu() if gpu_here is None else gpu_here)
    results = {name: smoke.timed_level(name, lambda: globals()[str(BY_NAME[name].verify)](v))
               for name in ask.levels or VERIFY_LEVELS}
    status = smoke.overall_status([r.status for r in results.values()])
    return {"cell": entry["cell"], "reference": entry["reference"], "image_id": image_id,
            "status": status, "host": host_facts(docker), "model_dir": str(ask.model_dir),
            "levels": {name: r.as_dict() for name, r in results.items()},
            "emulated": harness.emulated,
            "unified_memory": {"chosen": unified.describe(), **unified.as_dict()}
            if unified is not None else None,
            "verified_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "container_model_dir": CONTAINER_MODEL}


def write_verdict(verdict: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(verdict, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def default_verdict_path(cell: str) -> Path:
    return Path("verdicts") / f"{cell}-{platform.node() or 'host'}.json"


