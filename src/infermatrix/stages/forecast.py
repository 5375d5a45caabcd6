"""The forecast of a run (issue 47), printed before the first step of `infermatrix pipeline` and
by `infermatrix plan --forecast`: per cell the expected build time on this host, disk and memory,
then the total and the critical path (model/forecast.py computes; this module gathers).

Where each figure comes from:
- a kernel compile: this state's last compile of the same key, else a compile of the package
  measured in the kernel cache here, else data/compile_model.yaml scaled to the planned MAX_JOBS
  (the figure the build's own "expected" line gives), else build.kernels.<k>.estimate_minutes;
  a key in the kernel cache costs nothing;
- the emulation factor build.emulation.slowdown for a cell of another CPU than this host's;
- the image build without its compiles: the journal's last passing build of the cell (its
  compile times taken out), else DEFAULT_IMAGE_S;
- disk: build.disk.min_free_gib; memory: the compile plan's expected peak per compiling cell.
No Docker call: the forecast runs before the engine is needed (`plan --forecast`).
"""

from __future__ import annotations

from typing import Any

from .. import journal
from ..context import Context
from ..engine.docker import host_platform
from ..errors import InfermatrixError
from ..kernels import kernelcache
from ..model import compileplan, compileprogress
from ..model.forecast import CellWork, Forecast, KernelWork, forecast, narrowing_lines
from ..model.spec import CellSpec
from ..options import RunOptions
from . import build

# The image build of a cell without kernel compiles, when the journal has none: the SGLang
# cu130 sm_120 cell took 7 min on a 2-core machine with its bases built (issue 47).
DEFAULT_IMAGE_S = 7 * 60.0
DEFAULT_IMAGE_ORIGIN = "default (issue 47: 7 min on 2 cores)"
# The train target without its compiles (a wheel installed on the serving image's cached
# layers, its byte-code), when the journal has no train stage of the cell yet.
DEFAULT_TRAIN_IMAGE_S = 60.0


def image_seconds(ctx: Context, cell_id: str, fresh: bool = False) -> tuple[float, str]:
    """The cell's last passing build from the journal, its kernel compiles taken out (`fresh`:
    what a fresh clone knows, the default)."""
    seconds = None if fresh else _without_compiles(journal.cell_record(ctx.state, cell_id),
                                                   "build")
    return (seconds, "journal") if seconds else (DEFAULT_IMAGE_S, DEFAULT_IMAGE_ORIGIN)


def train_image_seconds(ctx: Context, cell_id: str, fresh: bool = False) -> float:
    """The cell's last passing train target from the journal, its compiles taken out."""
    seconds = None if fresh else _without_compiles(journal.cell_record(ctx.state, cell_id),
                                                   "train")
    return seconds or DEFAULT_TRAIN_IMAGE_S


def _without_compiles(record: journal.CellRecord, name: str) -> float | None:
    """The seconds of the stage's last pass less its kernel compiles (None: none, or none
    left)."""
    stage = record.stage(name)
    if stage is None or stage.status != journal.Status.PASS or not stage.duration_s:
        return None
    kernels = record.build.kernels if name == "build" else record.train.kernels
    compiled = sum(float(k.get("duration_s") or 0) for k in kernels.values()
                   if k.get("cache") == "miss")
    return stage.duration_s - compiled if stage.duration_s > compiled else None


def compile_seconds(ctx: Context, name: str, key: kernelcache.KernelKey, max_jobs: int,
                    fresh: bool = False) -> tuple[float | None, str]:
    """(native seconds of compiling `key` at `max_jobs` on this host, where that comes from);
    `fresh`: from what a fresh clone knows (the compile model, estimate_minutes), not this
    state's history or kernel cache."""
    history = [] if fresh else \
        compileplan.read_history(compileplan.history_path(ctx.state.root))
    prior = compileprogress.prior_for(key.slug, key.package, key.version, key.cuda, max_jobs,
                                      history, compileplan.load_model())
    if prior.origin == "history" and prior.total_s:
        return prior.total_s, "history"
    native = estimate_minutes(ctx, name) if fresh else build.native_compile_seconds(ctx, name, key)
    if native is not None and not native[1].startswith("build.kernels"):
        return native[0], "measured here"
    if prior.total_s:
        return prior.total_s, "model"
    if native is not None:
        return native[0], "estimate_minutes"
    return None, "unknown"


def estimate_minutes(ctx: Context, name: str) -> tuple[float, str] | None:
    """build.kernels.<name>.estimate_minutes in seconds, with where it comes from."""
    minutes = (ctx.matrix.build.get("kernels", {}).get(name) or {}).get("estimate_minutes")
    return (float(minutes) * 60, f"build.kernels.{name}.estimate_minutes") if minutes else None


def compile_width(plan: compileplan.CompilePlan) -> int:
    """MAX_JOBS a compile gets with nothing else compiling (build.py's CompileGate)."""
    override = plan.max_jobs if any(o.startswith("MAX_JOBS") for o in plan.overrides) else None
    return compileplan.jobs_for_next_compile(plan.cpus, plan.usable_gb, plan.job_gib, 0, 0.0,
                                             None, override)


def cell_work(ctx: Context, cell: CellSpec, plan: compileplan.CompilePlan,
              options: RunOptions, fresh: bool = False) -> CellWork:
    """What building `cell` on this host is made of (`fresh`: as a fresh clone would forecast
    it: nothing built, cached or recorded yet)."""
    settings = ctx.matrix.build
    image_s, origin = image_seconds(ctx, cell.id, fresh)
    disk = float((settings.get("disk") or {}).get("min_free_gib", build.DEFAULT_MIN_FREE_GIB))
    emulation = 1.0 if cell.platform == host_platform() else \
        float((settings.get("emulation") or {}).get("slowdown", 10.0))
    dockerfile = build.cell_dir(ctx, cell.id) / "Dockerfile"
    if not dockerfile.is_file():
        return CellWork(cell.id, image_s, origin, (), emulation, disk, plan.cell_budget_gb)
    text = dockerfile.read_text(encoding="utf-8")
    try:
        keys = build.kernel_keys_for(ctx, cell, text)
    except (InfermatrixError, ValueError):
        keys = {}
    train = {k.name for k in cell.train_kernels}  # matrix.yaml: profile: train
    kernels = []
    for name, key in keys.items():
        seconds, where = compile_seconds(ctx, name, key, compile_width(plan), fresh)
        native = None if emulation == 1 else estimate_minutes(ctx, name) if fresh else \
            build.native_compile_seconds(ctx, name, key)
        if native is not None:  # the figure build.py's emulation limit judges by
            seconds, where = native[0], native[1].split(" (")[0]
        kernels.append(KernelWork(name, key.slug, seconds, where, cached=not fresh and
                                  kernelcache.lookup(ctx.state, key) is not None,
                                  train=name in train))
    args = {**plan.build_args(), "platform": cell.platform}
    if options.compile_nonce:
        args[build.COMPILE_NONCE_ARG] = options.compile_nonce
    serving_keys = {n: k for n, k in keys.items() if n not in train}
    digest = build.input_hash(build.cell_dir(ctx, cell.id), args, serving_keys)
    record = journal.cell_record(ctx.state, cell.id)
    reused = (not fresh and not options.force and record.input_hash == digest
              and record.status_of("build") == journal.Status.PASS)
    trained = record.stage("train")
    train_reused = (reused and trained is not None and trained.status == journal.Status.PASS
                    and bool(train) and all(k.cached for k in kernels if k.train))
    return CellWork(cell.id, image_s, origin, tuple(kernels), emulation, disk,
                    plan.cell_budget_gb, reused, train_image_seconds(ctx, cell.id, fresh),
                    train_reused)


def run_forecast(ctx: Context, cells: list[CellSpec], options: RunOptions,
                 plan: compileplan.CompilePlan | None = None, fresh: bool = False) -> Forecast:
    plan = plan or build.compile_plan_for_cells(ctx, cells, options)
    limit = (ctx.matrix.build.get("emulation") or {}).get("max_compile_minutes", 60)
    work = [cell_work(ctx, cell, plan, options, fresh) for cell in cells]
    result = forecast(work, plan.parallel_cells, float(limit) * 60 if limit else None)
    result.notes.append(f"{plan.parallel_cells} cell(s) build at once; a kernel compile "
                        f"alone at MAX_JOBS={compile_width(plan)} (it takes the CPUs the "
                        f"compiles under way leave); {plan.cpus} CPU(s), {plan.memory_gb:.1f} "
                        f"GiB ({plan.memory_source})")
    if options.builders or ctx.matrix.build.get("builders"):
        result.notes.append("the cells build on the builders (--builder, build.builders): "
                            "their own CPUs size the compiles, so these times are this host's "
                            "upper bound when they are larger")
    return result


def forecast_lines(result: Forecast, example_cell: str | None = None) -> list[str]:
    """The forecast as plain lines: a table of the cells, the totals, what to do when long."""
    clock = compileprogress.clock
    width = max([len(c.cell_id) for c in result.cells] + [4])
    lines = [f"{'cell':<{width}}  {'time':>7}  {'servable':>8}  {'train':>7}  {'disk':>6}  "
             f"{'memory':>7}  kernels",
             *(f"{c.cell_id:<{width}}  {clock(c.seconds):>7}  {_at(c.servable_s):>8}  "
               f"{_at(c.train_done_s):>7}  "
               f"{(f'{c.disk_gib:g}G' if c.disk_gib else '-'):>6}  "
               f"{(f'{c.memory_gib:.1f}G' if c.memory_gib else '-'):>7}  "
               + "; ".join(filter(None, [c.kernels if c.kernels != "-" or not c.train_kernels
                                         else "", c.train_kernels and
                                         f"train: {c.train_kernels}"]))
               + (f"  [{c.note}]" if c.note else "") for c in result.cells)]
    lines.append("servable: from the run's start to the cell's serving image built (before its "
                 "audit and smoke); train: to its training image (profile: train kernels), "
                 "built after every serving image")
    lines.append(f"total: about {clock(result.total_s)}; critical path: "
                 + (" -> ".join(result.critical_path) or "nothing to build")
                 + f"; free disk needed at once: {result.disk_gib:g} GiB; compile memory "
                 f"peak: {result.memory_gib:.1f} GiB")
    lines.extend(result.notes)
    lines.extend(narrowing_lines(result, example_cell))
    return lines


def _at(seconds: float | None) -> str:
    """A time from the run's start, or '-'."""
    return compileprogress.clock(seconds) if seconds else "-"


def print_forecast(ctx: Context, cells: list[CellSpec], options: RunOptions,
                   say: Any) -> Forecast | None:
    """Print the forecast through `say` (one plain line at a time); None when there are no
    cells. A forecast that cannot be made is said in one line, never stops the run."""
    if not cells:
        return None
    try:
        result = run_forecast(ctx, cells, options)
    except (InfermatrixError, OSError, ValueError) as exc:
        say(f"forecast: not made ({exc})")
        return None
    say("forecast (this host; time: the serving image's build plus the kernels it compiles "
        "first):")
    for line in forecast_lines(result, _example(cells)):
        say(line)
    return result


def _example(cells: list[CellSpec]) -> str | None:
    """A --select pattern of one CUDA major and arch, from the cells of the run."""
    for cell in cells:
        parts = cell.id.split("-")
        if len(parts) >= 2 and parts[0].startswith("cu"):
            return f"{parts[0]}-*-{parts[-1]}"
    return None

