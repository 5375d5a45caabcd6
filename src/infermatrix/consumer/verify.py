"""`infermatrix verify`: the consumer's own check of a pulled image, on their host (issue 30).

From images.lock alone (no matrix): the image is the entry's digest reference, pulled before
(`infermatrix pull`), and its id must be the one images.lock records. Then:
  gpu    harness.gpu_check in a container with the host's GPUs: the device is the cell's arch,
         torch, Triton and the engine's Gated DeltaNet ops compute right (skip without a GPU,
         n/a for a CPU cell);
  model  the serve command images.lock recorded, on the weights of `--model-dir` (with the
         MTP flags when the head is there), probed with thinking on and off, the answer
         checked against `--expect` unless `--no-answer-check` (random fixture weights);
  workload  (asked for) the job's shape against one server of the signed serve command
         (stages/workload.py: sweep, soak, needle, backends used), its figure held to the
         one the cell was published with (a regression on this host is flagged).
The verdict (the host's facts: name, GPUs, driver; each level) is written as JSON for that host.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any

from ..engine.docker import Engine
from ..errors import MissingPrerequisite, UsageError
from ..harness import probe as harness_probe
from ..model.spec import CONTAINER_MODEL
from ..model.unifiedmem import GIB, Sizing, size_from_meminfo, with_fraction
from ..stages import smoke
from .pull import serve_command
from ..stages.smoke import CONTAINER_PORT, NO_GPU, Harness, LaunchSpec, LevelResult

VERIFY_LEVELS = ("gpu", "model")  # the default
ALL_VERIFY_LEVELS = ("gpu", "model", "workload")
DEFAULT_TIMEOUTS = {"gpu": 600.0, "model": 1800.0, "workload": 3600.0}
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


def verify_gpu(entry: dict[str, Any], harness: Harness, gpu_here: bool,
               timeout_s: float) -> LevelResult:
    if not entry["run"].get("gpu"):
        return LevelResult("gpu", "skip", "a CPU cell: the gpu level does not apply",
                           details={"applicable": False})
    if not gpu_here:
        return LevelResult("gpu", "skip", NO_GPU, details={"needs_gpu": True})
    if harness.emulated:
        return smoke.emulated_skip("gpu", harness.emulated, VERIFY_ELSEWHERE)
    engine_name = (entry.get("labels") or {}).get("io.infermatrix.engine", "none")
    engine_name = engine_name if engine_name in ("vllm", "sglang") else "none"
    code, parsed, output = harness.run("gpu_check", ["--arch", entry["arch"], "--engine",
                                                     engine_name], timeout_s, gpu=True)
    status, reason, details = smoke.harness_level("gpu", code, parsed, output, timeout_s)
    return LevelResult("gpu", status, reason, details=details)


def unified_sizing(entry: dict[str, Any], meminfo: Path) -> Sizing | None:
    """The engine's share of a unified-memory GPU host (an sm_121 cell: DGX Spark / GB10),
    sized from MemAvailable now, as deploy sizes it; None for other cells. Below the floor:
    UnifiedMemoryShort (exit 1), before anything starts."""
    if not entry["run"].get("gpu"):
        return None
    return size_from_meminfo(meminfo, entry["arch"], entry["labels"]["io.infermatrix.engine"])


def verify_model(entry: dict[str, Any], harness: Harness, model_dir: Path, gpu_here: bool,
                 settings: harness_probe.ProbeSettings,
                 unified: Sizing | None = None) -> LevelResult:
    run = entry["run"]
    if run.get("gpu") and not gpu_here:
        return LevelResult("model", "skip", NO_GPU, details={"needs_gpu": True})
    if harness.emulated:
        return smoke.emulated_skip("model", harness.emulated, VERIFY_ELSEWHERE)
    command = serve_command(entry, CONTAINER_PORT, model_dir)
    spec = LaunchSpec(command, dict(run.get("env") or {}), run.get("shm_size") or "1g",
                      settings.health_path, bool(run.get("gpu")))
    if unified is not None:  # the engine's share of the host's memory, not a GPU's
        spec.command = with_fraction(spec.command, unified)
        spec.shm_size, spec.mem_limit = unified.shm_size, f"{unified.budget // GIB}g"
    details: dict[str, Any] = {"model_source": str(model_dir), "command": spec.command,
                               "answer_checked": settings.real_model}
    return smoke.serve_image_and_probe(harness, spec, model_dir, settings, details,
                                       entry["cell"])


def verify_workload(entry: dict[str, Any], harness: Harness, model_dir: Path, gpu_here: bool,
                    real_model: bool, unified: Sizing | None = None,
                    soak_s: float | None = None) -> LevelResult:
    """The workload level on this host: the signed serve command on `model_dir`, one server
    on loopback, driven by stages/workload.py; its figure against the published one."""
    from ..stages import workload
    from ..engine import docker as engine

    run = entry["run"]
    if run.get("gpu") and not gpu_here:
        return LevelResult("workload", "skip", NO_GPU, details={"needs_gpu": True})
    if harness.emulated:
        return smoke.emulated_skip("workload", harness.emulated, VERIFY_ELSEWHERE)
    if not harness.docker.is_local():
        return LevelResult("workload", "skip", "not verified here: the load runs on this "
                           "machine and the server's port stays on the engine's host",
                           details={"not_verified": True})
    command = serve_command(entry, CONTAINER_PORT, model_dir)
    if unified is not None:
        command = with_fraction(command, unified)
    settings = workload.WorkloadSettings.from_matrix(
        {"soak_s": soak_s, "cpu": {"soak_s": soak_s}} if soak_s else None,
        cpu=not run.get("gpu"), model_dir=model_dir, real_model=real_model)
    details: dict[str, Any] = {"model_source": str(model_dir), "command": command}
    with smoke.container(harness.docker, harness.image_id, command=command,
                         env=dict(run.get("env") or {}), shm_size=run.get("shm_size") or "1g",
                         mounts=[engine.Mount(str(model_dir), CONTAINER_MODEL, read_only=True)],
                         ports={f"{CONTAINER_PORT}/tcp": ("127.0.0.1", None)},
                         gpus=harness.gpus if run.get("gpu") else False,
                         labels={smoke.SMOKE_LABEL: entry["cell"]}) as cid:
        host, port = smoke.published_port(harness.docker, cid)
        from ..job.generate import ServerEndpoint
        from ..job.throughput import wait_all_healthy

        endpoint = ServerEndpoint("server", f"http://{host}:{port}", run.get("health")
                                  or "/health")
        try:
            details["health_wait_s"] = wait_all_healthy(
                [endpoint], DEFAULT_TIMEOUTS["model"], alive=smoke.container_gone(
                    harness.docker, cid))
            details.update(workload.measure(endpoint, settings,
                                            alive=smoke.container_gone(harness.docker, cid)))
        finally:
            log = harness.docker.container_logs(cid)
    smoke.append_log(harness.log_path, f"workload server: {' '.join(command)}", log)
    backend = (entry.get("labels") or {}).get("io.infermatrix.attention_backend") or None
    details["backends"] = workload.judge_backends(log, backend)
    published = ((entry.get("smoke") or {}).get("workload") or {}).get("tokens_per_s_per_gpu")
    details["target"] = workload.target_verdict(
        details["tokens_per_s"], entry["arch"], settings,
        float(published) if isinstance(published, (int, float)) else None)
    status, reason = workload.verdict(details, settings.regression_fails)
    if status == "fail":
        details["engine_log_tail"] = smoke.last_lines(log, 40)
    return LevelResult("workload", status, reason, details=details)


def verify_entry(entry: dict[str, Any], model_dir: Path, log_path: Path,
                 levels: list[str] | None = None, expect: str | None = "Paris",
                 answer_check: bool = True, gpu_here: bool | None = None,
                 gpus: Any = True, unified: Sizing | None = None,
                 docker: Engine | None = None, soak_s: float | None = None) -> dict[str, Any]:
    """The verdict of this host for one images.lock entry (levels run in order, in `docker`,
    default DOCKER_HOST / the current context); `unified`: the engine's memory on a
    unified-memory GPU host (unified_sizing)."""
    docker = docker or Engine()
    image_id = image_of(entry, docker)
    gpu_here = smoke.host_has_gpu() if gpu_here is None else gpu_here
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"verify {entry['cell']} {entry['reference']}\n")
    harness = Harness.for_image(docker, image_id, log_path, gpus)
    settings = harness_probe.ProbeSettings(
        expect=expect if answer_check else None, real_model=answer_check,
        health_path=entry["run"].get("health") or "/health",
        health_timeout_s=DEFAULT_TIMEOUTS["model"])
    runners = {
        "gpu": lambda: verify_gpu(entry, harness, gpu_here, DEFAULT_TIMEOUTS["gpu"]),
        "model": lambda: verify_model(entry, harness, model_dir, gpu_here, settings, unified),
        "workload": lambda: verify_workload(entry, harness, model_dir, gpu_here, answer_check,
                                            unified, soak_s),
    }
    results = {name: smoke.timed_level(name, runners[name]) for name in levels or VERIFY_LEVELS}
    status = smoke.overall_status([r.status for r in results.values()])
    return {"cell": entry["cell"], "reference": entry["reference"], "image_id": image_id,
            "status": status, "host": host_facts(docker), "model_dir": str(model_dir),
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


