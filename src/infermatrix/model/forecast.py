"""The run's forecast (issue 47): before the first step, what each cell will take on this host,
the disk and memory it needs, the total and the critical path.

Each cell's time is its image build (the journal's last build of the cell, else a default) plus
the kernels it compiles first in the run (a key another cell compiles earlier costs it nothing:
the kernel cache hands the wheel over; a cached key costs nothing), each compile multiplied by
the emulation factor when the cell is for another CPU (QEMU). A compile under emulation longer
than the limit is not started (build.py refuses it): the cell is forecast as "not built".

The total is the cells laid over the run's build slots in order (`build` hands each cell to
the first free slot), and the critical path is the slot that ends last. A cell's time to a
servable image is when its serving build ends in that schedule. Training-only kernels
(`build.kernels.<k>.profile: train`) are not in the serving image: their compiles and the
train images follow the serving builds, one at a time at the host's width (the train step);
their end is each cell's "train done". Pure: figures in, figures out; stages/forecast.py
gathers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .compileprogress import clock

# A run longer than this is said to be long, with the ways to narrow it.
LONG_RUN_S = 3600.0


@dataclass(frozen=True)
class KernelWork:
    """One kernel of a cell: what compiling it natively takes, and whether it is compiled."""

    name: str
    slug: str
    seconds: float | None  # native compile time on this host at the planned MAX_JOBS
    origin: str  # where the figure comes from (history, model, measured here, estimate_minutes)
    cached: bool = False  # in the kernel cache: nothing to compile
    train: bool = False  # training-only (profile: train): the train target, after serving


@dataclass(frozen=True)
class CellWork:
    """What one cell's build is made of."""

    cell_id: str
    image_s: float  # the image build without its kernel compiles
    image_origin: str
    kernels: tuple[KernelWork, ...] = ()
    emulation: float = 1.0  # the slowdown of a build for another CPU (1: native)
    disk_gib: float = 0.0  # free space the cell needs under Docker's data root as it starts
    memory_gib: float = 0.0  # expected peak of its compile (0: nothing to compile)
    reused: bool = False  # unchanged since its last build: nothing to do
    train_image_s: float = 0.0  # the train target's build without its compiles
    train_reused: bool = False  # its training image is unchanged: nothing to do


@dataclass
class CellForecast:
    cell_id: str
    seconds: float
    compile_s: float
    kernels: str  # what the kernels column says
    disk_gib: float
    memory_gib: float
    note: str = ""  # "not built: ..." / "unchanged" / "emulated x15"
    train_s: float = 0.0  # its training image after the serving builds (0: none to build)
    train_kernels: str = ""  # what the training kernels column says ("": none)
    servable_s: float | None = None  # from the run's start to its serving image (the schedule)
    train_done_s: float | None = None  # from the run's start to its training image


@dataclass
class Forecast:
    cells: list[CellForecast]
    slots: int
    total_s: float
    critical_path: list[str]
    disk_gib: float  # the most free space needed at once
    memory_gib: float  # the expected peak of the compiles running at once
    notes: list[str] = field(default_factory=list)

    @property
    def long(self) -> bool:
        return self.total_s > LONG_RUN_S


@dataclass
class Compiles:
    """What a cell's kernels of one profile compile: seconds, the column's parts, the kernels
    without a figure, and the refusal of an emulated compile over the limit."""

    seconds: float = 0.0
    parts: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    refusal: str | None = None


def compiles_of(kernels: list[KernelWork], emulation: float, compiled_before: set[str],
                emulation_limit_s: float | None) -> Compiles:
    """The compiles of `kernels` (one profile's) for a cell built under `emulation`."""
    found = Compiles()
    for kernel in kernels:
        if kernel.cached:
            found.parts.append(f"{kernel.name} cached")
        elif kernel.slug in compiled_before:
            found.parts.append(f"{kernel.name} shared")
        elif kernel.seconds is None:
            found.unknown.append(kernel.name)
            found.parts.append(f"{kernel.name} ?")
        else:
            seconds = kernel.seconds * emulation
            if emulation_limit_s is not None and emulation > 1 and seconds > emulation_limit_s:
                found.parts.append(f"{kernel.name} {clock(seconds)}")
                found.refusal = (f"{kernel.name} under emulation x{emulation:g} "
                                 f"({clock(seconds)}) exceeds "
                                 "build.emulation.max_compile_minutes")
                return found
            found.seconds += seconds
            found.parts.append(f"{kernel.name} {clock(seconds)} ({kernel.origin})")
    return found


def cell_forecast(work: CellWork, compiled_before: set[str], emulation_limit_s: float | None
                  ) -> CellForecast:
    """One cell's figures; `compiled_before`: the kernel keys an earlier cell of the run
    compiles (updated with this cell's). `seconds` is the serving build's; the training-only
    kernels and the train target are `train_s`, after every serving build."""
    serving = [k for k in work.kernels if not k.train]
    training = [k for k in work.kernels if k.train]
    train_s, train_text, train_note = _train_part(work, training, compiled_before,
                                                  emulation_limit_s)
    if work.reused:
        return CellForecast(work.cell_id, 0.0, 0.0, "-", 0.0, 0.0, "unchanged: reused",
                            train_s, train_text)
    found = compiles_of(serving, work.emulation, compiled_before, emulation_limit_s)
    if found.refusal:
        return CellForecast(work.cell_id, 0.0, 0.0, ", ".join(found.parts), 0.0, 0.0,
                            f"not built: {found.refusal}")
    compiled_before.update(k.slug for k in serving if not k.cached)
    note = f"emulated x{work.emulation:g}" if work.emulation > 1 else ""
    if found.unknown:
        note = "; ".join(filter(None, [note, f"no figure for {', '.join(found.unknown)}"]))
    note = "; ".join(filter(None, [note, train_note]))
    return CellForecast(work.cell_id, work.image_s + found.seconds, found.seconds,
                        ", ".join(found.parts) or "-", work.disk_gib,
                        work.memory_gib if found.seconds else 0.0, note, train_s, train_text)


def _train_part(work: CellWork, training: list[KernelWork], compiled_before: set[str],
                emulation_limit_s: float | None) -> tuple[float, str, str]:
    """(seconds of the training image, its kernels column, a note) of a cell."""
    if not training:
        return 0.0, "", ""
    if work.train_reused:
        return 0.0, "unchanged", ""
    found = compiles_of(training, work.emulation, compiled_before, emulation_limit_s)
    text = ", ".join(found.parts)
    if found.refusal:
        return 0.0, text, f"training image not built: {found.refusal}"
    compiled_before.update(k.slug for k in training if not k.cached)
    note = f"no figure for {', '.join(found.unknown)}" if found.unknown else ""
    return work.train_image_s + found.seconds, text, note


def schedule(seconds: list[float], slots: int) -> tuple[float, list[int]]:
    """(makespan, indices of the slot that ends last): each item, in order, to the first free
    slot, as the build's worker pool takes them."""
    makespan, path, _ = schedule_ends(seconds, slots)
    return makespan, path


def schedule_ends(seconds: list[float], slots: int) -> tuple[float, list[int], list[float]]:
    """schedule(), and when each item ends (from the start)."""
    ends = [0.0] * max(slots, 1)
    held: list[list[int]] = [[] for _ in ends]
    item_ends: list[float] = []
    for index, length in enumerate(seconds):
        slot = min(range(len(ends)), key=lambda s: (ends[s], s))
        ends[slot] += length
        held[slot].append(index)
        item_ends.append(ends[slot])
    last = max(range(len(ends)), key=lambda s: (ends[s], -s))
    return ends[last], held[last], item_ends


def forecast(work: list[CellWork], slots: int, emulation_limit_s: float | None = None
             ) -> Forecast:
    """The run's forecast over `slots` cells building at once (compile.parallel_cells)."""
    compiled: set[str] = set()
    cells = [cell_forecast(w, compiled, emulation_limit_s) for w in work]
    busy = [c for c in cells if c.seconds > 0]
    total, path, ends = schedule_ends([c.seconds for c in busy], slots)
    for cell, end in zip(busy, ends):
        cell.servable_s = end
    at_once = max(1, min(slots, len(busy)))
    disks = sorted((c.disk_gib for c in busy), reverse=True)
    memories = sorted((c.memory_gib for c in busy), reverse=True)
    result = Forecast(cells, slots, total, [busy[i].cell_id for i in path],
                      sum(disks[:at_once]), sum(memories[:at_once]))
    # Each compile is timed at the whole host's width (build.py's CompileGate): compiles that
    # take every CPU run one after another, whatever the slots
    compiling = [c for c in busy if c.compile_s]
    # ... and the first of them starts after its own cell's steps before the compile, the last
    # one's cell installs after it: at least one image build's time beside the compiles
    compiles = sum(c.compile_s for c in compiling) + \
        min((c.seconds - c.compile_s for c in compiling), default=0.0)
    if compiles > total:
        result.total_s = compiles
        result.critical_path = [c.cell_id for c in busy if c.compile_s]
        result.notes.append("the kernel compiles run one at a time at full width: their sum "
                            "(plus one image build) sets the total")
    _serving_then_training(result, cells, busy, compiling)
    return result


def _serving_then_training(result: Forecast, cells: list[CellForecast],
                           busy: list[CellForecast], compiling: list[CellForecast]) -> None:
    """Each cell's time to a servable image, then the training images one after another."""
    if result.total_s > max((c.servable_s or 0.0 for c in busy), default=0.0):
        # the compiles one at a time at full width: the serving builds end with them
        at = min((c.seconds - c.compile_s for c in compiling), default=0.0)
        for cell in compiling:
            at += cell.compile_s
            cell.servable_s = max(cell.servable_s or 0.0, at)
    serving_end = result.total_s
    clock_s = serving_end
    for cell in cells:
        if cell.train_s > 0:
            clock_s += cell.train_s
            cell.train_done_s = clock_s
    if clock_s > serving_end:
        result.total_s = clock_s
        result.critical_path = result.critical_path + [
            f"{c.cell_id} (train)" for c in cells if c.train_s > 0]
        result.notes.append("training-only kernels (profile: train) build after every serving "
                            "image, one training image at a time: the serving images do not "
                            "wait for them")


def narrowing_lines(result: Forecast, example_cell: str | None) -> list[str]:
    """What to do when the run is long: the ways to narrow it, each a command or a setting."""
    if not result.long:
        return []
    fastest = min((c for c in result.cells if c.seconds > 0), key=lambda c: c.seconds,
                  default=None)
    lines = [f"this run is long: about {clock(result.total_s)} on this host. To narrow it:"]
    if fastest is not None:
        lines.append(f"  - fewer cells: --select '{fastest.cell_id}' (about "
                     f"{clock(fastest.seconds)}), or a pattern such as "
                     f"--select '{example_cell or 'cu130-*-sm120'}'")
    lines.append("  - a larger machine: --builder ssh://USER@HOST (repeatable; its CPUs size the "
                 "kernel compiles)")
    lines.append("  - the kernel cache: build.kernel_cache in matrix.yaml (a registry with the "
                 "compiled wheels) turns each compile into a pull")
    return lines
