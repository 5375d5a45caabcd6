"""Run options, each declared once: flag, environment variable, matrix key, default, validator.

Every command that takes an option adds it with `add(parser, name, ...)`; `resolve(args,
matrix)` gives the value in one order everywhere: the flag, else the environment variable,
else the matrix key, else the default. A bad value is a usage error (exit 2) naming where it
came from, whichever command reads it: `--max-jobs -3`, `--max-jobs 0` and
`INFERMATRIX_MAX_JOBS=x` are refused alike.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import UsageError


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be 1 or more")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be more than 0")
    return value


def level_list(text: str) -> list[str]:
    from .model.cell import SMOKE_LEVELS as LEVELS

    levels = [lv.strip() for lv in str(text).split(",") if lv.strip()]
    unknown = [lv for lv in levels if lv not in LEVELS]
    if unknown or not levels:
        raise ValueError(f"unknown smoke level {unknown[0] if unknown else text!r} "
                         f"(levels: {', '.join(LEVELS)})")
    return levels


def engine_endpoint(text: str) -> str:
    """[NAME=]unix://, ssh://, tcp:// or a name (a builder of build.builders, a Docker
    context): checked for form here, resolved against the matrix by the step."""
    from .engine.docker import parse_builder

    try:
        parse_builder(text)
    except UsageError:
        raise ValueError("expected [NAME=]unix://PATH, ssh://USER@HOST, tcp://HOST:PORT, a "
                         "builder of build.builders or a Docker context") from None
    return text.strip()


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise ValueError("no such file")
    return path


@dataclass(frozen=True)
class RunOption:
    name: str  # attribute on the parsed args and on RunOptions
    flag: str
    help: str
    parse: Callable[[str], Any] | None = None  # None: a switch (store_true)
    env: str | None = None
    matrix_key: tuple[str, ...] = ()  # path in matrix.yaml, e.g. ("build", "timeout_minutes")
    default: Any = None
    metavar: str | None = None
    aliases: tuple[str, ...] = ()  # other spellings of the flag (`smoke --on`)

    def from_matrix(self, data: Mapping[str, Any]) -> Any:
        if not self.matrix_key:
            return None
        value: Any = data
        for key in self.matrix_key:
            if not isinstance(value, Mapping) or key not in value:
                return None
            value = value[key]
        return value

    def check(self, raw: Any, where: str) -> Any:
        if self.parse is None or raw is None:
            return raw
        if isinstance(raw, list) and self.parse is level_list:
            raw = ",".join(map(str, raw))
        try:
            return self.parse(str(raw))
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{where} {raw!r}: {exc}") from None


OPTIONS: dict[str, RunOption] = {o.name: o for o in [
    RunOption("fail_fast", "--fail-fast", "stop at the first failed cell or step"),
    RunOption("timeout_min", "--timeout-min", "per-cell build time limit in minutes",
              positive_float, "INFERMATRIX_TIMEOUT_MIN", ("build", "timeout_minutes"), 180.0,
              "N"),
    RunOption("max_jobs", "--max-jobs", "MAX_JOBS of kernel builds (default: the compile "
              "planner's figure)", positive_int, "INFERMATRIX_MAX_JOBS", metavar="N"),
    RunOption("nvcc_threads", "--nvcc-threads", "NVCC_THREADS of kernel builds (default: the "
              "compile planner's figure)", positive_int, "INFERMATRIX_NVCC_THREADS",
              metavar="N"),
    RunOption("levels", "--levels", "smoke levels, comma-separated subset of static,gpu,model,"
              "throughput (default: static,gpu,model)",
              level_list, "INFERMATRIX_LEVELS", ("smoke", "levels"), None, "LIST"),
    RunOption("smoke_on", "--smoke-on", "run the smoke levels on this Docker engine (where the "
              "GPUs are): [NAME=]unix://PATH, ssh://USER@HOST, tcp://HOST:PORT, a builder of "
              "build.builders or a Docker context; the image goes there by docker save | "
              "load, the journal records that engine and its host",
              engine_endpoint, "INFERMATRIX_SMOKE_ON", ("smoke", "on"), None, "ENGINE",
              aliases=("--on",)),
    RunOption("wait", "--wait",
              "wait for another run holding the state directory instead of refusing"),
    RunOption("force", "--force", "rebuild even the cells whose inputs did not change"),
    RunOption("ca_bundle", "--ca-bundle", "CA bundle passed to builds as the `ca_bundle` "
              "secret (default: $SSL_CERT_FILE or the system bundle)", existing_file,
              metavar="FILE"),
]}


def add(parser: argparse.ArgumentParser, *names: str) -> None:
    """Add the named options to a command's parser (values are resolved by `resolve`)."""
    for name in names:
        option = OPTIONS[name]
        if option.parse is None:
            parser.add_argument(option.flag, action="store_true", dest=name, help=option.help)
        else:
            where = [f"${option.env}"] if option.env else []
            where += [".".join(option.matrix_key)] if option.matrix_key else []
            default = f"; default {option.default}" if option.default is not None else ""
            suffix = f" ({', '.join(where)}{default})" if where or default else ""
            parser.add_argument(option.flag, *option.aliases, dest=name, default=None,
                                metavar=option.metavar, help=option.help + suffix)


@dataclass
class RunOptions:
    """Resolved values of every run option; `sources` says where each came from."""

    fail_fast: bool = False
    timeout_min: float | None = None
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    levels: list[str] | None = None
    smoke_on: str | None = None
    wait: bool = False
    force: bool = False
    ca_bundle: Path | None = None
    publish: bool = True
    builders: list[str] = field(default_factory=list)  # --builder, repeatable
    sources: dict[str, str] = field(default_factory=dict)

    def preamble(self) -> str:
        """One short line of the options that are not at their default."""
        shown = [f"{name}={_show(getattr(self, name))} ({self.sources[name]})"
                 for name in OPTIONS if name in self.sources]
        return "options: " + (", ".join(shown) if shown else "defaults")


def _show(value: Any) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def resolve(args: argparse.Namespace | None, matrix_data: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> RunOptions:
    """Flag, else environment variable, else matrix key, else default; each value validated."""
    env = os.environ if env is None else env
    matrix_data = matrix_data or {}
    resolved = RunOptions()
    for name, option in OPTIONS.items():
        given = getattr(args, name, None) if args is not None else None
        if option.parse is None:
            if given:
                setattr(resolved, name, True)
                resolved.sources[name] = option.flag
            continue
        if given is not None:
            value, where = option.check(given, option.flag), option.flag
        elif option.env and env.get(option.env):
            value, where = option.check(env[option.env], option.env), option.env
        elif option.from_matrix(matrix_data) is not None:
            where = ".".join(option.matrix_key)
            value = option.check(option.from_matrix(matrix_data), where)
        else:
            value, where = option.default, None
        setattr(resolved, name, value)
        if where:
            resolved.sources[name] = where
    if args is not None and getattr(args, "no_publish", False):
        resolved.publish = False
        resolved.sources["publish"] = "--no-publish"
    if args is not None and getattr(args, "builder", None):
        resolved.builders = list(args.builder)
        resolved.sources["builders"] = "--builder"
    return resolved


def builder_option(parser: argparse.ArgumentParser) -> None:
    """`--builder`, repeatable: the Docker engines that build (replaces build.builders)."""
    parser.add_argument("--builder", action="append", default=[], metavar="[NAME=]ENDPOINT",
                        help="a Docker engine to build on: unix://PATH, ssh://USER@HOST, "
                             "tcp://HOST:PORT or a Docker context name; repeatable (cells are "
                             "shared out by platform and capacity; default: build.builders, "
                             "else DOCKER_HOST / the current context)")
