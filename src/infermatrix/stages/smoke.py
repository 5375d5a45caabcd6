"""`infermatrix smoke`: tiered tests of a built image, in containers of that exact image.

The levels are the rows of the level table (infermatrix/levels.py), each run by its runner
here (run_<level>: its docstring says what it checks) with a timeout (matrix `smoke.timeouts`)
and a result pass / fail / skip + reason. Every container is stopped and removed (finally,
SIGINT and SIGTERM included); a failed serving level keeps the engine's log tail.
An image whose programs run under QEMU on the engine (Engine.emulation_of: the GB10 cell's
linux/arm64 image on an x86_64 host) runs none of them: `import torch` crashes there, so the
static level keeps only the audit (its probe runs natively) and every program-running part is
"not verified", naming an engine of the image's platform (`--smoke-on`, smoke.on).
The probe runs here, on the host, against the published port (127.0.0.1, a free port Docker
picks): that is how clients reach the server, the timeouts and the interrupt handling stay in
this process, and no exec session is left behind when the container is stopped.
Results go to the journal (stage `smoke`) with the image id that was tested; `tag` reads them.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine import docker as engine
from ..engine.docker import Engine
from .. import journal
from ..context import Context
from ..errors import (ImageGone, InfermatrixError, Interrupted, MissingPrerequisite, StageFailure,
                      UnknownChoice, UsageError)
from ..harness import _result as harness_result
from ..harness import probe as harness_probe
from .. import levels as level_table
from ..model.cell import CPU
from ..model.engines import harness_name
from ..model.spec import CONTAINER_MODEL, DEFAULT_PORT
from ..model.spec import CellSpec
from ..options import RunOptions
from ..watch import Heartbeat
from .steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401

if TYPE_CHECKING:
    from ..model.gpuaccess import GpuSetting
    from ..job.generate import ServerEndpoint
    from .workload import WorkloadSettings

log = logging.getLogger(__name__)

HARNESS_IN_IMAGE = "/opt/infermatrix/harness"
HARNESS_ON_HOST = Path(harness_result.__file__).resolve().parent
CONTAINER_PORT = DEFAULT_PORT
NO_GPU = "no GPU on this host"
SMOKE_LABEL = "io.infermatrix.smoke"
HARNESS_ENV = {"PYTHONPATH": str(Path(HARNESS_IN_IMAGE).parent), "PYTHONUNBUFFERED": "1"}
LOG_TAIL_LINES = 80
FIXTURE_VARIANTS = ("normal", "broken", "trained")


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------

@dataclass
class LevelResult:
    level: str
    status: str  # pass | fail | skip
    reason: str | None = None
    duration_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason,
                "duration_s": round(self.duration_s, 3), **self.details}


@dataclass
class SmokeResult:
    """A cell's levels (`lines()`: how a person reads them: status, seconds, tokens/s, the
    engine log's tail of a failed level)."""

    cell_id: str
    image_id: str
    levels: dict[str, LevelResult] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return overall_status([lv.status for lv in self.levels.values()])

    @property
    def reason(self) -> str | None:
        failed = [f"{n}: {lv.reason}" for n, lv in self.levels.items() if lv.status == "fail"]
        if failed:
            return "; ".join(failed)
        skipped = [f"{n}: {lv.reason}" for n, lv in self.levels.items() if lv.status == "skip"]
        return "; ".join(skipped) if skipped and self.status == "skip" else None

    def lines(self) -> list[str]:
        shown = [f"{self.cell_id}: {self.status}  (image {self.image_id[:19]})"]
        for name, level in self.levels.items():
            line = f"  {name:<7}{level.status:<5} {level.duration_s:7.1f} s"
            rate = level.details.get("tokens_per_s") if name == "model" else None
            if rate:
                line += (f"  tokens/s single {rate.get('single')} concurrent "
                         f"{rate.get('concurrent')}")
            if level.reason:
                line += f"  {level.reason}"
            shown.append(line)
            tail = level.details.get("engine_log_tail")
            if level.status == "fail" and tail:
                shown.append("    engine log tail:\n"
                             + "\n".join("    | " + t for t in tail.splitlines()))
        return shown


def overall_status(statuses: list[str]) -> journal.Status:
    """fail if any level failed; pass if any passed (skips allowed); skip otherwise."""
    if "fail" in statuses:
        return journal.Status.FAIL
    return journal.Status.PASS if "pass" in statuses else journal.Status.SKIP


# --------------------------------------------------------------------------------------------
# Settings from the matrix (pure)
# --------------------------------------------------------------------------------------------

def smoke_settings(ctx: Context) -> dict[str, Any]:
    return ctx.matrix.smoke or {}


def levels_to_run(ctx: Context, requested: list[str] | None) -> list[str]:
    levels = requested or smoke_settings(ctx).get("levels") or level_table.DEFAULT_LEVELS
    try:  # always in the table's order
        return level_table.parse(",".join(levels))
    except ValueError as exc:
        raise UnknownChoice(str(exc)) from None


def gpu_setting(ctx: Context) -> "GpuSetting":
    """smoke.gpu_access: how GPU containers are given their GPUs (auto when not set)."""
    from ..model.gpuaccess import GpuSetting

    declared = smoke_settings(ctx).get("gpu_access") or {}
    return GpuSetting(mode=declared.get("mode", "auto"),
                      pid_host=bool(declared.get("pid_host", False)))


def level_timeout(ctx: Context, level: str) -> float:
    return float(smoke_settings(ctx).get("timeouts", {}).get(
        level, level_table.BY_NAME[level].timeout_s))


def kernel_distributions(ctx: Context, spec: CellSpec) -> list[str]:
    """`package==version` of the compiled kernel packages of the cell's serving image (no pin
    for match-engine); the training-only ones are in its train image alone (issue 47)."""
    return [k.requirement if k.pinned else k.package for k in spec.serve_kernels]


@dataclass
class LaunchSpec:
    """How the engine server is started for the model level."""

    command: list[str]
    env: dict[str, str]
    shm_size: str
    health: str
    gpu: bool
    mem_limit: str | None = None  # the container's memory limit (a unified-memory GPU's share)


def launch_spec(ctx: Context, spec: CellSpec, port: int = CONTAINER_PORT,
                model: str = CONTAINER_MODEL) -> LaunchSpec | None:
    """The cell's launch command (spec.Launch); None when its engine serves nothing."""
    launch = spec.launch
    if launch is None or not launch.health:
        return None
    return LaunchSpec(command=launch.command(port, model), env=dict(launch.env),
                      shm_size=launch.shm_size, health=launch.health, gpu=launch.gpu)


def with_mtp(ctx: Context, spec: CellSpec, launch: LaunchSpec, model_dir: Path,
             details: dict[str, Any]) -> LaunchSpec:
    """The launch plus the engine's MTP flags (model.mtp.launch) when the model directory
    holds the MTP head's weights (model/mtp.py); what was found goes to the level's details."""
    import dataclasses

    from ..model.mtp import find_weights, launch_args

    weights = find_weights(model_dir)
    args = launch_args(ctx.matrix.model, spec.cell.engine, weights)
    details["mtp"] = {**weights.as_dict(), "args": args}
    return dataclasses.replace(launch, command=launch.command + args) if args else launch


def model_source(ctx: Context, options: RunOptions) -> Path | None:
    """A host directory of real weights, or None for the fixture."""
    if options.model_path is not None:
        path = Path(options.model_path)
    else:
        source = smoke_settings(ctx).get("model_source", "fixture")
        if source == "fixture":
            return None
        path = Path(source) if Path(source).is_absolute() else ctx.root / source
    if not path.is_dir():
        raise UsageError(f"model path {path} is not a directory",)
    return path.resolve()


NOT_VERIFIED = "not verified"


def correctness_unverifiable(ctx: Context, spec: CellSpec, real_model: bool) -> str | None:
    """Why a GPU cell's model level cannot check the answer (then it is "not verified", never
    "pass"), or None. The fixture's random weights check structure only: enough for the CPU
    lane, whose kernels the fixture exercises, not for a GPU cell, whose wrong kernels produce
    fluent garbage (failure-modes.md, "Silent garbage")."""
    if not spec.cell.is_gpu:
        return None
    if not real_model:
        return (f"{NOT_VERIFIED}: a GPU cell's model level needs real weights "
                "(smoke.model_source: a host directory, or --model-path); the fixture checks "
                "structure, not the answer")
    if not smoke_settings(ctx).get("probe", {}).get("expect"):  # as probe_settings reads it
        return f"{NOT_VERIFIED}: smoke.probe.expect is empty, so the answer cannot be checked"
    return None


def host_has_gpu() -> bool:
    """An NVIDIA device node is present (what `--gpus` hands to a container)."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


# --------------------------------------------------------------------------------------------
# Containers
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so `finally` blocks stop our containers."""
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            callable(signal.getsignal(signal.SIGTERM)):  # the CLI's one signal path has it
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def container(docker: Engine, image_id: str, name: str | None = None,
              **kwargs: Any) -> contextlib.AbstractContextManager[str]:
    """A smoke container of `docker` (Engine.container: always stopped and removed after)."""
    return docker.container(image_id, name=name, prefix="infermatrix-smoke", **kwargs)


def append_log(path: Path, title: str, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"\n===== {title} =====\n{text}")
        if not text.endswith("\n"):
            handle.write("\n")


def last_lines(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Harness:
    """Runs harness programs in containers of the image under test, on `docker`."""

    docker: Engine
    image_id: str
    log_path: Path
    mounts: list[engine.Mount] = field(default_factory=list)
    where: str = "image"  # "image" or "mounted from the host"
    gpus: "GpuSetting | bool" = True  # how a GPU container asks for its GPUs
    emulated: str | None = None  # Engine.emulation_of: the image's programs run under QEMU

    @classmethod
    def for_image(cls, docker: Engine, image_id: str, log_path: Path,
                  gpus: "GpuSetting | bool" = True) -> Harness:
        """The harness of this checkout, mounted read-only into the image under test (images
        do not carry it: a harness change must not change, and rebuild, every image)."""
        mount = engine.Mount(str(HARNESS_ON_HOST), HARNESS_IN_IMAGE, read_only=True)
        how = "mounted from the host" if docker.is_local() else \
            "copied from the host"  # an engine elsewhere: engine.Mount.copied_to
        return cls(docker, image_id, log_path, [mount], how, gpus,
                   docker.emulation_of(image_id))

    def run(self, program: str, args: list[str], timeout_s: float, *,
            mounts: Iterable[engine.Mount] = (), gpu: bool = False,
            labels: dict[str, str] | None = None) -> tuple[int | None, dict[str, Any] | None, str]:
        """(exit code or None on timeout, parsed result line, output)."""
        with container(self.docker, self.image_id,
                       entrypoint=["python3", "-m", f"harness.{program}"],
                       command=args, env=HARNESS_ENV, mounts=[*self.mounts, *mounts],
                       gpus=self.gpus if gpu else False,
                       labels=labels) as cid:
            try:
                code: int | None = self.docker.wait_container(cid, timeout=timeout_s)
            except StageFailure:
                code = None
            output = self.docker.container_logs(cid)
        append_log(self.log_path, f"harness.{program} {' '.join(args)} (exit {code})", output)
        return code, harness_result.parse(output), output


def harness_level(level: str, code: int | None, parsed: dict[str, Any] | None, output: str,
                  timeout_s: float) -> tuple[str, str | None, dict[str, Any]]:
    """Status, reason and details from a harness program's run."""
    if code is None:
        return "fail", f"timed out after {timeout_s:.0f} s", {"output_tail": last_lines(output)}
    if parsed is None:
        return "fail", f"the harness printed no result (exit {code})", \
            {"output_tail": last_lines(output)}
    status = parsed.get("status", "fail")
    details = {k: v for k, v in parsed.items() if k not in ("status", "reason", "check")}
    if status == "fail":
        details["output_tail"] = last_lines(output, 20)
    return status, parsed.get("reason"), details


# --------------------------------------------------------------------------------------------
# Levels
# --------------------------------------------------------------------------------------------

SMOKE_ELSEWHERE = "run the smoke on a {platform} engine: --smoke-on NAME " \
    "(`infermatrix smoke --on NAME`) or smoke.on"


def cannot_run_emulated(emulated: str, fix: str = SMOKE_ELSEWHERE) -> str:
    """Why a level that runs the image's programs does not run them under QEMU, and where
    it can (`fix`, {platform} filled in). Measured on the GB10 cell: `import torch` under
    qemu-user crashed after oneDNN found no MIDR_EL1 in sysfs, and the static level waited
    out its whole timeout."""
    platform = emulated.split()[0]
    return (f"{NOT_VERIFIED}: the image runs {emulated} here, where torch cannot start "
            f"(qemu-user gives oneDNN's CPU probe no MIDR_EL1); {fix.format(platform=platform)}")


def emulated_skip(level: str, emulated: str, fix: str = SMOKE_ELSEWHERE) -> LevelResult:
    return LevelResult(level, "skip", cannot_run_emulated(emulated, fix),
                       details={"not_verified": True, "emulated": emulated})


def static_verdict(audit_status: str, audit_reason: str | None,
                   imports: dict[str, Any]) -> tuple[str, str | None]:
    """The static level from its two parts: a failed part fails it; imports that could not
    run (emulated) leave it "not verified" (skip, never pass), whatever the audit says."""
    failed = ([f"audit: {audit_reason}"] if audit_status == "fail" else []) + \
        ([f"imports: {imports.get('reason')}"] if imports.get("status") == "fail" else [])
    if failed:
        return "fail", "; ".join(failed)
    if imports.get("status") == "skip":
        return "skip", f"imports: {imports.get('reason')}"
    return "pass", None


def run_static(ctx: Context, spec: CellSpec, harness: Harness, timeout_s: float,
               gpu_here: bool = False, options: RunOptions | None = None) -> LevelResult:
    """The audit (the audit step's record of this image, else run now) and the imports in a
    container of the image (harness.static_check: every engine and kernel package imports,
    versions equal the cell's pins); under emulation the audit's native probe still runs, the
    imports do not (cannot_run_emulated)."""
    details: dict[str, Any] = {}
    audit_status = run_audit(ctx, spec, harness.image_id, details, harness.docker)
    if harness.emulated:
        imports: dict[str, Any] = {"status": "skip", "emulated": harness.emulated,
                                   "reason": cannot_run_emulated(harness.emulated)}
    else:
        specs = [s for s in [spec.engine_requirement, *kernel_distributions(ctx, spec)]
                 if s]
        code, parsed, output = harness.run("static_check", [*specs, "--torch", spec.cell.torch],
                                           timeout_s)
        status, reason, imports = harness_level("static", code, parsed, output, timeout_s)
        imports = {**imports, "status": status, "reason": reason}
    details["imports"] = imports
    final, why = static_verdict(audit_status, details["audit"].get("reason"), imports)
    return LevelResult("static", final, why, details=details)


def recorded_audit(record: journal.CellRecord, image_id: str, docker: Engine
                   ) -> journal.StageRecord | None:
    """An audit already recorded for this very image since its build (the pipeline's audit
    step), so the static level does not repeat it."""
    audit, built = record.stage("audit"), record.stage("build")
    if audit is None or audit.status not in (journal.Status.PASS, journal.Status.FAIL):
        return None
    image = record.audit.image
    if not image or (audit.finished or "") < (built.finished or "" if built else ""):
        return None
    if image != image_id and docker.image_id_of(image) != image_id:
        return None
    return audit


def run_audit(ctx: Context, spec: CellSpec, image_id: str, details: dict[str, Any],
              docker: Engine) -> str:
    """The audit of this image: the one the audit step recorded, else audit.audit_cell (which
    records its own stage); any failure to run it fails the level."""
    done = recorded_audit(journal.cell_record(ctx.state, spec.id), image_id, docker)
    if done is not None:
        details["audit"] = {"status": str(done.status), "reason": done.reason,
                            "reused": f"audit stage of {done.finished}",
                            "checks": done.details.get("checks", [])}
        return str(done.status)
    try:
        from . import audit

        result = audit.audit_cell(ctx, spec, image_id, docker=docker)
    except (ImportError, InfermatrixError) as exc:  # an audit that did not run fails the level
        details["audit"] = {"status": "fail", "reason": f"the audit did not run: {exc}"}
        return "fail"
    details["audit"] = {"status": result.status, "reason": result.reason,
                        "checks": [c.as_dict() for c in result.checks]}
    return result.status


def run_gpu(ctx: Context, spec: CellSpec, harness: Harness, timeout_s: float,
            gpu_here: bool, options: RunOptions | None = None) -> LevelResult:
    kernels = [s.split("==")[0] for s in kernel_distributions(ctx, spec)]
    return gpu_level(harness, spec.cell.arch, spec.cell.engine, kernels, timeout_s, gpu_here)


def gpu_level(harness: Harness, arch: str, engine_name: str, kernels: list[str],
              timeout_s: float, gpu_here: bool, elsewhere: str = SMOKE_ELSEWHERE) -> LevelResult:
    """harness.gpu_check in a container given the GPUs (smoke's and verify's gpu level): the
    device's capability is the arch, torch/Triton/kernel-package kernels agree with a torch
    reference; in the image of an engine the harness knows, a missing triton or GDN op fails.
    Skipped without a GPU here and on a CPU cell (not applicable)."""
    if arch == CPU:
        return LevelResult("gpu", "skip", "arch cpu: the gpu level does not apply",
                           details={"applicable": False})
    if not gpu_here:
        return LevelResult("gpu", "skip", NO_GPU, details={"needs_gpu": True})
    if harness.emulated:
        return emulated_skip("gpu", harness.emulated, elsewhere)
    code, parsed, output = harness.run("gpu_check", ["--arch", arch, "--engine",
                                                     harness_name(engine_name),
                                                     "--kernels", *kernels], timeout_s, gpu=True)
    status, reason, details = harness_level("gpu", code, parsed, output, timeout_s)
    return LevelResult("gpu", status, reason, details=details)


def probe_settings(ctx: Context, real_model: bool, health_timeout_s: float,
                   health_path: str) -> harness_probe.ProbeSettings:
    probe = smoke_settings(ctx).get("probe", {})
    return harness_probe.ProbeSettings(
        prompt=probe.get("prompt", harness_probe.DEFAULT_PROMPT), expect=probe.get("expect"),
        concurrency=int(probe.get("concurrency", 4)), max_tokens=int(probe.get("max_tokens", 32)),
        real_model=real_model, health_path=health_path, health_timeout_s=health_timeout_s)


def fixture_dir(ctx: Context, cell_id: str, variant: str) -> Path:
    return ctx.state.root / "fixtures" / f"{cell_id}-{variant}"


def prepare_fixture(ctx: Context, spec: CellSpec, harness: Harness, variant: str,
                    timeout_s: float, level: str = "model",
                    reuse: bool = False) -> Path | LevelResult:
    """Generate the fixture model with the image's own transformers, into the state dir
    (with `reuse`, the one this image made already, e.g. for the model level just before):
    its model directory, or the level's failure."""
    import shutil

    out = fixture_dir(ctx, spec.id, variant)
    made = out / "model" / "config.json"
    if reuse and made.is_file() and (out / "image").is_file() and \
            (out / "image").read_text() == harness.image_id:
        return out / "model"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    args = ["--out", "/fixture/model"] + {"broken": ["--broken"], "trained": ["--trained"]
                                          }.get(variant, [])
    code, parsed, output = harness.run("make_fixture_model", args, timeout_s,
                                       mounts=[engine.Mount(str(out), "/fixture", read_only=False)])
    status, reason, details = harness_level("fixture", code, parsed, output, timeout_s)
    if status != "pass":
        return LevelResult(level, "fail", f"fixture model: {reason}",
                           details={"fixture": details})
    (out / "image").write_text(harness.image_id)
    return out / "model"


def container_gone(docker: Engine, container_id: str) -> Callable[[], str | None]:
    def check() -> str | None:
        state = docker.container_status(container_id)
        if state.get("Status") in ("running", "created", "restarting"):
            return None
        return f"container {state.get('Status')} with exit code {state.get('ExitCode')}"
    return check


def published_port(docker: Engine, container_id: str, deadline_s: float = 10.0
                   ) -> tuple[str, int]:
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        found = docker.container_port(container_id, f"{CONTAINER_PORT}/tcp")
        if found:
            host, port = found
            return ("127.0.0.1" if host in ("0.0.0.0", "") else host), port
        time.sleep(0.2)
    raise StageFailure(f"container {container_id[:12]} published no port {CONTAINER_PORT}")


def run_model(ctx: Context, spec: CellSpec, harness: Harness, timeout_s: float,
              gpu_here: bool, options: RunOptions) -> LevelResult:
    """The engine server started with the cell's launch command (engines.<e>.serve, the model
    card's flags, per-arch flags/env) on the real weights (read-only) or a fixture the image
    makes (harness.make_fixture_model), probed over the OpenAI-compatible API (harness.probe).
    The fixture's random weights are for the CPU lane: a GPU cell needs real weights and an
    expected answer, else the level is a skip "not verified" (never a pass)."""
    started = time.monotonic()
    server = serving_start(ctx, spec, harness, gpu_here, options, "model", timeout_s)
    if isinstance(server, LevelResult):
        return server
    remaining = max(30.0, timeout_s - (time.monotonic() - started))
    # a fixture's probe checks structure, not meaning
    settings = probe_settings(ctx, server.real_model, health_timeout_s=remaining,
                              health_path=server.launch.health)
    details = server.details
    details["env"] = server.launch.env  # then what the live server maps
    return serve_image_and_probe(
        server, settings,
        observe=lambda cid: observe_loaded_set(ctx, spec, harness.docker, cid, details))


def serve_image_and_probe(server: Server, settings: harness_probe.ProbeSettings,
                          observe: Callable[[str], dict[str, Any]] | None = None) -> LevelResult:
    """Start `server`, probe it, keep the log (`observe`: a look at the live container before
    it stops); the container never outlives this call. Needs no matrix: `infermatrix verify`
    runs it from images.lock alone. On an engine elsewhere (ssh://, tcp://) the probe runs
    beside the server in its network namespace, and a fixture model is copied in; real
    weights (`server.real_model`) are that host's."""
    harness, launch, label, details = server.harness, server.launch, server.label, server.details
    docker = harness.docker
    local = docker.is_local()
    with container(docker, harness.image_id, command=launch.command, env=launch.env,
                   shm_size=launch.shm_size,
                   mem_limit=launch.mem_limit,
                   mounts=[engine.Mount(str(server.host_model), CONTAINER_MODEL, read_only=True,
                                        on_engine_host=server.real_model)],
                   ports={f"{CONTAINER_PORT}/tcp": ("127.0.0.1", None)} if local else None,
                   gpus=harness.gpus if launch.gpu else False,
                   labels={SMOKE_LABEL: label},
                   name=f"infermatrix-smoke-{label}-{os.getpid()}") as cid:
        with Heartbeat(f"{label}: the engine server starts and answers the probe"):
            if local:
                host, port = published_port(docker, cid)
                client = harness_probe.Client(f"http://{host}:{port}",
                                              timeout_s=min(300.0, settings.health_timeout_s))
                probe = harness_probe.run_probe(client, settings,
                                                alive=container_gone(docker, cid))
            else:
                probe = probe_beside(harness, cid, settings, label)
        loaded = observe(cid) if observe else {}
        engine_log = docker.container_logs(cid)
    append_log(harness.log_path, f"engine server: {' '.join(launch.command)}", engine_log)
    details.update({k: v for k, v in probe.items() if k not in ("status", "reason", "check")})
    if probe["status"] == "fail":
        details["engine_log_tail"] = last_lines(engine_log)
    if probe["status"] != "fail" and loaded.get("status") == "fail":
        return LevelResult("model", "fail", f"loaded set: {loaded['detail']}", details=details)
    return LevelResult("model", probe["status"], probe.get("reason"), details=details)


def probe_command_line(settings: harness_probe.ProbeSettings) -> list[str]:
    """harness.probe's command line for these settings (the probe run in a container)."""
    return ["--url", f"http://127.0.0.1:{CONTAINER_PORT}", "--health-path", settings.health_path,
            "--health-timeout", str(settings.health_timeout_s), "--prompt", settings.prompt,
            "--expect", settings.expect or "", "--concurrency", str(settings.concurrency),
            "--max-tokens", str(settings.max_tokens),
            "--real" if settings.real_model else "--fixture"]


def probe_beside(harness: Harness, server_id: str, settings: harness_probe.ProbeSettings,
                 label: str, poll_s: float = 5.0) -> dict[str, Any]:
    """harness.probe in a container of the same image that shares the server's network
    namespace (`--network container:SERVER`): the server's port is never published on a
    remote host. A server that ends first fails the probe at once, as the local probe's
    liveness check does."""
    docker = harness.docker
    server_gone = container_gone(docker, server_id)
    with container(docker, harness.image_id, entrypoint=["python3", "-m", "harness.probe"],
                   command=probe_command_line(settings), env=HARNESS_ENV,
                   mounts=harness.mounts,
                   network=f"container:{server_id}", labels={SMOKE_LABEL: label}) as probe_id:
        deadline = time.monotonic() + settings.health_timeout_s + 600
        code = None
        while code is None:
            try:
                code = docker.wait_container(probe_id, timeout=poll_s)
            except StageFailure:  # still probing
                gone = server_gone()
                if gone or time.monotonic() > deadline:
                    output = docker.container_logs(probe_id)
                    append_log(harness.log_path, "harness.probe (beside the server)", output)
                    why = f"the engine server ended: {gone}" if gone else \
                        f"no answer within {settings.health_timeout_s:.0f} s"
                    return {"check": "model", "status": "fail", "reason": f"health: {why}",
                            "checks": []}
        output = docker.container_logs(probe_id)
    append_log(harness.log_path, f"harness.probe (beside the server, exit {code})", output)
    parsed = harness_result.parse(output)
    if parsed is None:
        return {"check": "model", "status": "fail", "checks": [],
                "reason": f"the probe printed no result (exit {code}): {last_lines(output, 5)}"}
    return parsed


def observe_loaded_set(ctx: Context, spec: CellSpec, docker: Engine, container_id: str,
                       details: dict[str, Any]) -> dict[str, Any]:
    """Record the objects the live server maps (`mapped`) and judge them (`loaded_set`)."""
    from . import audit

    try:
        details["mapped"] = audit.server_mapped_objects(docker, container_id)
    except (StageFailure, InfermatrixError) as exc:
        details["loaded_set"] = {"status": "fail", "detail": str(exc)}
        return details["loaded_set"]
    details["loaded_set"] = audit.judge_server_maps(ctx, spec.cell, details["mapped"])
    return details["loaded_set"]


@dataclass(frozen=True)
class Server:
    """An engine server of the image under test that a serving level (model, throughput,
    workload) starts once no refusal applies; `infermatrix verify` makes one from images.lock."""
    harness: Harness
    launch: LaunchSpec  # with the MTP flags where the weights have the head
    host_model: Path  # the real weights, else the fixture made for it
    label: str  # the cell id: in the containers' names and SMOKE_LABEL
    details: dict[str, Any] = field(default_factory=dict)  # the level's: model source, command
    real_model: bool = False  # real weights, read on the engine's host (never copied there)


def serving_start(ctx: Context, spec: CellSpec, harness: Harness, gpu_here: bool,
                  options: RunOptions, level: str, timeout_s: float) -> LevelResult | Server:
    """The refusals the serving levels share, in order: no server, no GPU here, a remote engine
    for a load level (the load runs here, its ports stay on that host: Level.load), no
    weights to judge correctness, emulation; then the model: the real weights, else a fixture
    (the model level makes `options.fixture` anew, a load level reuses the Level.load variant
    that this image made)."""
    fixture, ports = level_table.BY_NAME[level].load or (options.fixture, None)
    launch = launch_spec(ctx, spec)
    if launch is None:
        return LevelResult(level, "skip", f"engine {spec.cell.engine} defines no server "
                           f"(no `health` in engines.{spec.cell.engine})",
                           details={"applicable": False})
    if launch.gpu and not gpu_here:
        return LevelResult(level, "skip", NO_GPU, details={"needs_gpu": True})
    if ports and not harness.docker.is_local():
        where = harness.docker.label()
        return LevelResult(level, "skip", f"{NOT_VERIFIED} here: the load runs on this "
                           f"machine and {ports} on {where}'s host; "
                           f"run `infermatrix smoke CELL --levels {level}` there",
                           details={"not_verified": True, "engine": where})
    host_model = model_source(ctx, options)
    unverified = correctness_unverifiable(ctx, spec, host_model is not None)
    if unverified:
        return LevelResult(level, "skip", unverified,
                           details={"not_verified": True, "needs_weights": host_model is None})
    if harness.emulated:
        return emulated_skip(level, harness.emulated)
    started = time.monotonic()
    details: dict[str, Any] = {"model_source": str(host_model) if host_model
                               else f"fixture ({fixture})"}
    if host_model is None:
        made = prepare_fixture(ctx, spec, harness, fixture, timeout_s, level=level,
                               reuse=level != "model")
        if isinstance(made, LevelResult):
            return made
        host_model, details["fixture_s"] = made, round(time.monotonic() - started, 2)
    launch = with_mtp(ctx, spec, launch, host_model, details)
    details["command"] = launch.command
    return Server(harness, launch, host_model, spec.id, details,
                  real_model=not details["model_source"].startswith("fixture"))


def run_throughput(ctx: Context, spec: CellSpec, harness: Harness, timeout_s: float,
                   gpu_here: bool, options: RunOptions) -> LevelResult:
    """N replicas of the server (smoke.throughput.replicas, default 2), each on its own
    loopback port, under job/throughput.py's bounded closed-loop load: output tokens/s in
    total and per replica, TTFT and inter-token latency p50/p95, errors, scaling 1..N."""
    from ..job import throughput

    started = time.monotonic()
    server = serving_start(ctx, spec, harness, gpu_here, options, "throughput", timeout_s)
    if isinstance(server, LevelResult):
        return server
    launch, details, docker = server.launch, server.details, harness.docker
    settings = throughput.LoadSettings.from_matrix(smoke_settings(ctx).get("throughput"))
    remaining = max(60.0, timeout_s - (time.monotonic() - started))
    with contextlib.ExitStack() as replicas:
        ids = [replicas.enter_context(replica_container(server, i, settings.replicas))
               for i in range(settings.replicas)]
        endpoints = [replica_endpoint(docker, cid, i, launch.health) for i, cid in enumerate(ids)]
        try:
            details["health_wait_s"] = throughput.wait_all_healthy(
                endpoints, remaining, alive=lambda: next(filter(None, (container_gone(docker, c)()
                                                                       for c in ids)), None))
            details.update(throughput.measure(endpoints, settings))
        finally:
            logs = [docker.container_logs(cid) for cid in ids]
    for index, text in enumerate(logs):
        append_log(harness.log_path, f"throughput replica {index}: {' '.join(launch.command)}",
                   text)
    status, reason = throughput.verdict(details)
    if status == "fail":
        details["engine_log_tail"] = last_lines(logs[0], 40)
    return LevelResult("throughput", status, reason, details=details)


def run_workload(ctx: Context, spec: CellSpec, harness: Harness, timeout_s: float,
                 gpu_here: bool, options: RunOptions) -> LevelResult:
    """The job's shape against one server of the image (stages/workload.py): the trained
    fixture on the CPU lane, real weights where a GPU is."""
    from . import workload

    started = time.monotonic()
    server = serving_start(ctx, spec, harness, gpu_here, options, "workload", timeout_s)
    if isinstance(server, LevelResult):
        return server
    details = server.details
    settings = workload.WorkloadSettings.from_matrix(
        smoke_settings(ctx).get("workload"), cpu=not spec.cell.is_gpu,
        model_dir=server.host_model, real_model=server.real_model)
    result = workload_level(
        server, settings, max(60.0, timeout_s - (time.monotonic() - started)), spec.cell.arch,
        (spec.attention_backend,
         audited_gdn_choice(journal.cell_record(ctx.state, spec.id), spec.cell.arch)),
        published_figure(read_lock_entry(ctx, spec.id)))
    from ..model.capacity import ratios_path

    details["prediction"] = workload.prediction(
        spec.cell.arch, details["sweep"], details["model_source"].startswith("fixture"),
        ratios_path(ctx.state.root))
    return result


def workload_level(server: Server, settings: "WorkloadSettings", health_wait_s: float,
                   arch: str, planned: tuple[str | None, str | None],
                   published: float | None) -> LevelResult:
    """`server` on loopback under the workload level's load (stages/workload.py), judged: the
    backends its log names against the `planned` attention and GDN prefill ones, its figure
    against the arch's target and the `published` one. Needs no matrix: `infermatrix verify`
    runs it from images.lock alone."""
    from ..job import throughput
    from . import workload

    harness, launch, label, details = server.harness, server.launch, server.label, server.details
    docker = harness.docker
    with replica_container(server, 0, 1) as cid:
        endpoint, alive = replica_endpoint(docker, cid, 0, launch.health), \
            container_gone(docker, cid)
        try:
            details["health_wait_s"] = throughput.wait_all_healthy([endpoint], health_wait_s,
                                                                   alive=alive)
            with Heartbeat(f"{label}: the workload level (sweep, soak, needle)"):
                details.update(workload.measure(endpoint, settings, alive=alive))
        finally:
            log = docker.container_logs(cid)
    append_log(harness.log_path, f"workload server: {' '.join(launch.command)}", log)
    details["backends"] = workload.judge_backends(log, *planned)
    details["target"] = workload.target_verdict(details["tokens_per_s"], arch, settings,
                                                published)
    status, reason = workload.verdict(details, settings.regression_fails)
    if status == "fail":
        details["engine_log_tail"] = last_lines(log, 40)
    return LevelResult("workload", status, reason, details=details)


def audited_gdn_choice(record: journal.CellRecord, arch: str) -> str | None:
    """The GDN prefill backend the audit read the engine choosing for `arch` (its Triton
    check runs the engine's own _resolve_gdn_prefill_backend), or None when it made none."""
    check = next((c for c in record.audit.checks if c.name == "triton-smem"), None)
    path = ((check.extra.get("paths") or {}).get(arch) or {}).get("gdn_prefill") if check else {}
    chosen = path.get("chosen") if isinstance(path, dict) else None
    return chosen if isinstance(chosen, str) else None


def read_lock_entry(ctx: Context, cell_id: str) -> dict[str, Any]:
    """The cell's entry of images.lock (its last published digest), {} without one."""
    from ..imageslock import read_images_lock

    try:
        lock = read_images_lock(ctx.root / "images.lock")
    except Exception:  # noqa: BLE001 - no usable images.lock: nothing to compare with
        return {}
    return dict(((lock or {}).get("images") or {}).get(cell_id) or {})


def published_figure(entry: dict[str, Any]) -> float | None:
    """The workload tokens/s per GPU an images.lock entry was published with."""
    figure = ((entry.get("smoke") or {}).get("workload") or {}).get("tokens_per_s_per_gpu")
    return float(figure) if isinstance(figure, (int, float)) else None


def replica_container(server: Server, index: int, count: int
                      ) -> contextlib.AbstractContextManager[str]:
    """Replica `index` of `server` (of `count`); on a GPU host, pinned to GPU `index`."""
    harness, launch, label, model = server.harness, server.launch, server.label, server.host_model
    env = dict(launch.env)
    if launch.gpu and count > 1:
        env["CUDA_VISIBLE_DEVICES"] = str(index)  # every GPU is requested; one is used
    return container(harness.docker, harness.image_id, command=launch.command, env=env,
                     shm_size=launch.shm_size, mem_limit=launch.mem_limit,
                     mounts=[engine.Mount(str(model), CONTAINER_MODEL, read_only=True)],
                     ports={f"{CONTAINER_PORT}/tcp": ("127.0.0.1", None)},
                     gpus=harness.gpus if launch.gpu else False,
                     labels={SMOKE_LABEL: label},
                     name=f"infermatrix-smoke-{label}-{os.getpid()}-r{index}")


def replica_endpoint(docker: Engine, container_id: str, index: int, health: str
                     ) -> ServerEndpoint:
    from ..job.generate import ServerEndpoint

    host, port = published_port(docker, container_id)
    return ServerEndpoint(f"replica{index}", f"http://{host}:{port}", health)


# --------------------------------------------------------------------------------------------
# A cell
# --------------------------------------------------------------------------------------------

def image_under_test(ctx: Context, cell_id: str, docker: Engine, given: str | None = None
                     ) -> str:
    """The image id the build stage recorded (it must still be in Docker), or the id of the
    image `smoke --image` names."""
    if given:
        image_id = docker.image_id_of(given)
        if image_id is None:
            raise UsageError(f"--image {given}: no such image in engine {docker.label()}")
        return image_id
    record = journal.cell_record(ctx.state, cell_id)
    image_id = record.image_id
    if not image_id or record.status_of("build") != journal.Status.PASS:
        raise MissingPrerequisite(f"{cell_id}: no passed build in the journal "
                                  f"({ctx.state.journal})",
                                  fix=f"run `infermatrix build --select {cell_id}` first")
    if docker.image_id_of(image_id) is None:
        raise ImageGone(f"{cell_id}: the built image {image_id} is no longer in Docker",
                        fix=f"rebuild it: `infermatrix build --select {cell_id}`")
    return image_id


# a level's runner (infermatrix/levels.py: Level.runner names it)
LevelRunner = Callable[[Context, CellSpec, Harness, float, bool, RunOptions], LevelResult]


def timed_level(level: str, fn: Callable[[], LevelResult]) -> LevelResult:
    started = time.monotonic()
    try:
        result = fn()
    except (StageFailure, harness_probe.ProbeError) as exc:
        result = LevelResult(level, "fail", str(exc))
    except Exception as exc:  # noqa: BLE001 - a Docker API error fails the level, with why
        result = LevelResult(level, "fail", f"{type(exc).__name__}: {exc}")
    result.duration_s = time.monotonic() - started
    return result


def previous_levels(record: journal.CellRecord, image_id: str) -> dict[str, Any]:
    """Levels of an earlier smoke run of the same image (kept when a run redoes only some)."""
    if record.status_of("smoke") in (None, journal.Status.RUNNING) \
            or record.smoke.image_id != image_id:
        return {}
    return {name: level.to_json() for name, level in record.smoke.levels.items()}


def smoke_endpoint(ctx: Context, text: str | None) -> "engine.Endpoint | None":
    """The engine `--smoke-on` / `smoke --on` / smoke.on names: a builder of build.builders by
    name (its TLS files and all), else [NAME=]ENDPOINT or a Docker context."""
    if not text:
        return None
    from ..engine.builders import endpoints_of_matrix

    named = {e.name: e for e in endpoints_of_matrix(ctx.matrix)}
    return named[text] if text in named else engine.parse_builder(text)


def bring_image(source: "engine.Engine", target: "engine.Engine", image_id: str,
                log_path: Path) -> dict[str, Any]:
    """Put the image under test into `target` (the smoke's engine) unless it has it: `docker
    save | docker load` keeps the image id, so the tag later lands on the id tested there."""
    if target.image_id_of(image_id) == image_id:
        return {"from": source.label(), "how": "already there", "seconds": 0.0}
    started = time.monotonic()
    with Heartbeat(f"{image_id[:19]}: docker save | docker load into {target.label()}"):
        source.copy_image_to(image_id, target, log_path=log_path)
    if target.image_id_of(image_id) != image_id:
        raise StageFailure(f"{image_id}: not in {target.label()} after docker save | load")
    return {"from": source.label(), "how": "docker save | docker load",
            "seconds": round(time.monotonic() - started, 1)}


def smoke_cell(ctx: Context, spec: CellSpec, options: RunOptions | None = None, *,
               docker: Engine) -> SmokeResult:
    """Run the requested levels on the cell's built image, in `docker`; record them in the
    journal. With `options.smoke_on` the levels run on that engine, the image moved there
    from `docker` first."""
    options = options or RunOptions()
    if options.fixture not in FIXTURE_VARIANTS:
        raise UnknownChoice(f"unknown fixture variant {options.fixture!r} "
                         f"(one of {', '.join(FIXTURE_VARIANTS)})")
    levels = levels_to_run(ctx, options.levels)
    image_id = image_under_test(ctx, spec.id, docker, options.image)
    log_path = ctx.state.cell_log(spec.id, "smoke")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"smoke {spec.id} image {image_id} levels {','.join(levels)}\n")
    on = smoke_endpoint(ctx, options.smoke_on)
    here = docker if on is None else Engine(on)
    moved = None if on is None else bring_image(docker, here, image_id, log_path)
    harness = Harness.for_image(here, image_id, log_path, gpu_setting(ctx))
    return _smoke_levels(ctx, spec, options, levels, harness, moved)


def _smoke_levels(ctx: Context, spec: CellSpec, options: RunOptions, levels: list[str],
                  harness: Harness, moved: dict[str, Any] | None) -> SmokeResult:
    """The levels on the harness's engine. A named smoke engine (`moved`: the image was
    brought there) is where the GPUs are by the user's word: a GPU level it cannot serve
    fails with its one-line refusal rather than being skipped."""
    here, image_id, log_path = harness.docker, harness.image_id, harness.log_path
    gpu_here = options.host_gpu if options.host_gpu is not None else \
        True if moved is not None and not here.is_local() else host_has_gpu()
    kept = previous_levels(journal.cell_record(ctx.state, spec.id), image_id)
    journal.record_stage(ctx.state, spec.id, "smoke", journal.Status.RUNNING, log=log_path,
                         details={"image_id": image_id, "levels": kept})
    started = time.monotonic()
    result = SmokeResult(spec.id, image_id)
    with sigterm_as_interrupt():
        for level in levels:
            runner: LevelRunner = globals()[level_table.BY_NAME[level].runner]
            result.levels[level] = timed_level(level, lambda: runner(
                ctx, spec, harness, level_timeout(ctx, level), gpu_here, options))
    all_levels = {**kept, **{n: lv.as_dict() for n, lv in result.levels.items()}}
    status = overall_status([lv["status"] for lv in all_levels.values()])
    details = {"image_id": image_id, "levels": all_levels, "host_gpu": gpu_here,
               "harness": harness.where, "emulated": harness.emulated,
               "tokens_per_s": tokens_per_s(all_levels),
               **{name: globals()[str(level_table.BY_NAME[name].summary)](all_levels)
                  for name in level_table.SUMMARISED},
               "engine": here.label(), "engine_host": engine_host(here),
               "image_moved": moved, "gpu_facts": gpu_facts(all_levels),
               "image_source": f"--image {options.image}" if options.image else "build"}
    journal.record_stage(ctx.state, spec.id, "smoke", status,
                         duration_s=time.monotonic() - started, log=log_path,
                         reason=result.reason, details=details)
    return result


def engine_host(here: "engine.Engine") -> dict[str, Any]:
    """The smoke engine's host facts (engine.host_facts), or why they could not be read."""
    try:
        return here.host_facts()
    except InfermatrixError as exc:
        return {"engine": here.label(), "error": str(exc).splitlines()[0]}


def gpu_facts(levels: dict[str, Any]) -> dict[str, Any] | None:
    """The GPU the levels ran on, as the gpu level's device check saw it (name, compute
    capability, driver): recorded with the engine that ran them (issue 30)."""
    for check in (levels.get("gpu") or {}).get("checks") or []:
        if isinstance(check, dict) and "capability" in check:
            return {k: check.get(k) for k in ("device", "capability", "driver_version", "name")
                    if check.get(k) is not None}
    return None


def tokens_per_s(levels: dict[str, Any]) -> dict[str, Any] | None:
    return (levels.get("model") or {}).get("tokens_per_s")


def throughput_summary(levels: dict[str, Any]) -> dict[str, Any] | None:
    """The throughput level's headline figures (the report's and the tag policy's)."""
    level = levels.get("throughput") or {}
    if level.get("status") not in ("pass", "fail") or "points" not in level:
        return None
    return {k: level.get(k) for k in ("replicas", "tokens_per_s", "per_replica_tokens_per_s",
                                      "scaling_ratio", "errors")}


def workload_summary(levels: dict[str, Any]) -> dict[str, Any] | None:
    """The workload level's headline figures (report, images.lock, the signed test result)."""
    from .workload import summary

    return summary(levels.get("workload") or {})


def smoke_cells(ctx: Context, cells: list[CellSpec], options: RunOptions | None = None,
                on_result: Callable[[SmokeResult], None] | None = None, *,
                docker: Engine) -> list[SmokeResult]:
    """Smoke each cell in turn (one engine server at a time: vLLM on CPU takes a core)."""
    results = []
    for spec in cells:
        result = smoke_cell(ctx, spec, options, docker=docker)
        results.append(result)
        if on_result:
            on_result(result)
    return results

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """static (imports; the audit of the step before) → gpu → model, per matrix.yaml or
    --levels."""
    results = smoke_cells(run.ctx, cells, run.options, docker=run.docker,
                          on_result=lambda result: echo("\n".join(result.lines())))
    passed = [r.cell_id for r in results if r.status != "fail"]
    failed = [r.cell_id for r in results if r.status == "fail"]
    # a cell whose levels all skipped goes on (the tag step records why it is not tagged),
    # but the step's line must not let it read as tested
    unverified = [r.cell_id for r in results if r.status == "skip"]
    note = f"not verified (every level skipped): {', '.join(unverified)}" if unverified else ""
    return step_record("smoke", passed, failed, note=note)
