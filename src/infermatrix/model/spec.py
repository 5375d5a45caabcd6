"""The resolved cell: every per-cell fact, computed once from the plan and the cell's lock.

`resolve_spec(ctx, plan)` gives a `CellSpec`: platform and machine, the base and its `from:` chain,
the kernels with the versions the lock resolved (for `version: match-engine`), their sdist
pins and how each is pinned (scope), the lock path and its pins, the launch (command, env,
shm, port, health, attention backend) and the driver floor. The stages read these fields;
the helpers below are the one place each fact is derived (lock path, lock pins, platform ->
machine, base chain, kernel versions).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

from packaging.utils import canonicalize_name

from ..config import Matrix
from ..errors import StageFailure, UsageError
from ..names import inside
from ..state import read_state_text
from .cell import Cell, CellPlan

LOCKS_DIR = "locks"
MATCH_ENGINE = "match-engine"  # build.kernels.<k>.version: the version the lock resolves
DEFAULT_PORT = 8000
CONTAINER_MODEL = "/model"
DEFAULT_SHM = {"gpu": "16g", "cpu": "1g"}  # the engines need more than Docker's 64 MB /dev/shm

# Image platform (OCI) -> machine (uname -m, wheel tags); the inverse names this host's platform.
MACHINES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
PLATFORMS = {machine: platform for platform, machine in MACHINES.items()}


def machine_of(platform: str) -> str:
    return MACHINES[platform]


def platform_of_machine(machine: str) -> str:
    """`x86_64` -> `linux/amd64`; an unknown machine keeps its own name."""
    return PLATFORMS.get(machine, f"linux/{machine}")


# --- the lock --------------------------------------------------------------------------------

def lock_path(ctx: Any, cell_id: str) -> Path:
    """locks/<cell-id>.txt beside the matrix (ctx: anything with a `root`)."""
    return inside(Path(ctx.root) / LOCKS_DIR, f"{cell_id}.txt")


def read_lock_text(path: Path, cell_id: str) -> str | None:
    """The one reader of a committed lock: its text, None when there is none; a binary or
    unreadable one is a DamagedStateFile naming the file and the fix."""
    if not path.is_file():
        return None
    return read_state_text(path, "lock file", f"run `infermatrix lock --select {cell_id}` to "
                           "write it again, then commit it")


def lock_stamp(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime in ns, size) of a lock file, None when there is none: what tells a cached
    CellSpec (Context.spec) that the lock was written since."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def check_lock_files(ctx: Any, plans: Iterable[Any]) -> None:
    """Resolve every planned cell's spec (Context.spec: its lock read through the loader, once
    for the run), so a damaged lock is named up front."""
    for plan in plans:
        if plan.planned:
            ctx.spec(plan)


# a `name==version` line of a uv lock (an extra, `name[extra]==version`, is allowed)
PIN_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass
class LockedPackage:
    """One pin of a lock with the sha256 hashes of its files (its `--hash=` continuations)."""

    name: str
    version: str
    hashes: list[str] = field(default_factory=list)


def lock_packages(text: str | None) -> list[LockedPackage]:
    """Every `name==version` of a uv lock with its `--hash=sha256:` lines (continuations): the
    one parser of a lock's body (pinned_packages, the SBOM and the kernel sdist hashes read it)."""
    found: list[LockedPackage] = []
    current: LockedPackage | None = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            if not raw.startswith(" "):
                current = None
            continue
        match = PIN_LINE.match(line)
        if match and not raw.startswith((" ", "\t")):
            current = LockedPackage(match.group(1), match.group(2))
            found.append(current)
        elif not raw.startswith((" ", "\t")):
            current = None
        if current is not None:
            current.hashes += _HASH.findall(line)
    return found


def pinned_packages(text: str | None) -> dict[str, str]:
    """canonical name -> version of every `name==version` pin of a lock file."""
    return {canonicalize_name(p.name): p.version for p in lock_packages(text)}


def pinned_version(pins: Mapping[str, str], package: str) -> str | None:
    return pins.get(canonicalize_name(package))


def header_lines(text: str) -> list[str]:
    """The comment lines a lock file starts with (lock.header wrote them)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def lock_blocks(text: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (the pin's lines, the packages that need it ("# via" annotations))."""
    blocks: dict[str, tuple[str, set[str]]] = {}
    current: str | None = None
    lines: list[str] = []
    for line in text.splitlines() + [""]:
        starts = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
        if (starts or not line.startswith(" ")) and current is not None:
            via: set[str] = set()
            for ann in lines:
                ann = ann.strip()
                if ann.startswith("# via "):
                    ann = ann[6:]
                elif ann.startswith("#   "):
                    ann = ann[4:]
                else:
                    continue
                if not ann.startswith("-r "):
                    via.add(canonicalize_name(ann.strip()))
            blocks[current] = ("\n".join(lines), via)
            current, lines = None, []
        if starts:
            current, lines = canonicalize_name(starts.group(1)), [line]
        elif current is not None:
            lines.append(line)
    return blocks


def lock_subset(text: str, root: str) -> str:
    """The part of a lock that installs `root` and everything it needs (from uv's "# via"
    annotations), with the index lines: e.g. torch alone, hash-checked, for a toolchain stage
    that kernels compile against before the whole lock is installed."""
    blocks = lock_blocks(text)
    wanted: set[str] = {canonicalize_name(root)}
    if root not in blocks and canonicalize_name(root) not in blocks:
        raise StageFailure(f"{root} is not in this lock")
    grew = True
    while grew:  # a package belongs when something already in the set needs it
        grew = False
        for name, (_, via) in blocks.items():
            if name not in wanted and via & wanted:
                wanted.add(name)
                grew = True
    index_lines = [ln for ln in text.splitlines()
                   if ln.startswith(("--index-url", "--extra-index-url"))]
    body = [blocks[name][0] for name in sorted(wanted)]
    return "\n".join(index_lines + [""] + body) + "\n"


def lock_without_comments(text: str) -> str:
    """A lock's pins, hashes and index options without its comment lines (uv's header, which
    names the cell, and the `# via` annotations): the text a build context carries, so that
    cells with the same pins get the same file, and BuildKit the same layers. Comments never
    change what `uv pip install --require-hashes` installs."""
    return "\n".join(line for line in text.splitlines()
                     if not line.lstrip().startswith("#")) + "\n"


def kernel_header_entries(text: str | None) -> list[tuple[str, str]]:
    """(package, what the header says of its source: `pkg==v sdist F sha256:H`, `tree:H`)
    of each `# kernel NAME: ...` line of a lock header (lock.header wrote them)."""
    entries = []
    for line in header_lines(text or ""):
        if line.startswith("# kernel ") and ": " in line:
            said = line.split(": ", 1)[1]
            entries.append((said.split("==", 1)[0], said))
    return entries


_KERNEL_PIN = re.compile(r"^# kernel [^:]*: ([A-Za-z0-9._-]+)==(\S+)(?: sdist (\S+) "
                         r"sha256:([0-9a-f]{64}))?")


def kernel_pins_from_lock(text: str) -> dict[str, dict[str, str]]:
    """package -> {"version", "sdist", "sha256"} of the kernel pins in a lock header (render
    can turn them into `pkg==v --hash=sha256:...` lines for a hash-checked kernel build)."""
    pins: dict[str, dict[str, str]] = {}
    for line in header_lines(text):
        match = _KERNEL_PIN.match(line)
        if match:
            name, version, sdist, sha = match.groups()
            pins[canonicalize_name(name)] = {"version": version, "sdist": sdist or "",
                                             "sha256": sha or ""}
    return pins


# --- bases -----------------------------------------------------------------------------------

def base_chain(matrix: Matrix, name: str) -> list[str]:
    """The base and the bases it stands on through `from:` (a `wheels` base runs on the OS of
    its `from` base), nearest first; stops at a cycle or an undefined name."""
    definitions = matrix.bases["definitions"]
    chain: list[str] = []
    while name and name not in chain:
        chain.append(name)
        name = (definitions.get(name) or {}).get("from") or ""
    return chain


def os_base(matrix: Matrix, name: str) -> str:
    """The base of the chain that gives the OS: the first that is not a `wheels` base."""
    definitions = matrix.bases["definitions"]
    for base in base_chain(matrix, name):
        if (definitions.get(base) or {}).get("strategy") != "wheels":
            return base
    return base_chain(matrix, name)[-1]


# --- kernels ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelPin:
    """One compiled kernel package of a cell, its version resolved."""

    name: str  # key of build.kernels
    package: str
    declared: str  # the version matrix.yaml gives ("0.2.6", "match-engine")
    version: str | None  # the version built: declared, or the lock's for match-engine
    scope: str  # "pypi" (an sdist), "source-tree" (build.kernels.<k>.path), "match-engine"
    path: str | None = None
    sdist: str | None = None  # the sdist file the lock header pins
    sdist_sha256: str | None = None
    sdist_version: str | None = None  # the version of that sdist (another one: a stale lock)
    profile: str = "serve"  # the image profile that loads it (kernel_profile)

    @property
    def train(self) -> bool:
        """Only the training profile loads it: in the `train` target, not the serving image."""
        return self.profile == TRAIN

    @property
    def requirement(self) -> str:
        """`package==version`, or the bare package when no version is known."""
        return f"{self.package}=={self.version}" if self.version else self.package

    @property
    def pinned(self) -> bool:
        """Whether matrix.yaml itself pins the version (not a match-engine one)."""
        return self.scope != MATCH_ENGINE and bool(self.declared) and self.declared[0].isdigit()


SERVE = "serve"  # build.kernels.<name>.profile: in the serving image (the default)
TRAIN = "train"  # only in the `train` target, built FROM the serving image (issue 47)
PROFILES = (SERVE, TRAIN)


def kernel_profile(entry: Mapping[str, Any]) -> str:
    """The image profile that loads a compiled kernel (`build.kernels.<name>.profile`, data:
    matrix.yaml says which kernels are training-only, never a name in code)."""
    value = str(entry.get("profile") or SERVE)
    return value if value in PROFILES else SERVE


def kernel_version(entry: Mapping[str, Any], pins: Mapping[str, str]) -> str | None:
    """The version a build.kernels entry builds: its own, or for match-engine the lock's."""
    declared = str(entry.get("version", ""))
    if declared == MATCH_ENGINE:
        return pinned_version(pins, entry["package"])
    return declared or None


def kernel_pins(matrix: Matrix, names: list[str], pins: Mapping[str, str],
                header_pins: Mapping[str, Mapping[str, str]] | None = None) -> list[KernelPin]:
    known = matrix.build.get("kernels", {})
    result = []
    for name in names:
        entry = known.get(name) or {}
        declared = str(entry.get("version", ""))
        scope = "source-tree" if entry.get("path") else (
            MATCH_ENGINE if declared == MATCH_ENGINE else "pypi")
        sdist = (header_pins or {}).get(canonicalize_name(entry.get("package", name))) or {}
        result.append(KernelPin(name=name, package=entry.get("package", name), declared=declared,
                                version=kernel_version(entry, pins) if entry else None,
                                scope=scope, path=entry.get("path"),
                                sdist=sdist.get("sdist") or None,
                                sdist_sha256=sdist.get("sha256") or None,
                                sdist_version=sdist.get("version") or None,
                                profile=kernel_profile(entry)))
    return result


# --- the launch ------------------------------------------------------------------------------

def serve_args(matrix: Matrix, cell: Cell, backend: str | None) -> list[str]:
    """The serve command's flags after the engine's `serve` words: the model card's flags for
    the engine, the arch's, then the attention flag with the backend the planner chose. The
    one place they are put together (the plan keeps them, Launch carries them)."""
    engine = matrix.engines[cell.engine]
    per_arch = engine.get("arch", {}).get(cell.arch, {})
    args = list(matrix.model["launch"].get(cell.engine, [])) + list(per_arch.get("args", []))
    if backend and engine.get("attention_flag"):
        args += [engine["attention_flag"], backend]
    return args


@dataclass(frozen=True)
class Launch:
    """How the engine server is started; `{port}` and `{model}` are filled by `command`."""

    serve: tuple[str, ...]
    args: tuple[str, ...]  # model card flags + per-arch flags + the attention flag (plan)
    env: dict[str, str]
    shm_size: str
    port: int
    health: str | None
    attention_backend: str | None
    gpu: bool

    def command(self, port: int | None = None, model: str = CONTAINER_MODEL) -> list[str]:
        port = self.port if port is None else port
        return [part.format(port=port, model=model) for part in self.serve] + list(self.args)

    def template(self) -> list[str]:
        """The command with `{port}` and `{model}` left in (images.lock, `pull` fills them)."""
        return list(self.serve) + list(self.args)

    def shell_words(self) -> tuple[list[str], bool]:
        """The command as words of a shell script (`{port}`/`{model}` as "${PORT}"/"${MODEL}",
        the rest quoted: the image's serve script, render) and whether it needs MODEL."""
        words, needs_model = [], False
        for token in self.template():
            if "{port}" in token or "{model}" in token:
                needs_model |= "{model}" in token
                escaped = re.sub(r'(["\\`$])', r"\\\1", token)
                escaped = escaped.replace("{port}", "${PORT}").replace("{model}", "${MODEL}")
                words.append(f'"{escaped}"')
            else:
                words.append(shlex.quote(token))
        return words, needs_model

    def as_run(self) -> dict[str, Any]:
        """images.lock's `run` of the cell (publish): the template, env, GPU, shm, port, the
        health path and the attention backend: all a consumer's deploy or verify needs."""
        return {"command": self.template(), "env": dict(self.env), "gpu": self.gpu,
                "shm_size": self.shm_size, "port": self.port, "health": self.health,
                "attention_backend": self.attention_backend}

    @classmethod
    def from_locked(cls, run: Mapping[str, Any], health: str | None = None) -> "Launch":
        """The launch an images.lock entry recorded (`run`, as_run): what was tested is what
        deploy starts, with no re-planning. `health`: for an entry written before images.lock
        kept the health path."""
        return cls(serve=tuple(run.get("command", [])), args=(), env=dict(run.get("env", {})),
                   shm_size=run.get("shm_size") or DEFAULT_SHM["gpu" if run.get("gpu") else "cpu"],
                   port=int(run.get("port") or DEFAULT_PORT),
                   health=run.get("health") or health,
                   attention_backend=run.get("attention_backend"), gpu=bool(run.get("gpu")))


def locked_command(run: Mapping[str, Any], port: int, model_dir: str | Path | None = None,
                   model: str = CONTAINER_MODEL) -> list[str]:
    """An images.lock entry's serve command (its `run`, Launch.as_run) with `{port}` and
    `{model}` filled; plus its MTP flags (run.mtp_args) when `model_dir` holds the MTP head's
    weights (model/mtp.py): what pull, deploy and verify start."""
    from .mtp import find_weights

    command = [part.replace("{port}", str(port)).replace("{model}", model)
               for part in run.get("command", [])]
    mtp = run.get("mtp_args") or []
    if mtp and model_dir is not None and Path(model_dir).is_dir() \
            and find_weights(Path(model_dir)).present:
        command += list(mtp)
    return command


def launch_of(matrix: Matrix, plan: CellPlan) -> Launch:
    assert plan.settings is not None, f"{plan.id} is not planned"
    engine = matrix.engines[plan.cell.engine]
    smoke = matrix.smoke or {}
    shm = smoke.get("shm_size") or DEFAULT_SHM["gpu" if plan.cell.is_gpu else "cpu"]
    return Launch(serve=tuple(engine.get("serve", [])), args=tuple(plan.settings.engine_args),
                  env=dict(plan.settings.env), shm_size=shm, port=DEFAULT_PORT,
                  health=engine.get("health"),
                  attention_backend=plan.settings.attention_backend, gpu=plan.cell.is_gpu)


# --- the spec --------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellSpec:
    plan: CellPlan
    platform: str
    machine: str
    python: str
    base: str
    base_chain: tuple[str, ...]
    engine_package: str | None
    kernels: tuple[KernelPin, ...]
    lock_path: Path
    lock_pins: dict[str, str] = field(default_factory=dict)  # empty: no committed lock
    launch: Launch | None = None

    @property
    def cell(self) -> Cell:
        return self.plan.cell

    @property
    def id(self) -> str:
        return self.plan.id

    @property
    def has_lock(self) -> bool:
        return self.lock_path.is_file()

    @cached_property
    def lock_text(self) -> str | None:
        return read_lock_text(self.lock_path, self.id)

    @property
    def driver_floor(self) -> str | None:
        """The oldest driver that runs the image (the plan's: the CUDA runtime and the PTX ISA
        of PTX-only objects), not just the CUDA's minimum (rules.min_driver_for)."""
        return self.plan.settings.driver_floor if self.plan.settings else None

    @property
    def attention_backend(self) -> str | None:
        """The backend the plan chose (matrix.yaml engines.<e>.attention_backend), if any."""
        return self.plan.settings.attention_backend if self.plan.settings else None

    @property
    def serve_kernels(self) -> tuple[KernelPin, ...]:
        """The kernels in the serving image (the `runtime` target)."""
        return tuple(k for k in self.kernels if not k.train)

    @property
    def train_kernels(self) -> tuple[KernelPin, ...]:
        """The training-only kernels: the `train` target, FROM the serving image (issue 47)."""
        return tuple(k for k in self.kernels if k.train)

    @property
    def engine_requirement(self) -> str | None:
        return f"{self.engine_package}=={self.cell.engine_version}" \
            if self.engine_package else None


def resolve_spec(ctx: Any, plan: CellPlan) -> CellSpec:
    """The CellSpec of a planned cell (reads its lock once). Steps take it from
    `Context.spec(plan)`, which resolves each cell once per run."""
    settings = plan.settings
    if settings is None:
        raise UsageError(f"cell {plan.id} is {plan.status}, not planned")
    matrix = ctx.matrix
    path = lock_path(ctx, plan.id)
    text = read_lock_text(path, plan.id)
    pins = pinned_packages(text)
    spec = CellSpec(
        plan=plan, platform=settings.platform, machine=machine_of(settings.platform),
        python=settings.python, base=settings.base,
        base_chain=tuple(base_chain(matrix, settings.base)),
        engine_package=settings.engine_package,
        kernels=tuple(kernel_pins(matrix, list(settings.kernels), pins,
                                  kernel_pins_from_lock(text) if text else {})),
        lock_path=path, lock_pins=pins, launch=launch_of(matrix, plan))
    spec.__dict__["lock_text"] = text  # the cached_property, filled: the lock is read once
    return spec
