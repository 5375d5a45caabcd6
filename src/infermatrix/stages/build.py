"""`infermatrix build`: build the rendered cells (images/<cell-id>/) on the Docker engine.

Per cell:
  0. no build without the cell's committed lock (locks/<cell-id>.txt), and the rendered
     Dockerfile must carry that very lock's digest (label io.infermatrix.lock): a cell rendered
     before its lock existed would install without hashes;
  1. the input hash: every file of images/<cell-id>/ (Dockerfile and context) plus the build
     args that change the result (MAX_JOBS / NVCC_THREADS change speed, not content, and are
     left out so a rerun on a busier host is still a no-op) and the kernel cache keys;
  2. a rerun skips the cell when the journal has the same input hash, a passed build, and the
     image is still in the engine (its local tag is put back if it went missing);
  3. each `kernel-<name>` stage of the Dockerfile whose wheel is not in the kernel cache is
     taken from the shared cache's registry when it has the key (kernelregistry.py,
     `build.kernel_cache`), else compiled (`--target kernel-<name> --output type=local`),
     stored, and pushed there;
  4. the image is built from a temporary copy of the context whose `kernel-wheels/` holds the
     cell's cached wheels, and tagged `infermatrix-local/<cell-id>:build` (a local,
     non-published reference; the publishable tag is the tag stage's job).
The journal is written atomically after each step; an interrupted run leaves finished cells
finished and the interrupted one `running` (not `pass`), so a rerun resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..model import compileplan, compileprogress
from ..engine import docker as engine
from ..engine.builders import base_refs
from ..engine.docker import Engine
from .. import journal, proc
from ..kernels import kernelcache, kernelregistry
from .. import watch
from . import lock as locks
from ..context import Context
from ..errors import (CommandFailed, EngineError, InfermatrixError, KernelStageEmpty,
                      StageFailure)
from ..model.spec import CellSpec
from ..options import RunOptions
from ..state import run_lock
from .steps import Run, StepRecord, StepStatus, echo, step_record  # noqa: F401

Echo = Callable[[str], None]  # where progress lines go (print; a test's list.append)

log = logging.getLogger(__name__)

LOCAL_REPOSITORY = "infermatrix-local"
LOCAL_TAG = "build"
# Build args that size the compile but do not change what is built (left out of the hash).
SPEED_ONLY_ARGS = ("MAX_JOBS", "NVCC_THREADS")
# The build arg that only a kernel stage's compile RUN sees (templates/blocks/repro.j2,
# compile_nonce): a new value reruns that RUN and nothing before it.
COMPILE_NONCE_ARG = "INFERMATRIX_COMPILE_NONCE"
DEFAULT_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
KERNEL_WHEELS_DIR = "kernel-wheels"
INPUT_HASH_LABEL = "io.infermatrix.input-hash"
_KERNEL_STAGE = re.compile(r"^\s*FROM\s+\S+\s+AS\s+kernel-([A-Za-z0-9_.-]+)\s*$",
                           re.IGNORECASE | re.MULTILINE)


def local_ref(cell_id: str) -> str:
    return f"{LOCAL_REPOSITORY}/{cell_id}:{LOCAL_TAG}"


# The rendered Dockerfile's targets (docs/architecture.md): `runtime` is the serving image;
# `train` (FROM runtime) adds the training-only kernels (build.kernels.<k>.profile: train) and
# is built by the train step, after the run's serving images (issue 47).
SERVING_TARGET = "runtime"
TRAIN_TARGET = "train"
TRAIN_TAG_SUFFIX = "-train"
TRAIN_WHEELS_DIR = "kernel-wheels-train"


def train_ref(cell_id: str) -> str:
    """The local reference of the cell's training image (beside its serving image's)."""
    return f"{LOCAL_REPOSITORY}/{cell_id}:{LOCAL_TAG}{TRAIN_TAG_SUFFIX}"


def has_stage(dockerfile_text: str, stage: str) -> bool:
    """Whether the Dockerfile defines a stage named `stage`."""
    return bool(stage_text(dockerfile_text, stage))


def serving_target(dockerfile_text: str) -> str | None:
    """`--target` of the serving image: `runtime` when a train stage follows it (the last
    stage is then not the serving image), else None (the last stage, as ever)."""
    return SERVING_TARGET if has_stage(dockerfile_text, TRAIN_TARGET) else None


def split_keys(cell: CellSpec, keys: dict[str, kernelcache.KernelKey]
               ) -> tuple[dict[str, kernelcache.KernelKey], dict[str, kernelcache.KernelKey]]:
    """(the serving image's kernel keys, the training-only ones), by the kernels' profile in
    matrix.yaml (CellSpec.train_kernels)."""
    train = {k.name for k in cell.train_kernels}
    return ({n: k for n, k in keys.items() if n not in train},
            {n: k for n, k in keys.items() if n in train})


@dataclass
class CellResult:
    cell_id: str
    status: str  # pass | fail | skip
    image_id: str | None = None
    reused: bool = False  # nothing to do: same inputs, image present
    duration_s: float = 0.0
    log: Path | None = None
    reason: str | None = None
    command: str | None = None
    log_tail: str | None = None
    error_lines: list[str] = field(default_factory=list)  # the log's first error lines
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)

    def summary(self) -> str:
        if self.status == "pass":
            how = "unchanged, reused" if self.reused else f"built in {self.duration_s:.0f} s"
            return (f"{self.cell_id}: pass ({how}) {self.image_id and self.image_id[:19]}"
                    + "".join(f"\n  kernel {name} (cache {k.get('cache')}): compiled in "
                              f"{kernelcache.describe_stats(k['compile'])}"
                              for name, k in self.kernels.items() if k.get("compile")))
        text = f"{self.cell_id}: {self.status}: {self.reason}"
        if self.command:
            text += f"\n  command: {self.command}"
        if self.log:
            text += f"\n  log: {self.log}"
        if self.error_lines:
            text += "\n  first errors:\n" + "\n".join("    " + ln for ln in self.error_lines)
        if self.log_tail:
            text += "\n  last lines:\n" + "\n".join("    " + ln for ln in
                                                    self.log_tail.splitlines())
        return text


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

def cell_dir(ctx: Context, cell_id: str) -> Path:
    return ctx.cell_dir(cell_id).resolve()


def kernel_stages(dockerfile_text: str) -> list[str]:
    """Names of the `kernel-<name>` stages of a rendered Dockerfile, in order."""
    return _KERNEL_STAGE.findall(dockerfile_text)


def stage_text(dockerfile_text: str, stage: str) -> str:
    """The lines of one stage (from its FROM to the next FROM)."""
    blocks = re.split(r"(?im)^(?=\s*FROM\s)", dockerfile_text)
    for block in blocks:
        if re.match(rf"(?i)\s*FROM\s+\S+\s+AS\s+{re.escape(stage)}\s*$", block.splitlines()[0]
                    if block.strip() else ""):
            return block
    return ""


def context_hash(directory: Path) -> str:
    """Hash of every file of a build context: relative path, mode, content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory).as_posix()
        digest.update(f"{relative}\0{path.stat().st_mode & 0o111:o}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def input_hash(directory: Path, build_args: dict[str, str],
               kernel_keys: dict[str, kernelcache.KernelKey],
               bases: dict[str, dict[str, Any]] | None = None) -> str:
    """The cell's input hash; `bases` (base_images): the image id each FROM reference names
    in the engine that builds it, so a base rebuilt under the same tag changes the hash."""
    digest = hashlib.sha256(context_hash(directory).encode())
    for key, value in sorted(build_args.items()):
        if key not in SPEED_ONLY_ARGS:
            digest.update(f"arg {key}={value}\n".encode())
    for name, kernel_key in sorted(kernel_keys.items()):
        digest.update(f"kernel {name}={kernel_key.slug}\n".encode())
    for ref, base in sorted((bases or {}).items()):
        digest.update(f"base {ref}={base.get('id') or 'absent'}\n".encode())
    return "sha256:" + digest.hexdigest()


def base_images(dockerfile_text: str, docker: Engine) -> dict[str, dict[str, Any]]:
    """FROM reference -> {"id", "digest"} of the image `docker` holds under it now (None
    where it holds none: BuildKit pulls it): what the build is made from, recorded in the
    journal (the provenance names it) and part of the input hash."""
    found: dict[str, dict[str, Any]] = {}
    for ref in base_refs(dockerfile_text):
        info = docker.inspect_image(ref) or {}
        repository = ref.split("@", 1)[0].rsplit(":", 1)[0] if "/" in ref or ":" in ref else ref
        digests = [d.split("@", 1)[1] for d in info.get("RepoDigests") or []
                   if d.split("@", 1)[0] == repository]
        found[ref] = {"id": info.get("Id"), "digest": digests[0] if digests else None}
    return found


def kernel_keys_for(ctx: Context, cell: CellSpec, dockerfile_text: str
                    ) -> dict[str, kernelcache.KernelKey]:
    """The cache key of every kernel stage in the cell's Dockerfile: computed once per run for
    a cell and Dockerfile text (the compile plan and the build both need them)."""
    text_digest = hashlib.sha256(dockerfile_text.encode("utf-8")).hexdigest()
    inputs = (cell.id, text_digest, cell.python, cell.platform,
              repr(cell.kernels))  # everything the keys are made from
    return ctx.once(("kernel-keys", *inputs),
                    lambda: _compute_kernel_keys(ctx, cell, dockerfile_text))


def _compute_kernel_keys(ctx: Context, cell: CellSpec, dockerfile_text: str
                         ) -> dict[str, kernelcache.KernelKey]:
    specs = ctx.matrix.build.get("kernels", {})
    resolved = {k.name: k.version for k in cell.kernels}
    keys = {}
    for name in kernel_stages(dockerfile_text):
        if name not in specs:
            raise StageFailure(f"{cell.id}: Dockerfile stage kernel-{name} names no "
                               "build.kernels entry in matrix.yaml")
        keys[name] = kernelcache.make_key(
            specs[name], torch=cell.cell.torch, cuda=cell.cell.cuda, python=cell.python,
            archs=[cell.cell.arch], source_root=ctx.root,
            resolved_version=resolved.get(name),
            stage_text=stage_text(dockerfile_text, f"kernel-{name}"),
            platform=cell.platform)
    return keys


def build_platform(cell: CellSpec, docker: Engine) -> str | None:
    """`--platform` for a cell whose image is for another CPU than the engine's (sm_121 cells
    are linux/arm64: GB10 machines are Arm); None builds for the engine's own platform.
    Building for another CPU needs an engine that can run it (binfmt/QEMU or an Arm builder)."""
    return cell.platform if cell.platform != docker.platform() else None


def secrets_for(options: RunOptions) -> dict[str, Path]:
    import os

    bundle = options.ca_bundle or Path(os.environ.get("SSL_CERT_FILE") or DEFAULT_CA_BUNDLE)
    secrets: dict[str, Path] = {}
    if bundle.is_file():
        secrets.setdefault("ca_bundle", bundle)
    return secrets


# --------------------------------------------------------------------------------------------
# Kernel compiles under emulation (linux/arm64 cells on an x86_64 host)
# --------------------------------------------------------------------------------------------

def native_compile_seconds(ctx: Context, name: str, key: kernelcache.KernelKey
                           ) -> tuple[float, str] | None:
    """(seconds, where the figure comes from) a compile of `key` takes natively on this host:
    the slowest measured compile of the same package in the kernel cache, else
    build.kernels.<name>.estimate_minutes. None: nothing to go by."""
    measured = []
    for entry_json in ctx.state.kernels.glob(f"*/{kernelcache.ENTRY_FILE}"):
        try:
            meta = json.loads(entry_json.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        other = meta.get("key", {})
        seconds = (meta.get("details", {}).get("stats") or {}).get("seconds")
        # Another arch of the same package costs about the same (one target per compile).
        if (seconds and other.get("package") == key.package
                and other.get("platform", "linux/amd64") == engine.host_platform()):
            where = ("measured on another machine, from the registry"
                     if meta["details"].get("source") == kernelregistry.SOURCE else "measured here")
            measured.append((float(seconds), f"{where} ({other.get('slug')})"))
    if measured:
        return max(measured)
    minutes = ctx.matrix.build.get("kernels", {}).get(name, {}).get("estimate_minutes")
    if minutes:
        return float(minutes) * 60, f"build.kernels.{name}.estimate_minutes"
    return None


def emulated_compile_refusal(ctx: Context, keys: dict[str, kernelcache.KernelKey],
                             platform: str | None) -> str | None:
    """Why the cell is not built, when it would compile a kernel under emulation (QEMU) for
    longer than build.emulation.max_compile_minutes; said before starting, with the estimate
    and the alternatives. None: nothing to compile under emulation, or it is short enough."""
    if not platform:
        return None
    settings = ctx.matrix.build.get("emulation", {})
    slowdown = float(settings.get("slowdown", 10.0))
    limit_min = float(settings.get("max_compile_minutes", 60))
    too_long = []
    for name, key in keys.items():
        if kernelcache.lookup(ctx.state, key) is not None:
            continue  # in the cache: nothing to compile
        native = native_compile_seconds(ctx, name, key)
        if native is None:
            continue
        emulated_min = native[0] * slowdown / 60
        if emulated_min > limit_min:
            too_long.append(f"{name} ~{emulated_min / 60:.1f} h ({native[0] / 60:.0f} min "
                            f"natively, {native[1]}, x{slowdown:g} under QEMU)")
    if not too_long:
        return None
    return (f"compiling {', '.join(too_long)} for {platform} under emulation exceeds "
            f"build.emulation.max_compile_minutes={limit_min:g}; build it on a native "
            f"{platform} builder (an Arm host or the GB10 itself: DOCKER_HOST=ssh://... or "
            f"`docker buildx create --driver remote tcp://ARM-HOST:1234`), put its wheel in the "
            f"kernel cache, or raise the limit")


# --------------------------------------------------------------------------------------------
# The compile plan for this run
# --------------------------------------------------------------------------------------------

def compile_plan_for(ctx: Context, kernels_needed: list[list[Any]], options: RunOptions,
                     reading: compileplan.HostReading | None = None,
                     builder: Any = None) -> compileplan.CompilePlan:
    """Size MAX_JOBS/NVCC_THREADS for the kernels the selected cells compile.

    `kernels_needed`: per cell, the kernel cache keys (or bare `build.kernels` names) to
    compile; a key's earlier build, recorded in the state directory, sets its figure.
    `builder` (builders.Builder): plan from that engine's own CPUs and memory instead.
    """
    settings = ctx.matrix.build
    needs = [kernel_need(settings.get("kernels", {}), item)
             for cell in kernels_needed for item in cell]
    shared = plan_options(ctx, options, kernels_needed)
    if builder is not None:
        return compileplan.plan_for_needs(
            builder.facts.memory, max(1, builder.facts.cpus), needs,
            memory_source=f"builder {builder.name}: docker info MemTotal", **shared)
    return compileplan.plan_from_reading(reading or compileplan.read_host(), needs, **shared)


def plan_options(ctx: Context, options: RunOptions, kernels_needed: list[list[Any]]
                 ) -> dict[str, Any]:
    """What a compile plan takes besides the machine: the builds recorded in the state
    directory, the matrix's build settings and the run's job flags."""
    settings = ctx.matrix.build
    return {"history": compileplan.read_history(compileplan.history_path(ctx.state.root)),
            "safety_margin_gb": float(settings.get("safety_margin_gb", 2.0)),
            "max_parallel_cells": int(settings.get("max_parallel_cells", 1)),
            "cells_to_compile": max(1, sum(1 for cell in kernels_needed if cell)),
            "max_jobs": options.max_jobs, "nvcc_threads": options.nvcc_threads}


def kernel_need(specs: dict[str, dict[str, Any]], item: Any) -> compileplan.Need:
    """The memory model's key for a kernel cache key, or for a bare build.kernels name."""
    if isinstance(item, kernelcache.KernelKey):
        legacy = next((s.get("gb_per_nvcc_thread") for s in specs.values()
                       if s.get("package") == item.package), None)
        return compileplan.Need(item.package, item.version, item.cuda, len(item.archs), legacy)
    spec = specs.get(item, {"package": item})
    version = str(spec.get("version", "")) or None
    return compileplan.Need(spec["package"], version if version != "match-engine" else None,
                            legacy_gb=spec.get("gb_per_nvcc_thread"))


# --------------------------------------------------------------------------------------------
# One cell
# --------------------------------------------------------------------------------------------

class _Deadline:
    def __init__(self, seconds: float | None) -> None:
        self.end = None if seconds is None else time.monotonic() + seconds
        self.seconds = seconds

    def remaining(self) -> float | None:
        if self.end is None:
            return None
        left = self.end - time.monotonic()
        if left <= 0:
            raise StageFailure(f"per-cell timeout of {self.seconds:.0f} s reached")
        return left

    @classmethod
    def for_cell(cls, ctx: Context, options: RunOptions) -> _Deadline:
        """The per-cell timeout: --timeout-min, else build.timeout_minutes (180)."""
        return cls((options.timeout_min or float(ctx.matrix.build.get("timeout_minutes", 180)))
                   * 60)


@dataclass(frozen=True)
class CellBuild:
    """What the Docker builds of one cell share (its kernel stages, then its image): the cell's
    directory, build args and secrets, its log, its deadline, the engine and the platform."""

    ctx: Context
    cell_id: str
    directory: Path
    build_args: dict[str, str]
    secrets: dict[str, Path]
    log_path: Path
    deadline: _Deadline
    echo: Callable[[str], None]
    docker: Engine
    no_cache: bool = False
    platform: str | None = None
    compile: compileplan.CompilePlan | None = None

    def say(self, line: str) -> None:
        """A line on screen and in the cell's build log."""
        self.echo(f"{self.cell_id}: {line}")
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"# {line}\n")

    def build_image(self, wheels: dict[str, list[kernelcache.CachedKernel]], *, tag: str,
                    target: str | None, digest: str, what: str) -> str:
        """Build `target` from a temporary copy of the cell's directory, the cached kernel
        wheels staged into it (folder -> entries); the image id."""
        with tempfile.TemporaryDirectory(prefix=f"context-{self.cell_id}-",
                                         dir=_tmp_root(self.ctx)) as tmp:
            context = Path(tmp) / "context"
            shutil.copytree(self.directory, context, symlinks=True)
            for folder, entries in wheels.items():
                kernelcache.stage_into(entries, context / folder)
            with watch.Heartbeat(f"{self.cell_id}: {what}", self.echo) as beat:
                return self.docker.build_image(engine.BuildRequest(
                    context, tag=tag, target=target, build_args=self.build_args,
                    secrets=self.secrets, labels={INPUT_HASH_LABEL: digest},
                    no_cache=self.no_cache, platform=self.platform),
                    self.log_path, self.deadline.remaining(), beat.on_line)


def _unchanged(ctx: Context, cell_id: str, digest: str, docker: Engine) -> str | None:
    """The image id when the journal says this exact input was built and the image is there."""
    record = journal.cell_record(ctx.state, cell_id)
    if record.input_hash != digest or record.status_of("build") != journal.Status.PASS:
        return None
    image_id = record.image_id
    if not image_id or not docker.image_exists(image_id):
        return None
    if docker.image_id_of(local_ref(cell_id)) != image_id:
        docker.tag_image(image_id, local_ref(cell_id))
    return image_id


def _ensure_kernels(job: CellBuild, keys: dict[str, kernelcache.KernelKey],
                    shared: dict[str, dict[str, Any]] | None = None
                    ) -> tuple[list[kernelcache.CachedKernel], dict[str, dict[str, Any]]]:
    """Compile the kernels missing from the cache; return the cell's entries and a report.
    `shared`: the registry notes of `_take_shared_kernels`, by kernel name."""
    entries, report = [], {}
    shared = shared or {}
    for name, key in keys.items():
        with _key_lock(key.slug):
            entry, cache, started = _compile_or_reuse(job, name, key)
        entries.append(entry)
        note = dict(shared.get(name) or {})
        if cache == "miss":
            note.update(_push_compiled(job.ctx, entry, job.say))
        taken = "pulled" in note
        report[name] = {"key": key.slug, "cache": kernelregistry.SOURCE if taken else cache,
                        "source": _KERNEL_SOURCE[kernelregistry.SOURCE if taken else cache],
                        "wheels": [w.name for w in entry.wheels],
                        # the width it compiled at (CompileGate), None for a registry's wheel
                        "max_jobs": None if taken else _int_or_none(entry.details.get("MAX_JOBS")),
                        "duration_s": round(time.monotonic() - started, 3),
                        # the compile's own figures (measure), also on a hit: when it was
                        # built; none for a wheel another machine compiled (in `registry`)
                        "compile": {} if taken else entry.details.get("stats") or {},
                        **({"registry": note} if note else {})}
    return entries, report


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# Where a cell's kernel wheel came from, by its `cache` value.
_KERNEL_SOURCE = {"hit": "local", "miss": "compiled", kernelregistry.SOURCE: "registry"}


def _take_shared_kernels(job: CellBuild, keys: dict[str, kernelcache.KernelKey]
                         ) -> dict[str, dict[str, Any]]:
    """Pull from `build.kernel_cache`'s registry each kernel the local cache lacks, into the
    local cache (before the emulation check: a wheel compiled elsewhere is no compile here).
    The registry notes by kernel name; empty when no registry is configured."""
    shared = kernelregistry.shared_cache(job.ctx.matrix)
    if shared is None:
        return {}
    notes = {}
    for name, key in keys.items():
        with _key_lock(key.slug):
            if kernelcache.lookup(job.ctx.state, key) is None:
                _, notes[name] = kernelregistry.pull(job.ctx.state, shared, key,
                                                     _tmp_root(job.ctx), job.say)
    return notes


def _push_compiled(ctx: Context, entry: kernelcache.CachedKernel, say: Callable[[str], None]
                   ) -> dict[str, Any]:
    """Push a kernel this build compiled to `build.kernel_cache`'s registry, if any."""
    shared = kernelregistry.shared_cache(ctx.matrix)
    if shared:
        from ..engine import cosign
        cosign.use_state_dir(ctx.state.root)  # cosign's registry credentials: <state>/secrets
    return kernelregistry.push(shared, entry, say) if shared else {}


_KEY_LOCKS: dict[str, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()


def _key_lock(slug: str) -> threading.Lock:
    """Cells building in parallel with one kernel key compile it once; the other waits."""
    with _KEY_LOCKS_GUARD:
        return _KEY_LOCKS.setdefault(slug, threading.Lock())


def _compile_or_reuse(job: CellBuild, name: str, key: kernelcache.KernelKey
                      ) -> tuple[kernelcache.CachedKernel, str, float]:
    """(the cache entry, "hit" or "miss", when the work started). A compile starts with the
    width the engine's other compiles under way leave, or waits for one to end (CompileGate)."""
    ctx, cell_id, echo, build_args = job.ctx, job.cell_id, job.echo, job.build_args
    entry = kernelcache.lookup(ctx.state, key)
    started = time.monotonic()
    if entry is None and job.compile is not None:
        gate = gate_for(job.compile)
        jobs = gate.acquire(compile_prior(ctx, key, build_args).files,
                            lambda line: echo(f"{cell_id}: kernel {name}: {line}"))
        try:
            return _compile_or_reuse(replace(job, compile=None, build_args={
                **build_args, "MAX_JOBS": str(jobs)}), name, key)
        finally:
            gate.release(jobs)
    if entry is None:
        prior = compile_prior(ctx, key, build_args)
        echo(f"{cell_id}: compiling kernel {name} ({key.slug}) at MAX_JOBS="
             f"{build_args.get('MAX_JOBS', '?')}; "
             + (f"expected {compileprogress.clock(prior.total_s)} ({prior.origin})"
                if prior.total_s else "no earlier compile to time it by"))
        with tempfile.TemporaryDirectory(prefix=f"kernel-{name}-",
                                         dir=_tmp_root(ctx)) as out:
            with compileplan.JobSampler(scope=name) as sampler, \
                    watch.CompileWatch(f"{cell_id}: {name}", prior, echo) as shown:
                job.docker.build_image(engine.BuildRequest(
                    job.directory, target=f"kernel-{name}", build_args=build_args,
                    secrets=job.secrets, output_dir=Path(out), no_cache=job.no_cache,
                    platform=job.platform),
                    job.log_path, job.deadline.remaining(), shown.on_line)
            wheels = kernelcache.find_wheels(Path(out))
            if not wheels:
                raise KernelStageEmpty(f"stage kernel-{name} left no wheel in /wheels/")
            # per job and per file, for the planner and the next compile's ETA
            sampled = _record_compile(ctx, key, sampler, build_args, shown.progress)
            stats = kernelcache.read_build_stats(Path(out)).get(name, {})  # the RUN's own figure
            if stats:
                echo(f"{cell_id}: kernel {name} compiled: {kernelcache.describe_stats(stats)}")
            entry = kernelcache.store(ctx.state, key, wheels,
                                      details={"compiled_by": cell_id,
                                               "builder": _builder_name(job.docker),
                                               **build_args,
                                               "compile_stats": sampled, "stats": stats})
        cache = "miss"
    else:
        echo(f"{cell_id}: kernel {name} from the cache ({key.slug})")
        cache = "hit"
    return entry, cache, started


class CompileGate:
    """The kernel compiles under way under one compile plan (one engine): each starts with the
    jobs the others leave (compileplan.jobs_for_next_compile) and gives them back as it ends,
    so a compile that starts after another ended or failed gets its cores (issue 47)."""

    def __init__(self, plan: compileplan.CompilePlan) -> None:
        self.plan = plan
        self._changed = threading.Condition()
        self.jobs = 0
        self.override = plan.max_jobs if any(o.startswith("MAX_JOBS") for o in plan.overrides) \
            else None

    def next_jobs(self, useful: int | None) -> int:
        """The width a compile would start with now (0: it waits); the caller holds the lock."""
        return compileplan.jobs_for_next_compile(
            self.plan.cpus, self.plan.usable_gb, self.plan.job_gib, self.jobs,
            self.jobs * self.plan.job_gib, useful, self.override)

    def acquire(self, useful: int | None, say: Callable[[str], None]) -> int:
        with self._changed:
            jobs = self.next_jobs(useful)
            if not jobs:
                say(f"waiting for the compile(s) under way ({self.jobs} job(s) of "
                    f"{self.plan.cpus} CPU(s)) to end, to start at their width")
            while not jobs:
                _stop_if_interrupted()
                self._changed.wait(1.0)
                jobs = self.next_jobs(useful)
            self.jobs += jobs
            return jobs

    def release(self, jobs: int) -> None:
        with self._changed:
            self.jobs -= jobs
            self._changed.notify_all()


_GATES: dict[int, CompileGate] = {}
_GATES_GUARD = threading.Lock()


def gate_for(plan: compileplan.CompilePlan) -> CompileGate:
    """The one gate of a compile plan (the run's, or a builder's)."""
    with _GATES_GUARD:
        gate = _GATES.get(id(plan))
        if gate is None or gate.plan is not plan:
            gate = _GATES[id(plan)] = CompileGate(plan)
        return gate


def _builder_name(docker: Engine) -> str | None:
    endpoint = docker.endpoint
    return endpoint.name if endpoint else None


def compile_prior(ctx: Context, key: kernelcache.KernelKey,
                  build_args: dict[str, str]) -> compileprogress.Prior:
    """What the ETA of this compile starts from: this state's last compile of the key, or the
    compile model's measurement."""
    return compileprogress.prior_for(
        key.slug, key.package, key.version, key.cuda, int(build_args.get("MAX_JOBS", 1) or 1),
        compileplan.read_history(compileplan.history_path(ctx.state.root)),
        compileplan.load_model())


def _record_compile(ctx: Context, key: kernelcache.KernelKey,
                    sampler: compileplan.JobSampler, build_args: dict[str, str],
                    progress: compileprogress.CompileProgress | None = None) -> dict[str, Any]:
    """Append the compile's measured peak, wall time and seconds per file to the planner's
    history (the next plan for the same package, version, CUDA and targets uses the peak, the
    next compile of the key its file times for the ETA). A compile whose jobs the sampler never
    saw (too short, or a builder on another host) records no peak, only its file times."""
    stats = sampler.stats()
    if progress is not None and progress.total:
        stats["files"] = progress.total
        stats["unit_seconds"] = dict(progress.unit_seconds)
    if stats["job_peak_max_gib"] > 0 or stats.get("unit_seconds"):  # the planner skips no-peak
        compileplan.record_build(compileplan.history_path(ctx.state.root),
                                 kernel_need({}, key), stats, key=key.slug,
                                 max_jobs=int(build_args.get("MAX_JOBS", 0)),
                                 nvcc_threads=int(build_args.get("NVCC_THREADS", 0)))
    return stats


def _tmp_root(ctx: Context) -> Path:
    path = ctx.state.root / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


LOCK_LABEL = re.compile(r'io\.infermatrix\.lock="([^"]*)"')


# one GPU cell: a 10-12 GiB image, its uv cache mount, the unpack (GB10: more)
DEFAULT_MIN_FREE_GIB = 40.0
GIB = 2**30
PRUNE_SLACK_GIB = 1.0  # what --keep-storage's accounting (shared records) may miss


def free_gib(path: Path) -> float:
    return shutil.disk_usage(path).free / GIB


def lru_keep_bytes(cache_bytes: int, free: float, need: float) -> int | None:
    """How much BuildKit's cache may keep so that `need` GiB are free, pruning the least
    recently used records first; None when all of it must go (or it holds too little)."""
    deficit = int((need - free + PRUNE_SLACK_GIB) * GIB)
    keep = cache_bytes - deficit
    return keep if keep > 0 else None


def _stop_if_interrupted() -> None:
    """A worker waiting for its turn gives up once the run is interrupted (proc.STOPPING)."""
    if proc.STOPPING.is_set():
        raise StageFailure("the run was interrupted while this cell waited for its turn")


class RunningBuilds:
    """The builds of this run under way, by the Docker data root they fill (issue 47): a cell
    short of disk waits for them, as they may hold the space it lacks, instead of failing."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running: dict[str, set[str]] = {}

    def start(self, root: Path | None, cell_id: str) -> None:
        with self._changed:
            self._running.setdefault(str(root), set()).add(cell_id)

    def end(self, root: Path | None, cell_id: str) -> None:
        with self._changed:
            self._running.get(str(root), set()).discard(cell_id)
            self._changed.notify_all()

    def others(self, root: Path | None, cell_id: str) -> list[str]:
        """The other cells of the run building on the same data root, sorted."""
        with self._changed:
            return sorted(self._running.get(str(root), set()) - {cell_id})

    def wait_for_one_of(self, root: Path | None, cells: list[str],
                        timeout: float | None = None) -> bool:
        """Block until one of `cells` has ended; False when `timeout` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while set(cells) <= self._running.get(str(root), set()):
                _stop_if_interrupted()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(1.0 if left is None else min(left, 1.0))
            return True

    def holding(self, root: Path | None, cell_id: str) -> "_Holding":
        return _Holding(self, root, cell_id)


@dataclass
class _Holding:
    running: RunningBuilds
    root: Path | None
    cell_id: str

    def __enter__(self) -> None:
        self.running.start(self.root, self.cell_id)

    def __exit__(self, *exc: object) -> None:
        self.running.end(self.root, self.cell_id)


RUNNING = RunningBuilds()  # the builds of this process's run


def space_decision(free: float, need: float, holders: list[str]) -> str:
    """`go` when the space is there, `wait` when the run's own builds under way may free it
    (they end, their cache is pruned), `fail` when nothing the run holds would."""
    if free >= need:
        return "go"
    return "wait" if holders else "fail"


def disk_refusal(ctx: Context, cell_id: str, log_path: Path,
                 echo: Callable[[str], None], docker: Engine,
                 running: RunningBuilds | None = None) -> str | None:
    """Why the cell is not started for want of disk, or None. A build that fills the disk fails
    mid-way after minutes or hours; this one is refused before it starts, after pruning
    BuildKit's unused cache when build.disk.prune_when_low allows it (the default): first only
    the least recently used records, as much as the cell lacks (the uv cache mount and the
    shared toolchain layers the next cell reuses stay), then, if that was not enough, all.
    Still short while other builds of this run are under way on the same engine: it waits for
    one of them to end and tries again (their space and cache may be freed), and is refused
    only when none is left (issue 47)."""
    running = running or RUNNING
    root = docker.local_data_root()
    while True:
        free, need, cache_problem = _free_after_prune(ctx, cell_id, log_path, echo, docker)
        holders = running.others(root, cell_id)
        decision = space_decision(free, need, holders)
        if decision == "go":
            return None
        if decision == "fail" and cache_problem:
            return (f"not started: {free:.1f} GiB free under Docker's data root {root} "
                    f"(statvfs), the cell needs {need:g} GiB (build.disk.min_free_gib), and no "
                    f"other build of this run holds space; `docker system df` failed "
                    f"({cache_problem}); {DANGLING_CACHE_FIX.format(root=root)}")
        if decision == "fail":
            return (f"not started: {free:.1f} GiB free under Docker's data root {root}, the "
                    f"cell needs {need:g} GiB (build.disk.min_free_gib), and no other build of "
                    "this run holds space; free space (`docker image prune`, `docker builder "
                    "prune --all`) then rerun")
        echo(f"  {cell_id}: {free:.1f} GiB free, the cell needs {need:g} GiB: waiting for the "
             f"run's own build(s) under way ({', '.join(holders)}) to end, then again")
        with log_path.open("a", encoding="utf-8") as log:
            log.write(f"# short of disk: waiting for {', '.join(holders)} to end\n")
        try:
            running.wait_for_one_of(root, holders)
        except StageFailure as exc:  # the run was interrupted meanwhile
            return str(exc)


def _free_after_prune(ctx: Context, cell_id: str, log_path: Path,
                      echo: Callable[[str], None], docker: Engine
                      ) -> tuple[float, float, str | None]:
    """(GiB free, GiB needed, why the build cache could not be measured) under the engine's
    data root, after pruning when short and allowed; (0, 0, None) when there is nothing to
    check (a remote engine, no minimum)."""
    settings = ctx.matrix.build.get("disk") or {}
    need = float(settings.get("min_free_gib", DEFAULT_MIN_FREE_GIB))
    root = docker.local_data_root()
    if root is None or need <= 0:
        return 0.0, 0.0, None  # a remote engine: its disk is not visible from here
    free = free_gib(root)
    if free >= need:
        return free, need, None
    cache_problem = None
    if settings.get("prune_when_low", True):
        try:
            keep = lru_keep_bytes(docker.build_cache_bytes(), free, need)
        except (EngineError, CommandFailed) as exc:
            # the cache's size is unknown, so the prune below is the whole unused cache at once
            cache_problem = _unmeasured_cache(exc, cell_id, free, need, root, log_path, echo)
            keep = None
        for step in ([keep] if keep is not None else []) + [None]:
            what = ("the least recently used build cache, keeping "
                    f"{step / GIB:.1f} GiB (docker builder prune --all --keep-storage)"
                    if step is not None else
                    "BuildKit's unused cache (docker builder prune --all --force)")
            echo(f"  {cell_id}: {free:.1f} GiB free under {root}, the cell needs {need:g} GiB: "
                 f"pruning {what}")
            with log_path.open("a", encoding="utf-8") as log:
                log.write(f"# {free:.1f} GiB free under {root} < build.disk.min_free_gib "
                          f"{need:g}: pruning {what}\n")
            try:
                docker.prune_build_cache(log_path, step)
            except (EngineError, CommandFailed) as exc:
                if cache_problem is None:
                    raise
                echo(f"  {cell_id}: the prune failed too ({str(exc).splitlines()[0]})")
            free = free_gib(root)
            if free >= need:
                break
    return free, need, cache_problem


def _unmeasured_cache(exc: Exception, cell_id: str, free: float, need: float, root: Path,
                      log_path: Path, echo: Callable[[str], None]) -> str:
    """Say that the build cache could not be measured, and what to do; the problem's first
    line. Issue 48: a dangling build-cache record (an engine stopped mid-build) makes `docker
    system df` answer 500, which stopped every build here; the free space is the data root's
    filesystem's, read without it."""
    problem = str(exc).splitlines()[0]
    found = (f"`docker system df` failed ({problem}); {free:.1f} GiB free under {root} "
             f"(statvfs of the data root's filesystem), the cell needs {need:g} GiB: the build "
             "cache's size is unknown, so its least recently used part cannot be chosen")
    echo(f"  {cell_id}: {found}")
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"# {found}\n# what to do: {DANGLING_CACHE_FIX.format(root=root)}\n")
    return problem


# What a dangling build-cache record needs (`docker builder prune -af` did not clear it).
DANGLING_CACHE_FIX = (
    "the engine's build cache holds a record whose snapshot is gone (an engine stopped "
    "mid-build leaves it; `docker builder prune -af` may not clear it): restart the Docker "
    "engine (`systemctl restart docker`); if `docker system df` still fails, stop the engine "
    "and remove {root}/buildkit (BuildKit's cache only), then start it")


def lock_problem(ctx: Context, cell: CellSpec, dockerfile_text: str) -> str | None:
    """Why the cell may not be built (no committed lock, or a render of another lock), or None."""
    cell_id = cell.id
    try:
        path = locks.require_lock(ctx, cell_id)
    except StageFailure as exc:
        return str(exc)
    digest = locks.lock_digest(cell.lock_text or "")
    rendered = LOCK_LABEL.search(dockerfile_text)
    if rendered is None or rendered.group(1) != digest:
        found = rendered.group(1) if rendered else "no io.infermatrix.lock label"
        return (f"{cell_id}: images/{cell_id}/Dockerfile was rendered from another lock ({found}; "
                f"{path.name} is {digest}); run `infermatrix render --select {cell_id}`")
    return None


def _build_inputs(ctx: Context, cell: CellSpec, directory: Path,
                  compile: compileplan.CompilePlan, options: RunOptions
                  ) -> tuple[str, dict[str, str], dict[str, kernelcache.KernelKey]]:
    """The cell's Dockerfile text, its build args and its serving image's kernel keys (the
    training-only ones are the train step's). StageFailure: why it cannot be built (not
    rendered, no lock or another one, a kernel stage naming no kernel, no lock version)."""
    dockerfile = directory / "Dockerfile"
    if not dockerfile.is_file():
        raise StageFailure(f"not rendered: {dockerfile} is missing (run `infermatrix render` "
                           "first)")
    text = dockerfile.read_text(encoding="utf-8")
    problem = lock_problem(ctx, cell, text)
    if problem:
        raise StageFailure(problem)
    build_args = compile.build_args()
    if options.compile_nonce:
        build_args[COMPILE_NONCE_ARG] = options.compile_nonce
    try:
        keys = split_keys(cell, kernel_keys_for(ctx, cell, text))[0]
    except (InfermatrixError, ValueError) as exc:
        raise StageFailure(str(exc)) from exc
    return text, build_args, keys


def build_cell(ctx: Context, cell: CellSpec, compile: compileplan.CompilePlan,
               options: RunOptions, docker: Engine, builder: dict[str, Any] | None = None,
               echo: Echo = print) -> CellResult:
    """Build one cell on `docker`; `builder`: its identity (several builders), kept in the
    journal with the result."""
    cell_id = cell.id
    who: dict[str, Any] = {"builder": builder} if builder else {}
    directory = cell_dir(ctx, cell_id)
    log_path = ctx.state.cell_log(cell_id, "build")
    try:
        text, build_args, keys = _build_inputs(ctx, cell, directory, compile, options)
    except StageFailure as exc:
        return _record_failure(ctx, CellResult(cell_id, "fail", reason=str(exc)))
    bases = base_images(text, docker)  # the base this build is made from, in its engine
    digest = input_hash(directory, {**build_args, "platform": cell.platform}, keys, bases)
    if not options.force:
        image_id = _unchanged(ctx, cell_id, digest, docker)
        if image_id:
            # What the build that made this image recorded about its kernels (cache hit/miss).
            return CellResult(cell_id, "pass", image_id=image_id, reused=True,
                              kernels=journal.cell_record(ctx.state, cell_id).build.kernels)

    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(f"# infermatrix build {cell_id}\n# {compile.describe()}\n"
                        f"# the image is built from a temporary copy of {directory} whose "
                        f"{KERNEL_WHEELS_DIR}/ holds the cached kernel wheels\n")
    journal.record_stage(ctx.state, cell_id, "build", journal.Status.RUNNING, log=log_path,
                         details={"input_hash": digest, **who}, **who)
    job = CellBuild(ctx, cell_id, directory, build_args, secrets_for(options), log_path,
                    _Deadline.for_cell(ctx, options), echo, docker, options.no_cache,
                    build_platform(cell, docker), compile)
    kernels: dict[str, dict[str, Any]] = {}
    short = disk_refusal(ctx, cell_id, log_path, echo, docker)
    if short:  # a failure of this run (exit 1), before anything started: nothing to lose
        return _record_failure(ctx, CellResult(cell_id, "fail", log=log_path, reason=short),
                               digest=digest, builder=builder)
    # while it builds, a cell short of disk waits for it (disk_refusal)
    with RUNNING.holding(docker.local_data_root(), cell_id):
        shared = _take_shared_kernels(job, keys)
        refusal = emulated_compile_refusal(ctx, keys, job.platform)
        if refusal:
            journal.record_stage(ctx.state, cell_id, "build", journal.Status.SKIP,
                                 log=log_path, reason=refusal, details={"input_hash": digest})
            return CellResult(cell_id, "skip", reason=refusal)
        try:
            entries, kernels = _ensure_kernels(job, keys, shared)
            image_id = job.build_image({KERNEL_WHEELS_DIR: entries}, tag=local_ref(cell_id),
                                       target=serving_target(text), digest=digest,
                                       what="image build")
        except InfermatrixError as exc:
            failed = CellResult(cell_id, "fail", duration_s=time.monotonic() - started,
                                log=log_path, kernels=kernels, **_failure_of(exc, ctx, log_path))
            return _record_failure(ctx, failed, digest=digest, builder=builder)
        duration = time.monotonic() - started
        details = {"input_hash": digest, "tag": local_ref(cell_id), "kernels": kernels,
                   "compile_plan": compile.as_dict(), "build_args": build_args,
                   "secret_ids": sorted(job.secrets), "base_images": bases, **who}
        journal.record_stage(ctx.state, cell_id, "build", journal.Status.PASS,
                             duration_s=duration, log=log_path, details=details,
                             input_hash=digest, image_id=image_id, **who)
        return CellResult(cell_id, "pass", image_id=image_id, duration_s=duration,
                          log=log_path, kernels=kernels)


def _failure_of(exc: InfermatrixError, ctx: Context, log_path: Path) -> dict[str, Any]:
    """The reason, command and log tail of a build that raised `exc`: a command's exit or
    timeout (a full disk said), else the error itself and the log's tail."""
    if not isinstance(exc, CommandFailed):
        return {"reason": str(exc), "log_tail": proc.tail(_read_log(log_path))}
    reason = "timed out" if exc.returncode is None else f"build exited {exc.returncode}"
    if "no space left on device" in (exc.log_tail or "").lower():
        reason += (": no space left on device (free space under Docker's data root "
                   f"and {ctx.state.root}, then rerun)")
    return {"reason": reason, "command": exc.command, "log_tail": exc.log_tail}


_ERROR_LINE = re.compile(r"(\berror\b|#error|fatal:)", re.IGNORECASE)
# BuildKit's own summary lines repeat the failing command: not the cause.
_NOT_A_CAUSE = re.compile(r"executor failed running|failed to solve|ERROR: Failed|\[end of output\]"
                          r"|error: subprocess-exited-with-error|exit code:")


def first_error_lines(log_text: str, limit: int = 8) -> list[str]:
    """The first lines of a build log that name an error (the cause, before the traceback)."""
    found: list[str] = []
    for line in log_text.splitlines():
        text = re.sub(r"^#\d+ [\d.]+\s+", "", line).strip()  # BuildKit's step/time prefix
        if _ERROR_LINE.search(text) and not _NOT_A_CAUSE.search(text) and text not in found:
            found.append(text[:300])
            if len(found) >= limit:
                break
    return found


# Printed by a RUN line (BuildKit prefixes its output with "#<step> <seconds> "), not the
# command itself, which BuildKit echoes too.
_STATED_FAILURE = re.compile(r"^(?:#\d+ [\d.]+ )?INFERMATRIX-FAIL: (.+)$", re.MULTILINE)


def stated_failure(log_text: str) -> str | None:
    """The one-line reason a template's RUN line printed (`INFERMATRIX-FAIL: ...`), if any:
    what could not be done and what to do, instead of the long log of what followed."""
    match = _STATED_FAILURE.search(log_text)
    return match.group(1).strip() if match else None


def _read_log(path: Path | None) -> str:
    if path is None or not path.is_file():
        return ""
    return path.read_text(encoding="utf-8", errors="replace")


def _record_failure(ctx: Context, failed: CellResult, *, digest: str | None = None,
                    builder: dict[str, Any] | None = None) -> CellResult:
    """Record the `failed` build (its reason, the one its log states first) in the journal;
    the result to show."""
    log_text = _read_log(failed.log)
    errors = first_error_lines(log_text)
    stated = stated_failure(log_text)
    reason = stated or failed.reason
    who: dict[str, Any] = {"builder": builder} if builder else {}
    journal.record_stage(ctx.state, failed.cell_id, "build", journal.Status.FAIL,
                         duration_s=failed.duration_s, log=failed.log, reason=reason,
                         details={"command": failed.command, "log_tail": failed.log_tail,
                                  "error_lines": errors, "kernels": failed.kernels,
                                  "input_hash": digest, **who}, **who)
    # A stated reason is the whole story on screen; the journal and the log keep the tail.
    return replace(failed, reason=reason, log_tail=None if stated else failed.log_tail,
                               error_lines=[] if stated else errors)


# --------------------------------------------------------------------------------------------
# All selected cells
# --------------------------------------------------------------------------------------------

def profile_keys(ctx: Context, cell: CellSpec, train: bool = False
                 ) -> dict[str, kernelcache.KernelKey]:
    """The kernel keys of the cell's serving image (`train`: of its training-only kernels);
    empty when it is not rendered or its keys cannot be made (build_cell reports that)."""
    dockerfile = cell_dir(ctx, cell.id) / "Dockerfile"
    if not dockerfile.is_file():
        return {}
    try:
        keys = kernel_keys_for(ctx, cell, dockerfile.read_text(encoding="utf-8"))
    except (InfermatrixError, ValueError):
        return {}
    return split_keys(cell, keys)[1 if train else 0]


def _kernels_to_compile(ctx: Context, cell: CellSpec, train: bool = False
                        ) -> list[kernelcache.KernelKey]:
    """The kernel keys of a cell's serving image (`train`: of its train target) whose wheels
    are not in the cache yet."""
    return [key for key in profile_keys(ctx, cell, train).values()
            if kernelcache.lookup(ctx.state, key) is None]


def compile_plan_for_cells(ctx: Context, cells: list[CellSpec], options: RunOptions,
                           reading: compileplan.HostReading | None = None, builder: Any = None,
                           train: bool = False) -> compileplan.CompilePlan:
    """The compile plan for the kernels the cells still have to compile: their serving
    images' (the build step), or their training-only ones (`train`: the train step)."""
    return compile_plan_for(ctx, [_kernels_to_compile(ctx, c, train) for c in cells],
                            options, reading, builder)


def build_cells(ctx: Context, cells: list[CellSpec], options: RunOptions | None = None,
                echo: Echo = print, *, docker: Engine) -> dict[str, CellResult]:
    """Build every cell of `cells` (planned cells: `ctx.specs(plans)`); hold the state lock.

    Up to `compile.parallel_cells` cells build at once (the planner caps it so that their
    compile budgets sum under the memory available); one at a time when it is 1.
    """
    options = options or RunOptions()
    results: dict[str, CellResult] = {}
    proc.STOPPING.clear()  # a new run of this process (an earlier one may have been stopped)
    from ..engine.builders import endpoints_for
    endpoints = endpoints_for(ctx.matrix, options.builders)
    if endpoints:
        with run_lock(ctx.state, wait=options.wait):
            _build_on_builders(ctx, cells, endpoints, options, results, echo, docker)
    else:
        _build_here(ctx, cells, options, results, echo, docker)
    return results


def _build_here(ctx: Context, planned: list[CellSpec], options: RunOptions,
                results: dict[str, CellResult], echo: Echo, docker: Engine) -> None:
    """Every cell on the one engine `docker` (DOCKER_HOST / the current context)."""
    compile = compile_plan_for_cells(ctx, planned, options)
    echo(compile.describe())
    echo("  each kernel compile starts with the CPUs and memory the compiles under way leave, "
         "or waits for one to end (no idle core; the memory cap holds)")
    with run_lock(ctx.state, wait=options.wait):
        if compile.parallel_cells <= 1 or len(planned) <= 1:
            _build_in_order(ctx, planned, compile, options, results, echo, docker)
        else:
            _build_in_parallel(ctx, planned, compile, options, results, echo, docker)


def _bases_then_build(ctx: Context, cell: CellSpec, builder: Any, local: Engine,
                      options: RunOptions, echo: Echo) -> CellResult:
    """The cell's base images copied from `local` to the builder, then its build there."""
    from ..engine.builders import ensure_bases

    dockerfile, identity = cell_dir(ctx, cell.id) / "Dockerfile", builder.identity()
    if dockerfile.is_file():
        log_path = ctx.state.cell_log(cell.id, "build")
        try:
            ensure_bases(builder, local, dockerfile.read_text(encoding="utf-8"), echo,
                         log_path)
        except InfermatrixError as exc:
            reason = f"copying the base image to builder {builder.name}: {exc}".splitlines()[0]
            return _record_failure(ctx, CellResult(
                cell.id, "fail", log=log_path, reason=reason, command=getattr(exc, "command", None),
                log_tail=getattr(exc, "log_tail", None)), builder=identity)
    return build_cell(ctx, cell, builder.compile, options, builder.engine, builder=identity,
                      echo=echo)


def _build_on_builders(ctx: Context, planned: list[CellSpec], endpoints: list[Any],
                       options: RunOptions, results: dict[str, CellResult], echo: Echo,
                       local: Engine) -> None:
    """One worker thread per builder, each with its engine, working through its queue
    (builders.py: who gets which cell). A builder that stops answering fails the cell it was
    building and every cell left in its queue, with the reason; the others go on."""
    from concurrent.futures import ThreadPoolExecutor

    from ..engine.builders import assign, connect
    up, down = connect(endpoints, echo)
    previous = {p.id: journal.cell_record(ctx.state, p.id).builder_name or "" for p in planned}
    for cell_id, reason in assign(planned, up, previous, down).items():
        results[cell_id] = _record_failure(ctx, CellResult(cell_id, "fail", reason=reason))
        echo(results[cell_id].summary())
    busy = [b for b in up if b.queue]
    for builder in busy:
        builder.compile = compile_plan_for_cells(ctx, builder.queue, options, builder=builder)
        echo(f"{builder.name}: {len(builder.queue)} cell(s) "
             f"({', '.join(p.id for p in builder.queue)}); {builder.compile.describe()}")
    if not busy:
        return
    with ThreadPoolExecutor(max_workers=len(busy), thread_name_prefix="infermatrix-builder") \
            as pool:
        for done in [pool.submit(_work_queue, ctx, b, local, options, echo) for b in busy]:
            results.update(done.result())


def _work_queue(ctx: Context, builder: Any, local: Engine, options: RunOptions,
                echo: Echo) -> dict[str, CellResult]:
    results: dict[str, CellResult] = {}
    identity = builder.identity()
    for cell in builder.queue:  # each on builder.engine (build_cell's `docker`)
        if builder.down:
            result = _record_failure(ctx, CellResult(cell.id, "fail", reason=builder.down),
                                     builder=identity)
        else:
            result = _bases_then_build(ctx, cell, builder, local, options, echo)
            if result.status == "fail" and not builder.engine.answers():
                builder.down = (f"builder {builder.name} ({builder.endpoint.address}) "
                                "stopped answering during the run; rerun to build on the "
                                "builders that are up")
                result = _record_failure(ctx, replace(
                    result, reason=f"{builder.down} ({result.reason})"), builder=identity)
        results[cell.id] = result
        echo(f"[{builder.name}] {result.summary()}")
        if result.status == "fail" and options.fail_fast:
            break
    return results


def _build_in_order(ctx: Context, planned: list[CellSpec], compile: compileplan.CompilePlan,
                    options: RunOptions, results: dict[str, CellResult], echo: Echo,
                    docker: Engine) -> None:
    for cell in planned:
        result = build_cell(ctx, cell, compile, options, docker, echo=echo)
        results[cell.id] = result
        echo(result.summary())
        if result.status == "fail" and options.fail_fast:
            echo("stopping: --fail-fast")
            return


def _build_in_parallel(ctx: Context, planned: list[CellSpec],
                       compile: compileplan.CompilePlan, options: RunOptions,
                       results: dict[str, CellResult], echo: Echo, docker: Engine) -> None:
    """A pool of `parallel_cells` workers. On --fail-fast or an interrupt the cells not
    started are cancelled; the ones under way finish and are journaled."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=compile.parallel_cells,
                              thread_name_prefix="infermatrix-build")
    futures = {pool.submit(build_cell, ctx, cell, compile, options, docker, None, echo): cell
               for cell in planned}
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                if future.cancelled():
                    continue
                result = future.result()
                results[futures[future].id] = result
                echo(result.summary())
                if result.status == "fail" and options.fail_fast:
                    echo("stopping: --fail-fast (cells under way finish)")
                    for other in pending:
                        other.cancel()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

# --------------------------------------------------------------------------------------------
# The pipeline step
# --------------------------------------------------------------------------------------------

def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    results = build_cells(run.ctx, cells, run.options, echo=echo, docker=run.docker)
    passed = [i for i, r in results.items() if r.status == "pass"]
    failed = [i for i, r in results.items() if r.status == "fail"]
    return step_record("build", passed, failed)
