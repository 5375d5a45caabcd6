"""Containers of the engine: run (GPUs and mounts included; a remote engine gets this machine's
files as copies), exec, logs, wait, stop, remove."""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import os
import shlex
import tarfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Sequence

from .. import proc
from ..errors import StageFailure
from .host import _dropped_connection, _sdk_log, _translated, reconnecting
from .images import OWNER_LABEL, Images

if TYPE_CHECKING:
    from ..model.gpuaccess import GpuAccess, GpuSetting

_names = itertools.count(1)


@dataclass(frozen=True)
class Mount:
    source: str  # host path (bind) or volume name
    target: str
    read_only: bool = True
    kind: Literal["bind", "volume", "tmpfs"] = "bind"
    # a bind source on the engine's own host (a GPU host's weights), never this machine's;
    # a bind of this machine's path reaches a remote engine's container as a copy instead
    on_engine_host: bool = False

    def copied_to(self, engine_is_local: bool) -> bool:
        """Whether this mount reaches the container as a copy of this machine's path (put
        into the created container, and for a writable one copied back when it ends): the
        engine runs elsewhere (ssh://, tcp://), where this path does not exist."""
        return self.kind == "bind" and not engine_is_local and not self.on_engine_host

    def cli(self) -> str:
        text = f"type={self.kind},target={self.target}"
        if self.kind != "tmpfs":
            text = f"type={self.kind},source={self.source},target={self.target}"
        return text + (",readonly" if self.read_only else "")


@dataclass(frozen=True)
class ContainerSpec:
    """A container to create: its image, program and settings, as `docker create` takes them.
    `ports`: {"8000/tcp": ("127.0.0.1", None)}; `gpus`: every NVIDIA GPU (True, or how
    matrix.yaml's smoke.gpu_access asks: `--gpus all`, a CDI device or the host's device
    nodes)."""

    image: str
    command: list[str] | None = None
    env: dict[str, str] | None = None
    mounts: Sequence[Mount] = ()
    shm_size: str | None = None
    ports: dict[str, Any] | None = None
    gpus: "bool | GpuSetting" = False
    name: str | None = None
    entrypoint: list[str] | None = None
    labels: dict[str, str] | None = None
    network: str | None = None
    user: str | None = None
    mem_limit: str | None = None


def run_command_line(spec: ContainerSpec, gpu_flags: list[str]) -> str:
    """The `docker create` line equivalent to the SDK's (for the log; secrets redacted) of
    `spec` as the SDK gets it: its env with the GPU request's, its bound mounts only.
    `docker start` and any `docker cp` into it are logged after it."""
    argv = ["docker", "create"]
    if spec.name:
        argv += ["--name", spec.name]
    if spec.network:
        argv += ["--network", spec.network]
    for key, value in sorted(proc.redact_env(spec.env or {}).items()):
        argv += ["-e", f"{key}={value}"]
    for mount in spec.mounts:
        argv += ["--mount", mount.cli()]
    if spec.shm_size:
        argv += ["--shm-size", spec.shm_size]
    if spec.mem_limit:
        argv += ["--memory", spec.mem_limit]
    for container_port, host in sorted((spec.ports or {}).items()):
        host_part = ":".join(str(p) for p in host) if isinstance(host, tuple) else str(host)
        argv += ["-p", f"{host_part}:{container_port}" if host is not None else container_port]
    argv += gpu_flags  # --gpus all, or --device nvidia.com/gpu=all (CDI)
    if spec.entrypoint:
        argv += ["--entrypoint", spec.entrypoint[0]]
    argv.append(spec.image)
    if spec.entrypoint:
        argv += spec.entrypoint[1:]
    argv += spec.command or []
    return shlex.join(argv)


def _network_option(network: str | None) -> dict[str, str]:
    """The SDK's argument for `--network`: another container's namespace (`container:ID`)
    is a network mode, never a network to connect to."""
    if not network:
        return {}
    return {"network_mode" if network.startswith("container:") else "network": network}


class Containers(Images):
    def run_container(self, spec: ContainerSpec) -> str:
        """Start a detached container of `spec`; return its id."""
        import docker

        env = dict(spec.env or {})
        access = self.gpu_access(None if spec.gpus is True else spec.gpus) if spec.gpus else None
        gpu_options: dict[str, Any] = {}
        if access is not None:
            gpu_options = self._gpu_options(spec.image, access)
            env.update(gpu_options.pop("environment"))
        local = self.is_local()
        copied = [m for m in spec.mounts if m.copied_to(local)]
        bound = [m for m in spec.mounts if not m.copied_to(local)]
        _sdk_log(run_command_line(replace(spec, env=env, mounts=bound),
                                  access.cli if access else []))
        starting = functools.partial(_translated, f"cannot start a container of {spec.image}",
                                     gpu_request=bool(spec.gpus), engine=self.label())
        with starting():
            container = self.sdk().containers.create(
                spec.image, command=spec.command, environment=env,
                mounts=[docker.types.Mount(target=m.target, source=m.source or None,
                                           type=m.kind, read_only=m.read_only) for m in bound]
                + gpu_options.pop("mounts", []),
                shm_size=spec.shm_size, ports=spec.ports or None, name=spec.name,
                entrypoint=spec.entrypoint,
                labels={OWNER_LABEL: "infermatrix", **(spec.labels or {})}, user=spec.user,
                mem_limit=spec.mem_limit, **_network_option(spec.network), **gpu_options)
        try:
            for mount in copied:
                self.copy_into_container(container.id, Path(mount.source), mount.target)
            self.__dict__.setdefault("_copy_back", {})[container.id] = \
                [m for m in copied if not m.read_only]
            _sdk_log(f"docker start {container.id[:12]}")
            with starting():
                container.start()
        except BaseException:  # a refused start (a GPU request) left a created container
            with contextlib.suppress(Exception):
                self.remove_container(container.id, force=True)
            raise
        return container.id

    def copy_into_container(self, container_id: str, source: Path, target: str) -> None:
        """`docker cp SOURCE CONTAINER:TARGET` through the API (put_archive of a tar made
        here): how this machine's files reach a container of an engine elsewhere."""
        _sdk_log(f"docker cp {shlex.quote(str(source))} {container_id[:12]}:{target}")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.add(str(source), arcname=target.strip("/"))
        with _translated(f"docker cp {source} {container_id[:12]}:{target}"):
            self.sdk().api.put_archive(container_id, "/", buffer.getvalue())

    def copy_back(self, container_id: str) -> None:
        """The writable copied mounts of an ended container, back into this machine's paths
        (`docker cp CONTAINER:TARGET SOURCE`): what a bind mount would have left there."""
        for mount in self.__dict__.get("_copy_back", {}).pop(container_id, []):
            _sdk_log(f"docker cp {container_id[:12]}:{mount.target} {shlex.quote(mount.source)}")
            with _translated(f"docker cp {container_id[:12]}:{mount.target}"):
                stream, _ = self.sdk().api.get_archive(container_id, mount.target)
                buffer = io.BytesIO(b"".join(stream))
            destination = Path(mount.source)
            with tarfile.open(fileobj=buffer) as archive:
                top = Path(mount.target).name  # the archive holds TARGET's own directory
                for member in archive.getmembers():
                    relative = Path(member.name).relative_to(top)
                    if not relative.parts:
                        continue
                    member.name = str(relative)
                    archive.extract(member, destination, filter="data")

    def _gpu_options(self, image: str, access: "GpuAccess") -> dict[str, Any]:
        """The SDK's arguments for a GPU request: device requests (runtime, CDI) or device
        nodes and read-only driver mounts; `environment`: what it adds to the container's."""
        import docker

        from ..model import gpuaccess

        options: dict[str, Any] = {"environment": {}}
        if access.pid_host:
            options["pid_mode"] = "host"
        if access.kind == "runtime":
            options["device_requests"] = [docker.types.DeviceRequest(count=-1,
                                                                     capabilities=[["gpu"]])]
        elif access.kind == "cdi":
            options["device_requests"] = [docker.types.DeviceRequest(
                driver="cdi", device_ids=[gpuaccess.CDI_ALL_GPUS])]
        else:
            assert access.host is not None
            options["devices"] = [f"{d}:{d}:rwm" for d in access.host.devices]
            options["mounts"] = [docker.types.Mount(target=target, source=source, type="bind",
                                                    read_only=True)
                                 for source, target in access.host.files]
            options["environment"] = access.environment(self.image_env(image))
        return options

    @contextlib.contextmanager
    def container(self, image: str, command: list[str] | None = None, *,
                  name: str | None = None, prefix: str = "infermatrix",
                  **settings: Any) -> Iterator[str]:
        """A detached container (`settings`: ContainerSpec's other fields) that is always
        stopped and removed afterwards (an interrupt included). It is named up front, so an
        interrupt that lands while Docker is still creating or starting it (before its id
        came back) still finds it by name."""
        name = name or f"{prefix}-{os.getpid()}-{next(_names)}"
        try:
            container_id = self.run_container(ContainerSpec(image, command, name=name, **settings))
        except BaseException:
            self.remove_container(name, force=True)
            raise
        try:
            yield container_id
        finally:
            with contextlib.suppress(Exception):
                self.stop_container(container_id, timeout=10)
            try:
                self.copy_back(container_id)
            finally:
                self.remove_container(container_id, force=True)

    @reconnecting
    def container_status(self, container_id: str) -> dict[str, Any]:
        """State of a container: {"Status": "running"|"exited"|..., "ExitCode": int, ...}."""
        with _translated(f"docker inspect {container_id[:12]}"):
            return self.sdk().api.inspect_container(container_id)["State"]

    @reconnecting
    def container_port(self, container_id: str, port: str) -> tuple[str, int] | None:
        """The host address a published container port landed on."""
        with _translated(f"docker port {container_id[:12]}"):
            settings = self.sdk().api.inspect_container(container_id)["NetworkSettings"]
        bindings = (settings["Ports"] or {}).get(port) or []
        if not bindings:
            return None
        return bindings[0]["HostIp"] or "127.0.0.1", int(bindings[0]["HostPort"])

    def wait_container(self, container_id: str, timeout: float | None = None) -> int:
        """Wait for a container to exit; return its exit code (StageFailure past the
        timeout). Over a transport without read timeouts the engine is asked its state each
        second instead: a timed `docker wait` there returned only when the container ended
        (a hung harness hung the run)."""
        if timeout is not None and not self.reads_time_out():
            return self._wait_by_polling(container_id, timeout)
        return self._wait_by_api(container_id, timeout)

    def _wait_by_polling(self, container_id: str, timeout: float, every_s: float = 1.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            state = self.container_status(container_id)
            if state.get("Status") in ("exited", "dead"):
                return int(state.get("ExitCode", -1))
            left = deadline - time.monotonic()
            if left <= 0:
                raise StageFailure(f"container {container_id[:12]} still running after "
                                   f"{timeout} s")
            time.sleep(min(every_s, left))

    @reconnecting
    def _wait_by_api(self, container_id: str, timeout: float | None) -> int:
        import requests

        try:
            with _translated(f"docker wait {container_id[:12]}"):
                result = self.sdk().api.wait(container_id, timeout=timeout)
        except requests.exceptions.ConnectionError as exc:  # read timeout surfaces here
            if _dropped_connection(exc):
                raise  # not a timeout: @reconnecting asks again on a new connection
            raise StageFailure(f"container {container_id[:12]} still running after "
                               f"{timeout} s") from exc
        return int(result.get("StatusCode", -1))

    @reconnecting
    def container_logs(self, container_id: str, tail: int | str = "all") -> str:
        with _translated(f"docker logs {container_id[:12]}"):
            raw = self.sdk().api.logs(container_id, stdout=True, stderr=True, tail=tail)
        return raw.decode("utf-8", "replace")

    @reconnecting
    def stop_container(self, container_id: str, timeout: int = 10) -> None:
        _sdk_log(f"docker stop --time {timeout} {container_id[:12]}")
        with _translated(f"docker stop {container_id[:12]}", missing_ok=True):
            self.sdk().api.stop(container_id, timeout=timeout)

    @reconnecting
    def remove_container(self, container_id: str, force: bool = True) -> None:
        _sdk_log(f"docker rm {'--force ' if force else ''}{container_id[:12]}")
        with _translated(f"docker rm {container_id[:12]}", missing_ok=True):
            self.sdk().api.remove_container(container_id, force=force, v=True)

    def exec_in_container(self, container_id: str, command: list[str],
                          env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run a command in a running container; (exit code, output)."""
        _sdk_log(f"docker exec {container_id[:12]} {shlex.join(command)}")
        with _translated(f"docker exec {container_id[:12]}"):
            result = self.sdk().containers.get(container_id).exec_run(
                command, environment=env or None)
        return int(result.exit_code), result.output.decode("utf-8", "replace")
