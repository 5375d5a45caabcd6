"""Run options, each declared once, as a typed field of `RunOptions` that carries its row:
flag, environment variable(s), matrix key, default, validator. Adding an option is that one
field (and its test); the parsers, the resolution and the preamble read the table.

Every command that takes an option adds it with `add(parser, name, ...)`; `resolve(args,
matrix)` gives the value in one order everywhere: the flag, else the environment variable,
else the matrix key, else the default. A bad value is a usage error (exit 2) naming where it
came from, whichever command reads it: `--max-jobs -3`, `--max-jobs 0` and
`INFERMATRIX_MAX_JOBS=x` are refused alike. Options without a flag (the package index, the
cuobjdump to use) are set in the environment; code deep in a step reads them with
`from_environment(name)`, through the same row.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import UsageError
from . import levels as level_table


def at_least(kind: Callable[[str], Any], floor: float, above: bool = False
             ) -> Callable[[str], Any]:
    """A validator of numbers of `kind` (int, float) not below `floor` (above it: `above`)."""
    def check(text: str) -> Any:
        value = kind(text)
        if value < floor or (above and value == floor):
            raise ValueError(f"must be more than {floor:g}" if above
                             else f"must be {floor:g} or more")
        return value
    return check


positive_int = at_least(int, 1)
positive_float = at_least(float, 0, above=True)
non_negative_float = at_least(float, 0)


level_list = level_table.parse


def engine_endpoint(text: str) -> str:
    """[NAME=]unix://, ssh://, tcp:// or a name (a builder of build.builders, a Docker
    context): checked for form here, resolved against the matrix by the step."""
    from .engine.docker import parse_builder

    try:
        parse_builder(text, flag="")
    except UsageError as exc:
        problem = str(exc).split(": ", 1)[1].split("; expected ")[0]
        why = "" if problem.startswith("expected ") else f"{problem}; "
        raise ValueError(f"{why}expected [NAME=]unix:///PATH, ssh://[USER@]HOST[:PORT], "
                         "tcp://HOST[:PORT], a builder of build.builders or a Docker "
                         "context") from None
    return text.strip()


def gpu_arch(text: str) -> str:
    """An arch the audit knows (sm_120, 12.0, sm_90a...), kept as written."""
    from .model.coverage import Arch

    Arch.parse(text)  # ValueError: says which forms it takes
    return text.strip()


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise ValueError("no such directory")
    return path.resolve()


def one_of(*choices: str) -> Callable[[str], str]:
    def choice(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return text
    choice.__name__ = f"one_of({', '.join(choices)})"
    return choice


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError("expected true or false")
    return lowered in ("true", "1", "yes")


def url(text: str) -> str:
    if not text.startswith(("http://", "https://", "file://")):
        raise ValueError("expected an http(s):// or file:// URL")
    return text.rstrip("/")


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise ValueError("no such file")
    return path


@dataclass(frozen=True)
class RunOption:
    """One row of the table: where a run option's value can come from, and how it is checked."""

    name: str  # attribute on the parsed args and on RunOptions
    flag: str | None  # None: no flag (the environment, the matrix or code sets it)
    help: str
    parse: Callable[[str], Any] | None = None  # None: a switch
    env: tuple[str, ...] = ()  # variables, first set wins (`INFERMATRIX_INDEX_URL`, `UV_...`)
    matrix_key: tuple[str, ...] = ()  # path in matrix.yaml, e.g. ("build", "timeout_minutes")
    default: Any = None
    metavar: str | None = None
    aliases: tuple[str, ...] = ()  # other spellings of the flag (`smoke --on`)
    repeatable: bool = False  # `--builder A --builder B`
    switch_sets: Any = True  # what a switch's flag sets (`--no-publish` sets publish False)

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
        if isinstance(raw, list):  # a repeatable flag: each value checked
            return [self.check(item, where) for item in raw]
        try:
            return self.parse(str(raw))
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{where} {raw!r}: {exc}") from None

    def from_env(self, env: Mapping[str, str]) -> tuple[Any, str] | None:
        """(value, variable) of the first of its variables that is set, checked; else None."""
        for variable in self.env:
            if env.get(variable):
                return self.check(env[variable], variable), variable
        return None


def option(flag: str | None, help: str, parse: Callable[[str], Any] | None = None, *,
           env: str | tuple[str, ...] = (), matrix: tuple[str, ...] = (), default: Any = None,
           metavar: str | None = None, aliases: tuple[str, ...] = (), repeatable: bool = False,
           switch_sets: Any = True) -> Any:
    """A RunOptions field and its row of the table (the name is the field's)."""
    if parse is None and default is None:
        default = not switch_sets  # a switch is off until its flag is given
    row = RunOption("", flag, help, parse, (env,) if isinstance(env, str) else env, matrix,
                    default, metavar, aliases, repeatable, switch_sets)
    if repeatable:
        return field(default_factory=list, metadata={"option": row})
    return field(default=default, metadata={"option": row})


@dataclass
class RunOptions:
    """The option table: every run option's resolved value, its row in the field's metadata;
    `sources` says where each value that is not the default came from."""

    fail_fast: bool = option("--fail-fast", "stop at the first failed cell or step")
    timeout_min: float = option(
        "--timeout-min", "per-cell build time limit in minutes", positive_float,
        env="INFERMATRIX_TIMEOUT_MIN", matrix=("build", "timeout_minutes"), default=180.0,
        metavar="N")
    max_jobs: int | None = option(
        "--max-jobs", "MAX_JOBS of kernel builds (default: the compile planner's figure)",
        positive_int, env="INFERMATRIX_MAX_JOBS", metavar="N")
    nvcc_threads: int | None = option(
        "--nvcc-threads", "NVCC_THREADS of kernel builds (default: the compile planner's "
        "figure)", positive_int, env="INFERMATRIX_NVCC_THREADS", metavar="N")
    levels: list[str] | None = option(
        "--levels", f"smoke levels, comma-separated subset of {','.join(level_table.NAMES)} "
        f"(default: {','.join(level_table.DEFAULT_LEVELS)})", level_list,
        env="INFERMATRIX_LEVELS", matrix=("smoke", "levels"), metavar="LIST")
    smoke_on: str | None = option(
        "--smoke-on", "run the smoke levels on this Docker engine (where the GPUs are): "
        "[NAME=]unix://PATH, ssh://USER@HOST, tcp://HOST:PORT, a builder of build.builders or "
        "a Docker context; the image goes there by docker save | load, the journal records "
        "that engine and its host", engine_endpoint, env="INFERMATRIX_SMOKE_ON",
        matrix=("smoke", "on"), metavar="ENGINE", aliases=("--on",))
    wait: bool = option("--wait", "wait for another run holding the state directory instead "
                        "of refusing")
    force: bool = option("--force", "rebuild even the cells whose inputs did not change")
    ca_bundle: Path | None = option(
        "--ca-bundle", "CA bundle passed to builds as the `ca_bundle` secret (default: "
        "$SSL_CERT_FILE or the system bundle)", existing_file, metavar="FILE")
    publish: bool = option("--no-publish", "skip the publish step", switch_sets=False)
    registry: str | None = option(
        "--registry", "push to this registry instead of publish.registry of matrix.yaml", str,
        metavar="HOST[/PATH]")
    allow_retag: bool = option(
        "--allow-retag", "move a tag that already holds another image (breaks consumers "
        "pinned to the tag; those pinned by digest are safe)")
    images_lock: Path | None = option(
        "--lock", "the images.lock publish updates (default: images.lock beside the matrix)",
        Path, metavar="PATH")
    audit_targets: list[str] = option(
        "--target", "GPU arch the audit checks (sm_120, sm_121, 9.0...); repeatable (default: "
        "the cell's arch)", gpu_arch, metavar="ARCH", repeatable=True)
    record_audit: bool = option("--no-record", "do not write the audit result to the journal",
                                switch_sets=False)
    tag_repository: str | None = option(
        "--repository", "local repository of the tag (default: publish.repository)", str,
        metavar="NAME")
    builders: list[str] = option(
        "--builder", "a Docker engine to build on: unix://PATH, ssh://USER@HOST, "
        "tcp://HOST:PORT or a Docker context name; repeatable (cells are shared out by "
        "platform and capacity; default: build.builders, else DOCKER_HOST / the current "
        "context)", str, metavar="[NAME=]ENDPOINT", repeatable=True)
    model_path: Path | None = option(
        "--model-path", "real weights on this host, mounted read-only (default: "
        "smoke.model_source; `fixture` generates a tiny model in the image); with --on an "
        "engine elsewhere, the same path on that engine's host (a shared mount), while a "
        "fixture is copied there", existing_dir, metavar="HOST_DIR")
    fixture: str = option(
        "--fixture", "fixture variant: `broken` has shapes the CPU kernels reject (a model "
        "level that must fail)", one_of("normal", "broken"), default="normal",
        metavar="{normal,broken}")
    image: str | None = option(
        "--image", "test this image (name or id, in the engine) as the cell's, not its "
        "recorded build: one made or loaded elsewhere; the journal records it, and `tag` only "
        "tags a cell's own built image", str, metavar="REF")
    index_url: str | None = option(
        "--index-url", "package index (default: PyPI's simple index); the torch variant index "
        "follows INFERMATRIX_TORCH_INDEX", url,
        env=("INFERMATRIX_INDEX_URL", "UV_INDEX_URL", "PIP_INDEX_URL"), metavar="URL")
    index_ttl_s: float | None = option(
        None, "seconds an online plan trusts a cached release listing (default 3600)",
        non_negative_float, env="INFERMATRIX_INDEX_TTL")
    torch_index: str | None = option(
        None, "the torch variant index, {cuda_tag} filled in (default: the rule "
        "torch-cuda-variant's)", str, env="INFERMATRIX_TORCH_INDEX")
    cuobjdump: Path | None = option(
        None, "the cuobjdump the audit runs (default: the nvidia-cuda-cuobjdump wheel, PATH, "
        "$CUDA_HOME/bin)", existing_file, env="INFERMATRIX_CUOBJDUMP")
    # Set by code only (benchmarks, tests, a command): no flag, no variable.
    prune_images: bool = option(
        None, "render removes images/ directories of cells no longer planned (`infermatrix "
        "render` over the whole matrix)")
    no_cache: bool = option(None, "BuildKit --no-cache (cold-build benchmarks)", boolean,
                            env="INFERMATRIX_NO_CACHE", default=False)
    compile_nonce: str = option(
        None, "a new value compiles the kernels again (BuildKit's cache aside)", str, default="")
    host_gpu: bool | None = option(
        None, "smoke as on a host with (true) or without (false) a GPU; default: detect",
        boolean)
    sources: dict[str, str] = field(default_factory=dict)

    def preamble(self) -> str:
        """One short line of the options that are not at their default."""
        shown = [f"{name}={_show(getattr(self, name))} ({self.sources[name]})"
                 for name in OPTIONS if name in self.sources]
        return "options: " + (", ".join(shown) if shown else "defaults")


OPTIONS: dict[str, RunOption] = {f.name: replace(f.metadata["option"], name=f.name)
                                 for f in fields(RunOptions) if "option" in f.metadata}


def add(parser: argparse.ArgumentParser, *names: str) -> None:
    """Add the named options to a command's parser (values are resolved by `resolve`)."""
    for name in names:
        option = OPTIONS[name]
        assert option.flag, f"{name} has no flag"
        if option.parse is None:
            parser.add_argument(option.flag, *option.aliases, action="store_const",
                                const=option.switch_sets, default=None, dest=name,
                                help=option.help)
            continue
        where = [f"${v}" for v in option.env] + (
            [".".join(option.matrix_key)] if option.matrix_key else [])
        default = f"; default {option.default}" if option.default not in (None, "") else ""
        suffix = f" ({', '.join(where)}{default})" if where or default else ""
        parser.add_argument(option.flag, *option.aliases, dest=name, default=None,
                            action="append" if option.repeatable else "store",
                            metavar=option.metavar, help=option.help + suffix)


def markdown_table() -> str:
    """The option table of docs/architecture.md, generated from OPTIONS (a test keeps the
    committed text equal to it): one row per option, in the order of RunOptions' fields."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| option | env | matrix key | default | what |", "|---|---|---|---|---|"]
    for name, option in OPTIONS.items():
        if option.flag is None:
            flag = f"(no flag: `{name}`)"
        else:
            spellings = ", ".join(f"`{f}`" for f in (option.flag, *option.aliases))
            flag = spellings + (f" {option.metavar}" if option.metavar else "") + \
                (" (repeatable)" if option.repeatable else "")
        env = ", ".join(f"`{v}`" for v in option.env) or "—"
        key = f"`{'.'.join(option.matrix_key)}`" if option.matrix_key else "—"
        if option.parse is None:  # a switch; `--no-publish` turns a field that is on off
            default = "off" if option.switch_sets else f"`{name}` on"
        elif option.default in (None, "", []):
            default = "—"
        else:
            default = f"`{_show(option.default)}`"
        rows.append(f"| {cell(flag)} | {env} | {cell(key)} | {cell(default)} | "
                    f"{cell(option.help)} |")
    return "\n".join(rows) + "\n"


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def resolve(args: argparse.Namespace | None, matrix_data: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None, **given: Any) -> RunOptions:
    """Flag, else environment variable, else matrix key, else default; each value validated.
    `given`: values set by code (a test, a benchmark), taken as they are, as flags are."""
    env = os.environ if env is None else env
    matrix_data = matrix_data or {}
    resolved = RunOptions()
    where: str | None  # the source of a value: code, a flag, a variable, a matrix key
    for name, option in OPTIONS.items():
        flag = getattr(args, name, None) if args is not None else None
        from_env = option.from_env(env)
        if name in given:
            value, where = given[name], "code"
        elif flag is not None and flag != [] and (option.parse or flag == option.switch_sets):
            value = flag if option.parse is None else option.check(flag, option.flag or name)
            where = option.flag
        elif from_env is not None:
            value, where = from_env
        elif option.from_matrix(matrix_data) is not None:
            where = ".".join(option.matrix_key)
            value = option.check(option.from_matrix(matrix_data), where)
        else:
            continue  # the field's default
        setattr(resolved, name, value)
        if where:
            resolved.sources[name] = where
    unknown = set(given) - set(OPTIONS)
    if unknown:
        raise TypeError(f"not run options: {', '.join(sorted(unknown))}")
    return resolved


def package_index() -> str:
    """The package index every step reads: the `index_url` option's variables, else PyPI."""
    from .model.index import index_url

    return index_url(from_environment("index_url"))


def from_environment(name: str, env: Mapping[str, str] | None = None) -> Any:
    """An option without a flag, read where a step needs it: its variables, else its default
    (a bad value is a usage error naming the variable)."""
    option = OPTIONS[name]
    found = option.from_env(os.environ if env is None else env)
    return found[0] if found is not None else option.default
