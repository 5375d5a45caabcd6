"""The engine's connection (the SDK client, made on first use, and the CLI's environment)
and what its host says about itself (`docker info`: CPUs, memory, platform, runtimes, GPU
access, data root). SDK calls are logged as the equivalent CLI line, prefixed with `# sdk:`;
every SDK error comes out as EngineError."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from ..errors import EngineError, EngineUnavailable, GpuUnavailable, UsageError
from .endpoint import Endpoint, _check_ssh_handshake, _default_client, engine_address, no_proxy_env

if TYPE_CHECKING:
    from ..model.gpuaccess import GpuAccess, GpuSetting, HostGpu

log = logging.getLogger("infermatrix.commands")


def _sdk_log(line: str) -> None:
    log.info("# sdk: %s", line)


def host_platform() -> str:
    """The engine host's platform in OCI form (linux/amd64, linux/arm64)."""
    import platform

    from ..model.spec import platform_of_machine

    return platform_of_machine(platform.machine())


@contextlib.contextmanager
def _translated(what: str, gpu_request: bool = False, engine: str = "",
                missing_ok: bool = False) -> Iterator[None]:
    """SDK errors as EngineError (the project's), with what was being done; with `missing_ok`,
    one about a missing object ends the block quietly. A GPU request the daemon cannot serve
    is one line naming the engine and the fix."""
    import docker

    from ..model import gpuaccess

    try:
        yield
    except docker.errors.DockerException as exc:
        if missing_ok and isinstance(exc, docker.errors.NotFound):  # ImageNotFound included
            return
        if gpu_request and gpuaccess.is_gpu_refusal(str(exc)):
            explanation = getattr(exc, "explanation", None) or str(exc)
            raise GpuUnavailable(f"engine {engine} refused the GPU request ({explanation})",
                                 fix=gpuaccess.FIX) from None
        raise EngineError(f"{what}: {exc}") from None


# A connection whose transport died under a call: an ssh:// engine's process or network gone
# (closing one that ended is mended in sshsocket.py), a tcp:// engine restarted. requests
# does not retry; idempotent calls do, below.
_DROPPED = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _dropped_connection(exc: BaseException | None) -> bool:
    """The exception, or one it wraps (requests/urllib3 wrap the socket's), is a dropped
    connection rather than an answer or a read timeout."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, _DROPPED):
            return True
        nested = [a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)]
        exc = exc.__cause__ or exc.__context__ or (nested[0] if nested else None)
    return False


def reconnecting(method: Callable[..., Any]) -> Callable[..., Any]:
    """An idempotent engine call (inspect, wait, logs, stop, rm) that meets a dropped
    connection gets a new SDK client and is asked once more; a second drop is an EngineError
    naming the engine. Calls that create something (run, build, push) are never repeated."""
    @functools.wraps(method)
    def call(self: "Host", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only a dropped connection is retried
            if not _dropped_connection(exc):
                raise
            _sdk_log(f"the connection to {self.label()} dropped ({exc!r}): reconnecting for "
                     f"{method.__name__}")
            self._sdk = None  # a fresh client: new connections, new ssh processes
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            if not _dropped_connection(exc):
                raise
            raise EngineError(f"{method.__name__}: the connection to engine {self.label()} "
                              f"dropped twice ({exc!r})") from None
    return call


@dataclass(frozen=True)
class DockerFacts:
    """What an engine says about itself (`docker info`): the figures builders are sized by."""

    cpus: int
    memory: int  # bytes
    platform: str  # linux/amd64, linux/arm64
    server_version: str | None = None

    def describe(self) -> str:
        return f"{self.platform}, {self.cpus} CPUs, {self.memory / 2**30:.1f} GiB"


class Host:
    """The connection to one engine (`endpoint`, else DOCKER_HOST / the current context) and
    its host's facts: the base of Engine (docker.py)."""

    endpoint: Endpoint | None = None  # class defaults: subclasses (tests' fakes) may skip init
    _sdk: Any = None

    def __init__(self, endpoint: Endpoint | None = None) -> None:
        self.endpoint = endpoint  # None: DOCKER_HOST / the current context / the socket

    def sdk(self) -> Any:  # docker.DockerClient
        """The SDK client: the endpoint's, else DOCKER_HOST, else DOCKER_CONTEXT / the CLI's
        current context."""
        if self._sdk is None:
            import docker

            where = self.address()
            _check_ssh_handshake(self._host_url(), where)
            try:
                sdk = self.endpoint.sdk_client() if self.endpoint else _default_client()
                sdk.ping()
            except (docker.errors.DockerException, OSError) as exc:
                raise EngineUnavailable(f"cannot reach the Docker engine at {where}: "
                                        f"{exc}") from None
            self._sdk = sdk
        return self._sdk

    def _host_url(self) -> str | None:
        """The engine's address as a URL (an endpoint's, its context's, DOCKER_HOST, the
        current context's), None when it cannot be told."""
        endpoint = self.endpoint
        if endpoint and endpoint.host:
            return endpoint.host
        try:
            from docker.context import ContextAPI

            if endpoint and endpoint.context:
                found = ContextAPI.get_context(endpoint.context)
                return str(found.Host) if found is not None else None
            if os.environ.get("DOCKER_HOST"):
                return os.environ["DOCKER_HOST"]
            return ContextAPI.kwargs_from_context().get("base_url")
        except Exception:  # noqa: BLE001 - a broken context: the SDK names it itself
            return None

    def cli_env(self) -> dict[str, str]:
        """The environment a docker CLI command needs to reach this engine (a tcp:// one's
        host in NO_PROXY: its API never goes through a proxy)."""
        own = self.endpoint.cli_env() if self.endpoint else {}
        return {**own, **no_proxy_env(self._host_url())}

    def cli(self, binary: str, argv: list[str]) -> list[str]:
        """`binary [global TLS options] argv...` for this engine."""
        return [binary, *(self.endpoint.cli_args() if self.endpoint else []), *argv]

    def _info(self) -> dict[str, Any]:
        """`docker info` of this engine, logged."""
        _sdk_log("docker info")
        with _translated("docker info"):
            return self.sdk().info()

    def facts(self) -> DockerFacts:
        """CPUs, memory and platform as the engine reports them (`docker info`)."""
        from ..model.spec import platform_of_machine

        info = self._info()
        return DockerFacts(cpus=int(info.get("NCPU") or 1), memory=int(info.get("MemTotal") or 0),
                           platform=platform_of_machine(str(info.get("Architecture") or "")),
                           server_version=info.get("ServerVersion"))

    def answers(self) -> bool:
        """Whether the engine still answers a ping (a builder that died mid-run does not)."""
        try:
            return bool(self.sdk().ping())
        except Exception:  # noqa: BLE001 - whatever the failure, the engine does not answer
            return False

    def platform(self) -> str:
        """The engine's platform: this host's for the default engine, else what it says."""
        return self.facts().platform if self.endpoint else host_platform()

    def available(self) -> bool:
        try:
            self.sdk()
            return True
        except UsageError:
            return False

    def host_info(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """What `docker info` (read now, or `info` as read) says about storage and runtimes
        (for `infermatrix doctor`)."""
        info = self._info() if info is None else info
        access = self._gpu_verdict(info)
        gpu = {"gpu_access": None, "gpu_access_error": access.one_line()} \
            if isinstance(access, GpuUnavailable) else \
            {"gpu_access": f"{' '.join(access.cli)} ({access.detail})"}
        return {"storage_driver": info.get("Driver"),
                "runtimes": sorted((info.get("Runtimes") or {}).keys()),
                "default_runtime": info.get("DefaultRuntime"),
                "cgroup_version": info.get("CgroupVersion"),
                "server_version": info.get("ServerVersion"),
                "cdi_spec_dirs": info.get("CDISpecDirs") or [], **gpu}

    def host_facts(self) -> dict[str, Any]:
        """The host behind the engine as its `docker info` describes it (name, OS, kernel,
        CPUs, memory, platform) with host_info's runtimes and GPU access: what the journal
        records about the engine a smoke ran on."""
        from ..model.spec import platform_of_machine

        info = self._info()
        return {"engine": self.label(), "name": info.get("Name"),
                "os": info.get("OperatingSystem"), "kernel": info.get("KernelVersion"),
                "platform": platform_of_machine(str(info.get("Architecture") or "")),
                "cpus": info.get("NCPU"), "memory_bytes": info.get("MemTotal"),
                **self.host_info(info)}

    def gpu_access(self, setting: "GpuSetting | None" = None) -> "GpuAccess":
        """How this engine hands GPUs to containers (model/gpuaccess.py: the nvidia runtime,
        else CDI, else this host's device nodes), from its own `docker info`, read once per
        setting; GpuUnavailable (an EngineError: one line naming the engine, and the fix) when
        it has none."""
        from ..model.gpuaccess import GpuSetting

        setting = setting or GpuSetting()
        verdicts = self.__dict__.setdefault("_gpu_verdicts", {})
        if setting not in verdicts:
            verdicts[setting] = self._gpu_verdict(self._info(), setting)
        verdict = verdicts[setting]
        if isinstance(verdict, GpuUnavailable):  # a fresh exception: the cached one is kept
            raise GpuUnavailable(verdict.message, fix=verdict.fix)
        return verdict

    def _gpu_verdict(self, info: dict[str, Any],
                     setting: "GpuSetting | None" = None) -> "GpuAccess | GpuUnavailable":
        """gpuaccess.choose on this engine's info: the way to GPUs, or why there is none."""
        from ..model import gpuaccess

        try:
            return gpuaccess.choose(info, self.label(), setting or gpuaccess.GpuSetting(),
                                    self.host_gpu())
        except gpuaccess.GpuUnavailable as exc:
            return exc

    def host_gpu(self) -> "HostGpu | None":
        """This host's device nodes and driver files when the engine runs here (a unix
        socket), else None: a remote engine's /dev cannot be read from here."""
        if not self.is_local():
            return None
        if "_host_gpu" not in self.__dict__:
            from . import gpudevices

            self._host_gpu = gpudevices.scan()
        return self._host_gpu

    def is_local(self) -> bool:
        return self.address().startswith("unix://")

    def address(self) -> str:
        return self.endpoint.address if self.endpoint else engine_address()

    def label(self) -> str:
        """The engine as a person names it: the builder's name and address, else the address."""
        return f"{self.endpoint.name} ({self.address()})" if self.endpoint else self.address()

    def local_data_root(self) -> Path | None:
        """Docker's data root when the engine runs on this machine (a unix socket), else None:
        a remote engine's free space cannot be read from here."""
        if "_data_root" not in self.__dict__:  # read once per engine: it does not move
            root = self._info().get("DockerRootDir") if self.is_local() else None
            self._data_root = Path(root) if root and Path(root).exists() else None
        return self._data_root

    def reads_time_out(self) -> bool:
        """Whether the SDK's reads from this engine honour a timeout: unix:// and tcp:// do;
        the ssh:// transport (an `ssh ... docker system dial-stdio` process per request)
        does not, and a Docker context may stand for either."""
        return self.address().startswith(("unix://", "tcp://"))
