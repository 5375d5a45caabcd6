"""BuildKit builds through a Docker CLI (`build_image`): only the CLI carries a build session
(secrets, cache mounts, `--output`). Every CLI command runs through `proc.run` and is logged
exactly, build args and secret *ids* included (a secret is `--secret id=NAME,src=FILE`: the
file's content never reaches argv or a log).

Which CLI can build: buildx when `docker buildx version` works; otherwise a client from before
Docker 23 runs the daemon's built-in BuildKit with DOCKER_BUILDKIT=1 (Debian's docker.io 20.10).
A 23+ client without buildx cannot, and is passed over. INFERMATRIX_DOCKER names a client
explicitly."""

from __future__ import annotations

import functools
import os
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Literal

from .. import proc
from ..errors import MissingTool, StageFailure, UsageError
from .host import Host, _sdk_log, _translated, log
from .images import Images

BuildMode = Literal["buildx", "buildkit"]


@dataclass(frozen=True)
class BuildClient:
    """A docker CLI able to run BuildKit builds, and how to call it."""

    binary: str
    mode: BuildMode
    version: str

    def build_argv(self) -> list[str]:
        return [self.binary, "buildx", "build"] if self.mode == "buildx" else [self.binary, "build"]

    def env(self) -> dict[str, str]:
        return {} if self.mode == "buildx" else {"DOCKER_BUILDKIT": "1"}

    def describe(self) -> str:
        how = "buildx" if self.mode == "buildx" else "built-in BuildKit, DOCKER_BUILDKIT=1"
        return f"{self.binary} (client {self.version}, {how})"


def candidate_clients() -> list[str]:
    """INFERMATRIX_DOCKER, then every `docker` on PATH in order, then /usr/bin/docker."""
    found: list[str] = []
    explicit = os.environ.get("INFERMATRIX_DOCKER")
    if explicit:
        found.append(explicit)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        path = Path(directory or ".") / "docker"
        if path.is_file() and os.access(path, os.X_OK):
            found.append(str(path))
    found.append("/usr/bin/docker")
    unique: dict[str, str] = {}
    for candidate in found:
        if Path(candidate).exists():
            unique.setdefault(os.path.realpath(candidate), candidate)
    return list(unique.values())


def parse_client_version(text: str) -> str | None:
    """`Docker version 20.10.24+dfsg1, build 297e128` -> `20.10.24+dfsg1`."""
    match = re.search(r"version\s+v?([0-9][^\s,]*)", text)
    return match.group(1) if match else None


def classic_builder_has_buildkit(version: str) -> bool:
    """Clients before 23.0 carry BuildKit in `docker build`; later ones delegate to buildx."""
    major = re.match(r"(\d+)", version)
    return major is not None and int(major.group(1)) < 23


def probe_client(binary: str) -> BuildClient | None:
    """How `binary` can run BuildKit builds, or None when it cannot."""
    version_out = proc.run([binary, "--version"], check=False, timeout=30)
    version = parse_client_version(version_out.output) if version_out.returncode == 0 else None
    if version is None:
        return None
    buildx = proc.run([binary, "buildx", "version"], check=False, timeout=30)
    if buildx.returncode == 0 and "buildx" in buildx.output.lower():
        return BuildClient(binary, "buildx", version)
    if classic_builder_has_buildkit(version):
        return BuildClient(binary, "buildkit", version)
    return None


@functools.lru_cache(maxsize=1)
def build_client() -> BuildClient:
    """The first client that can run BuildKit builds (cached for the process)."""
    tried = []
    for binary in candidate_clients():
        client = probe_client(binary)
        if client is not None:
            log.info("# build client: %s", client.describe())
            return client
        tried.append(binary)
    raise MissingTool(
        "no Docker client here can run BuildKit builds (tried: "
        f"{', '.join(tried) or 'none on PATH'})", fix="install the buildx plugin, or Debian's "
        "docker.io client (20.10, /usr/bin/docker), or set INFERMATRIX_DOCKER=/path/to/docker")


def docker_cli() -> str:
    """A docker CLI for non-build commands (import, ...): the build client's binary."""
    return build_client().binary


@dataclass(frozen=True)
class BuildRequest:
    """Everything one `docker build` needs; `argv()` is the exact command line."""

    context_dir: Path
    dockerfile: Path | None = None  # default: <context>/Dockerfile
    tag: str | None = None
    target: str | None = None
    build_args: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, Path] = field(default_factory=dict)  # id -> file (never its content)
    labels: dict[str, str] = field(default_factory=dict)
    output_dir: Path | None = None  # `--output type=local,dest=...` instead of an image
    no_cache: bool = False  # `--no-cache` (verify-repro builds twice from nothing)
    platform: str | None = None  # `--platform linux/arm64` (None: the engine's own)

    def argv(self, client: BuildClient, iidfile: Path | None = None) -> list[str]:
        """The build's command line; an image's id is written to `iidfile`."""
        argv = client.build_argv() + ["--progress=plain"]
        if self.platform:
            argv += ["--platform", self.platform]
        if self.no_cache:
            argv.append("--no-cache")
        if self.dockerfile is not None:
            argv += ["--file", str(self.dockerfile)]
        if self.target:
            argv += ["--target", self.target]
        for key, value in sorted(self.build_args.items()):
            argv += ["--build-arg", f"{key}={value}"]
        for secret_id, path in sorted(self.secrets.items()):
            argv += ["--secret", f"id={secret_id},src={path}"]
        for key, value in sorted(self.labels.items()):
            argv += ["--label", f"{key}={value}"]
        if self.output_dir is not None:
            argv += ["--output", f"type=local,dest={self.output_dir}"]
        else:
            if client.mode == "buildx":
                argv.append("--load")
            if self.tag:
                argv += ["--tag", self.tag]
            if iidfile is not None:
                argv += ["--iidfile", str(iidfile)]
        argv.append(str(self.context_dir))
        return argv


def check_secrets(secrets: dict[str, Path]) -> None:
    for secret_id, path in secrets.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", secret_id):
            raise UsageError(f"bad secret id {secret_id!r}: use letters, digits, _ . -")
        if not Path(path).is_file():
            raise UsageError(f"secret {secret_id!r}: file {path} does not exist",)


class Builds(Images):
    def prune_build_cache(self, log_path: Path | None = None,
                          keep_bytes: int | None = None) -> None:
        """`docker builder prune --all --force`: BuildKit's cache records no build is using
        (layers of removed images, cache mounts); images and running builds are kept. With
        `keep_bytes` (`--keep-storage`), BuildKit removes the least recently used records
        only until the cache holds that much: the newest (the uv cache mount the next cell
        reuses) stay."""
        keep = ["--keep-storage", str(keep_bytes)] if keep_bytes is not None else []
        proc.run(self.cli(docker_cli(), ["builder", "prune", "--all", "--force", *keep]),
                 env=self.cli_env() or None, log_path=log_path, timeout=1800)

    def build_cache_bytes(self) -> int:
        """What BuildKit's cache holds (`docker system df`'s Build Cache size)."""
        _sdk_log("docker system df")
        with _translated("docker system df"):
            records = self.sdk().df().get("BuildCache") or []
        return sum(int(r.get("Size") or 0) for r in records)

    def build_image(self, request: BuildRequest, log_path: Path | None = None,
                    timeout: float | None = None,
                    on_line: Callable[[str], None] | None = None) -> str:
        """Run one BuildKit build; return the image id ("" when exporting to `output_dir`).
        `on_line` sees each line of BuildKit's plain progress as it comes (a progress display).

        Raises CommandFailed (exact command + log tail) when the build fails or times out.
        """
        client = build_client()
        check_secrets(request.secrets)
        if request.output_dir is not None:
            request.output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="infermatrix-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            argv = request.argv(client, iidfile)
            proc.run(self.cli(argv[0], argv[1:]), env={**client.env(), **self.cli_env()},
                     log_path=log_path, timeout=timeout, on_line=on_line)
            if request.output_dir is not None:
                return ""
            image_id = iidfile.read_text().strip() if iidfile.is_file() else ""
        if not image_id and request.tag:
            image_id = self.image_id_of(request.tag) or ""
        if not image_id:
            raise StageFailure(f"build of {request.context_dir} finished without an image id")
        return image_id

    def import_rootfs(self, tar_path: Path, ref: str, changes: list[str] | None = None,
                      log_path: Path | None = None, timeout: float | None = 1800) -> str:
        """`docker import` a rootfs tarball under `ref`; returns the image id."""
        argv = self.cli(docker_cli(), ["import"])
        for change in changes or []:
            argv += ["--change", change]
        argv += [str(tar_path), ref]
        proc.run(argv, env=self.cli_env() or None, log_path=log_path, timeout=timeout)
        image_id = self.image_id_of(ref)
        if not image_id:
            raise StageFailure(f"docker import finished but {ref} is not there")
        return image_id

    def copy_image_to(self, ref: str, target: Host, log_path: Path | None = None,
                      timeout: float | None = 3600) -> None:
        """`docker save REF | docker load` from this engine into `target` (a builder that
        lacks a local base image: it cannot pull one that exists only here)."""
        def side(engine_of: Host, *command: str) -> str:
            env = [f"{k}={v}" for k, v in engine_of.cli_env().items()]
            return shlex.join([*(["env", *env] if env else []),
                               *engine_of.cli(docker_cli(), list(command))])
        line = f"set -o pipefail; {side(self, 'save', ref)} | {side(target, 'load')}"
        proc.run(["bash", "-c", line], log_path=log_path, timeout=timeout)
