"""Several builders: the Docker engines of `build.builders` (or `--builder`) build the cells
between them (issue 19). Nothing is scheduled beyond one queue per engine.

- Each builder is asked for its CPUs, memory and platform (`docker info`, engine module).
  One that does not answer at the start is left out, said so; its cells go to the others
  (a rerun after an engine died resumes on the survivors).
- A cell goes to a builder of its image platform (declared `platforms`, else the engine's
  own): the one whose queue is shortest per CPU, memory breaking ties; a cell that a builder
  built before (the journal says which) stays there while that builder is up, so a rerun
  finds its image where it left it.
- The compile plan (MAX_JOBS, NVCC_THREADS) of each builder is made from its own figures.
- A base image a cell builds FROM that the builder lacks and this machine's engine has (the
  debootstrap bases are made here, never in a registry) is copied over first (save | load).
- The kernel cache stays client-side (kernel stages export their wheels to this machine):
  one cache serves every builder of a platform (the key carries the platform); each entry
  says which builder compiled it.
- The journal records per cell which builder built it (`builder`, top level and in the build
  details).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config import Matrix
from . import docker as engine
from .docker import DockerFacts  # `engine` below is also a field's name in Builder
from ..errors import UsageError
from ..model import compileplan
from ..model.spec import CellSpec


@dataclass
class Builder:
    endpoint: engine.Endpoint
    engine: engine.Engine
    facts: DockerFacts
    down: str | None = None  # why it stopped building (it died mid-run)
    queue: list[CellSpec] = field(default_factory=list)
    compile: compileplan.CompilePlan | None = None  # sized from this engine's figures

    @property
    def name(self) -> str:
        return self.endpoint.name

    @property
    def platforms(self) -> tuple[str, ...]:
        return self.endpoint.platforms or (self.facts.platform,)

    def identity(self) -> dict[str, Any]:
        """What the journal says about the builder of a cell."""
        return {"name": self.name, "endpoint": self.endpoint.address,
                "platform": self.facts.platform, "cpus": self.facts.cpus,
                "memory_bytes": self.facts.memory,
                "server_version": self.facts.server_version}

    def reading(self) -> compileplan.HostReading:
        """The compile planner's host reading, from the engine's own figures."""
        return compileplan.HostReading(mem_available=self.facts.memory,
                                       cpus_affinity=max(1, self.facts.cpus))

    def describe(self) -> str:
        return f"builder {self.name} ({self.endpoint.address}: {self.facts.describe()})"


def _resolve(matrix: Matrix, value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (matrix.root / path).resolve())


def endpoints_of_matrix(matrix: Matrix) -> list[engine.Endpoint]:
    """build.builders (validated by the schema); TLS files relative to matrix.yaml."""
    found = []
    for entry in matrix.build.get("builders") or []:
        tls = entry.get("tls") or {}
        found.append(engine.Endpoint(
            name=entry["name"], host=entry.get("endpoint"), context=entry.get("context"),
            tls_ca=_resolve(matrix, tls.get("ca")), tls_cert=_resolve(matrix, tls.get("cert")),
            tls_key=_resolve(matrix, tls.get("key")), tls_verify=bool(tls.get("verify", True)),
            platforms=tuple(entry.get("platforms") or ())))
    return found


def endpoints_for(matrix: Matrix, flags: list[str]) -> list[engine.Endpoint]:
    """`--builder` flags (they replace build.builders; a flag naming a builder of the matrix
    by name takes its settings), else build.builders; empty: the one default engine."""
    configured = endpoints_of_matrix(matrix)
    if not flags:
        return configured
    by_name = {e.name: e for e in configured}
    chosen = [by_name[f] if f in by_name else engine.parse_builder(f, i)
              for i, f in enumerate(flags)]
    names = [e.name for e in chosen]
    if len(set(names)) != len(names):
        raise UsageError(f"--builder: two builders share a name ({', '.join(names)}); name "
                         "them: --builder NAME=ENDPOINT")
    return chosen


def connect(endpoints: list[engine.Endpoint], echo: Callable[[str], None]
            ) -> tuple[list[Builder], dict[str, str]]:
    """(builders that answer, with their figures; name -> why for the others)."""
    up, down = [], {}
    for endpoint in endpoints:
        engine_of = engine.Engine(endpoint)
        try:
            up.append(Builder(endpoint, engine_of, engine_of.facts()))
            echo(up[-1].describe())
        except Exception as exc:  # noqa: BLE001 - an engine that does not answer is left out
            down[endpoint.name] = f"{endpoint.address} does not answer: {exc}".splitlines()[0]
            echo(f"builder {endpoint.name} left out: {down[endpoint.name]}")
    return up, down


def _load(builder: Builder) -> float:
    return (len(builder.queue) + 1) / max(1, builder.facts.cpus)


def assign(cells: list[CellSpec], builders: list[Builder], previous: dict[str, str],
           down: dict[str, str]) -> dict[str, str]:
    """Fill each builder's queue; return cell id -> why no builder took it. `previous`: the
    builder that built a cell before (journal), kept while it is up and fits."""
    by_name = {b.name: b for b in builders}
    refused: dict[str, str] = {}
    for cell in cells:
        platform = cell.platform
        fitting = [b for b in builders if platform in b.platforms]
        if not fitting:
            have = ", ".join(f"{b.name} {'/'.join(b.platforms)}" for b in builders) or "none up"
            gone = "".join(f"; {name} is down: {why}" for name, why in down.items())
            refused[cell.id] = (f"no builder for {platform} (builders: {have}{gone}); add one "
                                f"with --builder or build.builders")
            continue
        before = by_name.get(previous.get(cell.id, ""))
        chosen = before if before in fitting else \
            min(fitting, key=lambda b: (_load(b), -b.facts.memory, b.name))
        chosen.queue.append(cell)
    return refused


_FROM = re.compile(r"^[ \t]*FROM[ \t]+(?:--platform=\S+[ \t]+)?(\S+)(?:[ \t]+AS[ \t]+(\S+))?",
                   re.IGNORECASE | re.MULTILINE)


def base_refs(dockerfile_text: str) -> list[str]:
    """The images a Dockerfile builds FROM (not its own stages, not `scratch`, not a stage
    picked by a build arg: `native-python-${BUILDARCH}`)."""
    stages: set[str] = set()
    refs: list[str] = []
    for match in _FROM.finditer(dockerfile_text):
        ref, alias = match.group(1), match.group(2)
        if ref.lower() != "scratch" and ref.lower() not in stages and "$" not in ref \
                and ref not in refs:
            refs.append(ref)
        if alias:
            stages.add(alias.lower())
    return refs


def ensure_bases(builder: Builder, local: engine.Engine, dockerfile_text: str,
                 echo: Callable[[str], None], log_path: Path | None = None) -> None:
    """Copy to the builder the base images it lacks that this machine's engine holds."""
    for ref in base_refs(dockerfile_text):
        if builder.engine.image_exists(ref) or not local.image_exists(ref):
            continue
        echo(f"[{builder.name}] copying base {ref} from this machine's engine")
        local.copy_image_to(ref, builder.engine, log_path=log_path)
