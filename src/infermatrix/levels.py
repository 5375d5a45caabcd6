"""The smoke level table (issue 49: one home per building block), one row per level in the
order they run. Its users: `--levels` and its help (options), smoke's dispatch and defaults
(stages/smoke.py), the tag policy (stages/tagging.py), the report, `infermatrix verify`
(consumer/verify.py) and the matrix check (config.load_schema: the names' enum)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Level:
    name: str
    runner: str  # its function in stages/smoke.py (smoke.LevelRunner)
    timeout_s: float  # the default of matrix smoke.timeouts.<name>
    default: bool = False  # run by a plain smoke (no --levels, no smoke.levels)
    required: bool = False  # in the default tag policy (tag_policy.require)
    gpu_cells_only: bool = False  # does not apply to a CPU cell (never required there)
    static_only_waives: bool = False  # skipped for want of a GPU: a static-only tag may stand
    # its headline figures' function in stages/smoke.py, kept in the smoke details under its
    # name; the report's levels table shows its total only, its figures are its own chart
    summary: str | None = None
    verify: str | None = None  # its function in consumer/verify.py (`infermatrix verify`)
    verify_default: bool = False  # run by a plain `infermatrix verify`
    # a load level: the fixture variant it reuses, and what of it stays on a remote engine's host
    load: tuple[str, str] | None = None


# throughput (N replicas under a closed-loop load) and workload (the job's shape: sweep, soak,
# needle, backends used) run only when asked for
LEVELS: tuple[Level, ...] = (
    Level("static", "run_static", 600.0, default=True, required=True),
    Level("gpu", "run_gpu", 600.0, default=True, required=True, gpu_cells_only=True,
          static_only_waives=True, verify="verify_gpu", verify_default=True),
    Level("model", "run_model", 1800.0, default=True, required=True, static_only_waives=True,
          verify="verify_model", verify_default=True),
    Level("throughput", "run_throughput", 1800.0, summary="throughput_summary",
          load=("normal", "the replicas' ports stay")),
    Level("workload", "run_workload", 3600.0, summary="workload_summary",
          verify="verify_workload", load=("trained", "the server's port stays")),
)
BY_NAME = {level.name: level for level in LEVELS}
NAMES = tuple(BY_NAME)


def names_where(column: str) -> tuple[str, ...]:
    return tuple(lv.name for lv in LEVELS if getattr(lv, column))


DEFAULT_LEVELS, REQUIRED_LEVELS = names_where("default"), names_where("required")
GPU_CELLS_ONLY, SUMMARISED = names_where("gpu_cells_only"), names_where("summary")
STATIC_ONLY_WAIVES = names_where("static_only_waives")
VERIFY_LEVELS, ALL_VERIFY_LEVELS = names_where("verify_default"), names_where("verify")


def parse(text: str, allowed: tuple[str, ...] = NAMES) -> list[str]:
    """A comma-separated subset of `allowed` (`--levels`), in the table's (run) order."""
    levels = [lv.strip() for lv in str(text).split(",") if lv.strip()]
    unknown = [lv for lv in levels if lv not in allowed] or ([] if levels else [str(text)])
    if unknown:
        raise ValueError(f"unknown smoke level {unknown[0]!r}: expected a comma-separated "
                         f"subset of {','.join(allowed)}")
    return [name for name in NAMES if name in levels]
