"""The train step (issue 47): each cell's training image, after the run's serving images.

Kernels only the training profile loads (matrix.yaml `build.kernels.<k>.profile: train`:
flash-attn, which transformers' flash_attention_2 loads and vLLM never does) are not in the
serving image (the Dockerfile's `runtime` target, which build, audit, smoke, tag and publish
work on as ever). This step, after publish, for each cell of the run whose serving image was
built and failed no later step (a "built, not verified" cell included):
  1. compiles its training-only kernels (kernel cache, shared registry and compile gate as the
     build's; one compile at a time at the host's width on a small host),
  2. builds the `train` target (FROM runtime: the serving image's layers, from BuildKit's cache,
     plus the wheels; never `--no-cache`) as `infermatrix-local/<cell>:build-train`, and checks
     that its layers start with the serving image's (else the stage fails),
  3. checks the training kernels' GPU code in that image for the cell's arch (the objects copied
     out of the image and listed with cuobjdump, as the audit reads cubins),
  4. tags it `<the serving tag>-train` where the serving image was tagged,
and records the journal stage `train`. A cell without training-only kernels gets no record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import journal
from ..context import Context
from ..engine.docker import Engine
from ..errors import CommandFailed, InfermatrixError, StageFailure
from ..kernels import kernelcache
from ..model import compileplan
from ..model.coverage import Coverage, DeviceCode, decide
from ..model.spec import CellSpec
from ..options import RunOptions
from ..outcome import TrainDetails
from ..state import run_lock
from . import build
from .steps import Run, StepRecord, builder_groups, echo, step_record

# A later step that failed the serving image: no training image is made from it.
SERVING_STEPS = ("build", "audit", "smoke", "tag", "publish")
VENV_SITE = "/opt/venv/lib/python{python}/site-packages"  # templates/blocks/python-uv.j2


@dataclass
class TrainResult:
    cell_id: str
    status: str  # pass | fail
    image_id: str | None = None
    reused: bool = False
    duration_s: float = 0.0
    reason: str | None = None
    tag: str | None = None  # `<serving tag>-train`, when the serving image was tagged
    input_hash: str | None = None  # train_hash: the serving image's, the training keys
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    coverage: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        if self.status != "pass":
            return f"{self.cell_id}: train image failed: {self.reason}"
        how = "unchanged, reused" if self.reused else f"built in {self.duration_s:.0f} s"
        return (f"{self.cell_id}: train image ({how}) {(self.image_id or '')[:19]}"
                f"{'; tagged ' + self.tag if self.tag else ''}; {self.coverage.get('summary')}")


# --------------------------------------------------------------------------------------------
# Which cells
# --------------------------------------------------------------------------------------------

def serving_built(record: journal.CellRecord) -> bool:
    """The serving image was built and no later step failed it (a cell the tag policy left
    untagged, "built, not verified", still gets its training image)."""
    return record.status_of("build") == journal.Status.PASS and not any(
        record.status_of(s) == journal.Status.FAIL for s in SERVING_STEPS[1:])


def candidates(ctx: Context, cells: list[CellSpec]) -> list[CellSpec]:
    """The cells with training-only kernels whose serving image is there to build on."""
    return [c for c in cells if c.train_kernels
            and serving_built(journal.cell_record(ctx.state, c.id))]


# --------------------------------------------------------------------------------------------
# The check: the training kernels' GPU code for the cell's arch
# --------------------------------------------------------------------------------------------

def gpu_objects(wheels: list[Path], python: str) -> list[dict[str, Any]]:
    """The shared objects the training wheels install, where they land in the image (the
    venv's site-packages) and their sha256 (what the audit's cuobjdump cache is keyed by)."""
    site = VENV_SITE.format(python=python)
    found = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.endswith(".so") or ".so." in member.rsplit("/", 1)[-1]:
                    digest = hashlib.sha256(archive.read(member)).hexdigest()
                    found.append({"path": f"{site}/{member}", "sha256": digest,
                                  "wheel": wheel.name})
    return found


def judge_coverage(codes: dict[str, DeviceCode], arch: str) -> dict[str, Any]:
    """Each object's coverage of `arch` (path -> DeviceCode). Passes when at least one object
    carries GPU code and every one that does runs on the arch (a PTX-JIT one is flagged)."""
    objects: dict[str, dict[str, Any]] = {}
    failing: list[str] = []
    jit: list[str] = []
    for path, code in sorted(codes.items()):
        if code.empty:
            objects[path] = {"coverage": "no GPU code", **code.as_dict()}
            continue
        decision = decide(code, arch)
        objects[path] = {**decision.as_dict(), **code.as_dict()}
        if decision.coverage == Coverage.UNCOVERED:
            failing.append(path)
        elif decision.coverage == Coverage.PTX_JIT:
            jit.append(path)
    with_code = [p for p, o in objects.items() if o["coverage"] != "no GPU code"]
    if not with_code:
        summary, passed = f"no GPU code in the training kernels for {arch}", False
    elif failing:
        summary, passed = (f"{len(failing)} of {len(with_code)} object(s) do not run on "
                           f"{arch}: {', '.join(Path(p).name for p in failing)}"), False
    else:
        summary, passed = (f"{len(with_code)} object(s) cover {arch}"
                           + (f" ({len(jit)} by PTX JIT only)" if jit else "")), True
    return {"arch": arch, "passed": passed, "summary": summary, "objects": objects}


def check_coverage(ctx: Context, cell: CellSpec, image_id: str,
                   entries: list[kernelcache.CachedKernel], docker: Engine,
                   log_path: Path) -> dict[str, Any]:
    """The training kernels' coverage of the cell's arch, read out of the built image."""
    from .audit.probe import device_code_of

    if not cell.cell.is_gpu:
        return {"arch": cell.cell.arch, "passed": True, "objects": {},
                "summary": "a CPU cell: no GPU code to check"}
    objects = gpu_objects([w for e in entries for w in e.wheels], cell.python)
    by_sha = device_code_of(image_id, objects, ctx.state, docker, log_path)
    return judge_coverage({o["path"]: by_sha[o["sha256"]] for o in objects}, cell.cell.arch)


# --------------------------------------------------------------------------------------------
# One cell
# --------------------------------------------------------------------------------------------

def train_hash(serving_hash: str, train_keys: dict[str, kernelcache.KernelKey]) -> str:
    """The training image's input hash: its serving image's, the target, the training keys."""
    digest = hashlib.sha256(f"{serving_hash}\ntarget {build.TRAIN_TARGET}\n".encode())
    for name, key in sorted(train_keys.items()):
        digest.update(f"kernel {name}={key.slug}\n".encode())
    return "sha256:" + digest.hexdigest()


def not_on_serving_image(docker: Engine, train_id: str, serving_id: str | None) -> str | None:
    """Why the training image is not the serving image plus its own layers (None when it
    is): BuildKit rebuilt the `runtime` stage (its cache pruned, or a non-reproducible step)."""
    base = docker.image_layers(serving_id) if serving_id else []
    if not serving_id or not base:
        return f"the serving image {serving_id} is not in Docker to build the training image on"
    layers = docker.image_layers(train_id)
    if layers[:len(base)] == base:
        return None if len(layers) > len(base) else \
            f"the training image {train_id[:19]} adds no layer to the serving image"
    part = next((i for i, (a, b) in enumerate(zip(base, layers)) if a != b), len(layers))
    return (f"the training image {train_id[:19]} is not built on the serving image "
            f"{serving_id[:19]}: its layers part at layer {part + 1} of {len(base)} (BuildKit "
            "rebuilt the runtime stage: its cache was pruned since the serving build, or a step "
            "of it is not reproducible)")


def _unchanged(ctx: Context, cell_id: str, digest: str, docker: Engine) -> str | None:
    """The image id when the journal's train stage built this exact input and it is there."""
    record = journal.cell_record(ctx.state, cell_id)
    image_id = record.train.image_id
    if record.status_of("train") != journal.Status.PASS or record.train.input_hash != digest \
            or not image_id or not docker.image_exists(image_id):
        return None
    if docker.image_id_of(build.train_ref(cell_id)) != image_id:
        docker.tag_image(image_id, build.train_ref(cell_id))
    return image_id


def serving_tag(ctx: Context, cell_id: str) -> str | None:
    """The tag the tag step put on the serving image, if it did."""
    record = journal.cell_record(ctx.state, cell_id)
    return (record.tag.ref or None) if record.status_of("tag") == journal.Status.PASS else None


def tag_train(ctx: Context, cell_id: str, image_id: str, docker: Engine) -> str | None:
    """`<serving tag>-train` on the training image, where the serving image was tagged; never
    moved (a tag naming another image fails the step, as the tag step's)."""
    ref = serving_tag(ctx, cell_id)
    if ref is None:
        return None
    ref += build.TRAIN_TAG_SUFFIX
    current = docker.image_id_of(ref)
    if current is not None and current != image_id:
        raise StageFailure(f"tag {ref} already names {current}; tags are not moved (wanted "
                           f"{image_id})", fix=f"`docker rmi {ref}` if it is to be replaced")
    if current is None:
        docker.tag_image(image_id, ref)
    return ref


def build_train_cell(ctx: Context, cell: CellSpec, compile: compileplan.CompilePlan,
                     options: RunOptions, docker: Engine, echo: build.Echo = print
                     ) -> TrainResult:
    """Compile the cell's training-only kernels, build its `train` target, check and tag it,
    and record the journal's `train` stage."""
    started = time.monotonic()
    log_path = ctx.state.cell_log(cell.id, "train")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = _build_train(ctx, cell, compile, options, docker, echo, log_path)
        if not result.reused:
            result.duration_s = time.monotonic() - started
    except CommandFailed as exc:
        result = TrainResult(cell.id, "fail", duration_s=time.monotonic() - started,
                             reason=("timed out" if exc.returncode is None else
                                     f"build exited {exc.returncode}") + f": {exc.command}")
    except (InfermatrixError, ValueError) as exc:
        result = TrainResult(cell.id, "fail", duration_s=time.monotonic() - started,
                             reason=str(exc).splitlines()[0])
    status = journal.Status.PASS if result.status == "pass" else journal.Status.FAIL
    journal.record_stage(ctx.state, cell.id, "train", status, duration_s=result.duration_s,
                         log=log_path, reason=result.reason,
                         details=TrainDetails(result.image_id, result.tag,
                                              build.train_ref(cell.id), result.input_hash,
                                              result.kernels, result.coverage))
    return result


def _build_train(ctx: Context, cell: CellSpec, compile: compileplan.CompilePlan,
                 options: RunOptions, docker: Engine, echo: build.Echo, log_path: Path
                 ) -> TrainResult:
    directory = build.cell_dir(ctx, cell.id)
    text = (directory / "Dockerfile").read_text(encoding="utf-8")
    if not build.has_stage(text, build.TRAIN_TARGET):
        raise StageFailure(f"images/{cell.id}/Dockerfile has no {build.TRAIN_TARGET} stage "
                           f"(run `infermatrix render --select {cell.id}`)")
    serving_keys, train_keys = build.split_keys(cell, build.kernel_keys_for(ctx, cell, text))
    record = journal.cell_record(ctx.state, cell.id)  # the serving image's
    digest = train_hash(record.input_hash or "", train_keys)
    if not options.force and (image_id := _unchanged(ctx, cell.id, digest, docker)):
        return TrainResult(cell.id, "pass", image_id=image_id, reused=True,
                           tag=tag_train(ctx, cell.id, image_id, docker),
                           kernels=record.train.kernels, coverage=record.train.coverage,
                           input_hash=digest)
    build_args = compile.build_args()
    job = build.CellBuild(ctx, cell.id, directory, build_args, build.secrets_for(options),
                          log_path, build._Deadline.for_cell(ctx, options), echo, docker,
                          options.no_cache, build.build_platform(cell, docker), compile)
    log_path.write_text(f"# infermatrix train {cell.id}\n# {compile.describe()}\n")
    # an interrupted run leaves it so (never pass); the serving record is not touched
    journal.record_stage(ctx.state, cell.id, "train", journal.Status.RUNNING, log=log_path,
                         details={"input_hash": digest, "local_tag": build.train_ref(cell.id)})
    refusal = build.emulated_compile_refusal(ctx, train_keys, job.platform)
    if refusal:
        raise StageFailure(refusal)
    with build.RUNNING.holding(docker.local_data_root(), cell.id):
        serving, _ = build._ensure_kernels(job, serving_keys)
        shared = build._take_shared_kernels(job, train_keys)
        training, kernels = build._ensure_kernels(job, train_keys, shared)
        # never --no-cache here (the compiles above honour it): the `runtime` stage must come
        # from the serving build's layers, or the training image would not be the tested one's
        image_id = dataclasses.replace(job, no_cache=False).build_image(
            {build.KERNEL_WHEELS_DIR: serving, build.TRAIN_WHEELS_DIR: training},
            tag=build.train_ref(cell.id), target=build.TRAIN_TARGET, digest=digest,
            what="train image build")
    if problem := not_on_serving_image(docker, image_id, record.image_id):
        raise StageFailure(problem, fix=f"`infermatrix pipeline --select {cell.id} --force` "
                                        "builds the serving image and its training image again")
    coverage = check_coverage(ctx, cell, image_id, training, docker, log_path)
    if not coverage["passed"]:
        return TrainResult(cell.id, "fail", image_id=image_id, kernels=kernels, coverage=coverage,
                           reason=f"training kernels: {coverage['summary']}", input_hash=digest)
    return TrainResult(cell.id, "pass", image_id=image_id, kernels=kernels, coverage=coverage,
                       tag=tag_train(ctx, cell.id, image_id, docker), input_hash=digest)


# --------------------------------------------------------------------------------------------
# All cells, and the pipeline step
# --------------------------------------------------------------------------------------------

def train_cells(ctx: Context, cells: list[CellSpec], options: RunOptions | None = None,
                echo: build.Echo = print, *, docker: Engine) -> dict[str, TrainResult]:
    """The training images of `cells` (those with training-only kernels and a built serving
    image), one after another: each compile takes the host's width (the compile gate)."""
    options = options or RunOptions()
    chosen = candidates(ctx, cells)
    results: dict[str, TrainResult] = {}
    if not chosen:
        return results
    compile = build.compile_plan_for_cells(ctx, chosen, options, train=True)
    echo(f"training images of {len(chosen)} cell(s), after the serving images; "
         f"{compile.describe()}")
    with run_lock(ctx.state, wait=options.wait):
        for cell in chosen:
            results[cell.id] = build_train_cell(ctx, cell, compile, options, docker, echo)
            echo(results[cell.id].summary())
            if results[cell.id].status == "fail" and options.fail_fast:
                break
    return results


def step(run: Run, cells: list[CellSpec]) -> StepRecord:
    """After publish: the training images. `cells` are those publish let through; a cell the
    tag policy dropped ("built, not verified") is taken back when its serving image is there."""

    alive = {c.id for c in cells}
    chosen = [c for c in run.cells() if c.id in alive or serving_built(
        journal.cell_record(run.ctx.state, c.id))]
    results: dict[str, TrainResult] = {}
    # each cell's training image on the engine that built its serving image (several builders)
    for engine_of, group in builder_groups(run, candidates(run.ctx, chosen)):
        results.update(train_cells(run.ctx, group, run.options, echo=echo,
                                   docker=engine_of or run.docker))
    passed = [i for i, r in results.items() if r.status == "pass"]
    failed = [i for i, r in results.items() if r.status == "fail"]
    note = f"{len(results)} training image(s)" if results else \
        "no cell with training-only kernels and a serving image to build on"
    return step_record("train", passed, failed, note=note)
