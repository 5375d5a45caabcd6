"""RecordingEngine: a FAKE Docker engine for fast wiring tests of the pipeline (no Docker).

It records every call the stages make and answers with just enough for the next stage to run:
builds return made-up image ids (kernel builds leave a dummy wheel), inspected images carry
the labels they were built with, containers "exit 0" with the result line their program
would print (scripted per test). It proves the wiring (which step calls what, with which
arguments, in which order, which cells drop out), never that an image works: the real
end-to-end test is tests/docker/test_pipeline.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from infermatrix.engine.docker import BuildRequest, ContainerSpec, Engine
from infermatrix.errors import CommandFailed

# (image, entrypoint, command) -> (exit code, output) of a container
Script = Callable[[str, list[str], list[str]], tuple[int, str]]


@dataclass
class Call:
    name: str
    args: dict[str, Any]


@dataclass
class RecordingEngine(Engine):
    """A fake engine for wiring tests; `fail_builds`: cell ids whose final build fails."""

    script: Script = lambda image, entrypoint, command: (0, "")
    fail_builds: set[str] = field(default_factory=set)
    present: set[str] = field(default_factory=set)  # refs that exist (bases, say)
    data_root: Path | None = None  # a folder standing for Docker's data root (None: remote)
    cache_bytes: int = 0  # what its BuildKit cache holds (`docker system df`)
    calls: list[Call] = field(default_factory=list)
    images: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> inspect record
    tags: dict[str, str] = field(default_factory=dict)  # ref -> id
    _containers: dict[str, tuple[str, list[str], list[str]]] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        super().__init__()

    def _record(self, call: str, **args: Any) -> None:
        self.calls.append(Call(call, args))

    def named(self, call: str) -> list[Call]:
        return [c for c in self.calls if c.name == call]

    # -- clients -----------------------------------------------------------------------------
    def sdk(self) -> Any:
        raise AssertionError("the recording engine has no SDK client: a stage bypassed Engine")

    def available(self) -> bool:
        return True

    def host_facts(self) -> dict[str, Any]:
        """What the smoke records of its engine's host: made up, and said so."""
        self._record("host_facts")
        return {"engine": self.label(), "name": "recording-engine (FAKE)"}

    # -- disk ------------------------------------------------------------------------------
    def local_data_root(self) -> Path | None:
        return self.data_root

    def prune_build_cache(self, log_path: Path | None = None,
                          keep_bytes: int | None = None) -> None:
        self._record("prune_build_cache", keep_bytes=keep_bytes)

    def build_cache_bytes(self) -> int:
        return self.cache_bytes

    # -- builds ------------------------------------------------------------------------------
    def build_image(self, request: BuildRequest, log_path: Path | None = None,
                    timeout: float | None = None, on_line: Any = None) -> str:
        tag, target, output_dir = request.tag, request.target, request.output_dir
        self._record("build_image", context=str(request.context_dir), tag=tag, target=target,
                     build_args=dict(request.build_args), secrets=sorted(request.secrets),
                     output_dir=output_dir, no_cache=request.no_cache, platform=request.platform)
        if output_dir is not None:  # a kernel stage: leave the wheel it would export
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            package = (target or "kernel-x").removeprefix("kernel-").replace("-", "_")
            (Path(output_dir) / f"{package}-0.1.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
            return ""
        cell_id = (tag or "").split("/")[-1].split(":")[0]
        if cell_id in self.fail_builds:
            raise CommandFailed(f"docker build {request.context_dir}", 1, "broken on purpose",
                                log_path)
        image_id = "sha256:" + hashlib.sha256(f"{tag}{next(self._ids)}".encode()).hexdigest()
        cell_labels = {"io.infermatrix.cell": cell_id, **request.labels}
        self.images[image_id] = {"Id": image_id, "Size": 1_000_000,
                                 "Config": {"Labels": cell_labels}, "RepoTags": [tag]}
        if tag:
            self.tags[tag] = image_id
        return image_id

    # -- images ------------------------------------------------------------------------------
    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        image_id = self.tags.get(ref, ref)
        if image_id in self.images:
            return self.images[image_id]
        if ref in self.present:
            return {"Id": "sha256:" + hashlib.sha256(ref.encode()).hexdigest(), "Size": 1,
                    "Config": {"Labels": {}}}
        return None

    def tag_image(self, image: str, ref: str) -> None:
        self._record("tag_image", image=image, ref=ref)
        self.tags[ref] = image

    def remove_image(self, ref: str, force: bool = False) -> bool:
        self._record("remove_image", ref=ref)
        return self.tags.pop(ref, None) is not None

    def commit_with_labels(self, image: str, ref: str, labels: dict[str, str]) -> str:
        self._record("commit_with_labels", image=image, ref=ref, labels=labels)
        derived = "sha256:" + hashlib.sha256(f"{image}{ref}".encode()).hexdigest()
        self.images[derived] = {**self.images.get(image, {}), "Id": derived}
        self.tags[ref] = derived
        return derived

    # -- containers --------------------------------------------------------------------------
    def run_container(self, spec: ContainerSpec) -> str:
        command, entrypoint = list(spec.command or []), list(spec.entrypoint or [])
        self._record("run_container", **{**vars(spec), "command": command,
                                         "entrypoint": entrypoint})
        container_id = f"container-{next(self._ids)}"
        self._containers[container_id] = (spec.image, entrypoint, command)
        return container_id

    @contextlib.contextmanager
    def container(self, image: str, command: list[str] | None = None, *,
                  name: str | None = None, prefix: str = "infermatrix",
                  **settings: Any) -> Iterator[str]:
        name = name or f"{prefix}-fake-{next(self._ids)}"
        container_id = self.run_container(ContainerSpec(image, command, name=name, **settings))
        try:
            yield container_id
        finally:
            self._record("remove_container", container=container_id)

    def _run(self, container_id: str) -> tuple[int, str]:
        return self.script(*self._containers[container_id])

    def wait_container(self, container_id: str, timeout: float | None = None) -> int:
        return self._run(container_id)[0]

    def container_logs(self, container_id: str, tail: int | str = "all") -> str:
        return self._run(container_id)[1]

    def stop_container(self, container_id: str, timeout: int = 10) -> None:
        self._record("stop_container", container=container_id)

    def remove_container(self, container_id: str, force: bool = True) -> None:
        self._record("remove_container", container=container_id)

    def copy_from_image(self, image: str, paths: Any, dest_dir: Path) -> dict[str, Path]:
        self._record("copy_from_image", image=image, paths=list(paths))
        return {}


def result_line(**fields: Any) -> str:
    """The line a harness program ends with (harness._result)."""
    from infermatrix.harness._result import RESULT_MARKER

    return RESULT_MARKER + json.dumps(fields)
