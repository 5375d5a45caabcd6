"""The one module that talks to Docker.

BuildKit builds go through a Docker CLI (`build_image`), because only the CLI carries a build
session (secrets, cache mounts, `--output`); everything else goes through the `docker` SDK
(inspect, tag, run, logs, copy-out). Both honour DOCKER_HOST and Docker contexts
(DOCKER_CONTEXT or the current context of ~/.docker/config.json).

Every CLI command runs through `proc.run` and is logged exactly, build args and secret *ids*
included (a secret is `--secret id=NAME,src=FILE`: the file's content never reaches argv or a
log). SDK calls are logged as the equivalent CLI line, prefixed with `# sdk:`.

Which CLI can build: buildx when `docker buildx version` works; otherwise a client from before
Docker 23 runs the daemon's built-in BuildKit with DOCKER_BUILDKIT=1 (Debian's docker.io 20.10).
A 23+ client without buildx cannot, and is passed over. INFERMATRIX_DOCKER names a client
explicitly.

Several builders (issue 19): an `Engine(Endpoint)` talks to one named engine (`unix://`,
`ssh://`, `tcp://` with TLS, or a Docker context), its SDK client and its CLI commands alike
(the CLI gets DOCKER_HOST / DOCKER_CONTEXT / DOCKER_CERT_PATH). There is no current or
module-level engine: the command makes one (`stages.Run.docker`) and passes it by hand, each
builder's worker passes its builder's, so every call names the engine that serves it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import json
import logging
import os
import re
import shlex
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Literal

from .. import proc
from ..errors import (EngineError, EngineUnavailable, GpuUnavailable, MissingTool, StageFailure,
                      UsageError)

if TYPE_CHECKING:
    from ..model.gpuaccess import GpuAccess, GpuSetting, HostGpu

log = logging.getLogger("infermatrix.commands")

# Label put on every container this tool creates, so tests and cleanup find only their own.
OWNER_LABEL = "io.infermatrix.owner"

BuildMode = Literal["buildx", "buildkit"]


# --------------------------------------------------------------------------------------------
# Finding a client that can run BuildKit builds
# --------------------------------------------------------------------------------------------

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


def host_platform() -> str:
    """The engine host's platform in OCI form (linux/amd64, linux/arm64)."""
    import platform

    from ..model.spec import platform_of_machine

    return platform_of_machine(platform.machine())


def docker_cli() -> str:
    """A docker CLI for non-build commands (import, ...): the build client's binary."""
    return build_client().binary


# --------------------------------------------------------------------------------------------
# Builds
# --------------------------------------------------------------------------------------------

@dataclass
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
    iidfile: Path | None = None
    no_cache: bool = False  # `--no-cache` (verify-repro builds twice from nothing)
    platform: str | None = None  # `--platform linux/arm64` (None: the engine's own)

    def argv(self, client: BuildClient) -> list[str]:
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
            if self.iidfile is not None:
                argv += ["--iidfile", str(self.iidfile)]
        argv.append(str(self.context_dir))
        return argv


def check_secrets(secrets: dict[str, Path]) -> None:
    for secret_id, path in secrets.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", secret_id):
            raise UsageError(f"bad secret id {secret_id!r}: use letters, digits, _ . -")
        if not Path(path).is_file():
            raise UsageError(f"secret {secret_id!r}: file {path} does not exist",)


# --------------------------------------------------------------------------------------------
# The engine object: the SDK client, images, containers, files
# --------------------------------------------------------------------------------------------

def _sdk_log(line: str) -> None:
    log.info("# sdk: %s", line)


def engine_address() -> str:
    """Where the engine is looked for: DOCKER_HOST, else the context's host, else the socket."""
    if os.environ.get("DOCKER_HOST"):
        return f"{os.environ['DOCKER_HOST']} (DOCKER_HOST)"
    try:
        from docker.context import ContextAPI

        host = ContextAPI.kwargs_from_context().get("base_url")
        if host:
            return f"{host} (Docker context)"
    except Exception:  # a broken context file: the default socket is what is tried
        pass
    return "unix:///var/run/docker.sock (default)"


def split_ref(ref: str) -> tuple[str, str]:
    """`repo/name:tag` -> (`repo/name`, `tag`); a registry port is not a tag."""
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return name, tag


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


def run_command_line(image: str, command: list[str] | None, env: dict[str, str],
                     mounts: list[Mount], shm_size: str | None, ports: dict[str, Any],
                     gpu_flags: list[str], name: str | None, entrypoint: list[str] | None,
                     network: str | None = None, mem_limit: str | None = None) -> str:
    """The `docker create` line equivalent to the SDK's (for the log; secrets redacted);
    `docker start` and any `docker cp` into it are logged after it."""
    argv = ["docker", "create"]
    if name:
        argv += ["--name", name]
    if network:
        argv += ["--network", network]
    for key, value in sorted(proc.redact_env(env).items()):
        argv += ["-e", f"{key}={value}"]
    for mount in mounts:
        argv += ["--mount", mount.cli()]
    if shm_size:
        argv += ["--shm-size", shm_size]
    if mem_limit:
        argv += ["--memory", mem_limit]
    for container_port, host in sorted(ports.items()):
        host_part = ":".join(str(p) for p in host) if isinstance(host, tuple) else str(host)
        argv += ["-p", f"{host_part}:{container_port}" if host is not None else container_port]
    argv += gpu_flags  # --gpus all, or --device nvidia.com/gpu=all (CDI)
    if entrypoint:
        argv += ["--entrypoint", entrypoint[0]]
    argv.append(image)
    if entrypoint:
        argv += entrypoint[1:]
    argv += command or []
    return shlex.join(argv)


def _network_option(network: str | None) -> dict[str, str]:
    """The SDK's argument for `--network`: another container's namespace (`container:ID`)
    is a network mode, never a network to connect to."""
    if not network:
        return {}
    return {"network_mode" if network.startswith("container:") else "network": network}


@contextlib.contextmanager
def _translated(what: str, gpu_request: bool = False, engine: str = "") -> Iterator[None]:
    """SDK errors as EngineError (the project's), with what was being done. A GPU request the
    daemon cannot serve is one line naming the engine and the fix."""
    import docker

    from ..model import gpuaccess

    try:
        yield
    except docker.errors.DockerException as exc:
        if gpu_request and gpuaccess.is_gpu_refusal(str(exc)):
            explanation = getattr(exc, "explanation", None) or str(exc)
            raise GpuUnavailable(f"engine {engine} refused the GPU request ({explanation})",
                                 fix=gpuaccess.FIX) from None
        raise EngineError(f"{what}: {exc}") from None


_names = itertools.count(1)

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
    def call(self: "Engine", *args: Any, **kwargs: Any) -> Any:
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
class Endpoint:
    """A Docker engine named by address (`unix://`, `ssh://`, `tcp://` with TLS files) or by
    Docker context: a builder of `build.builders` / `--builder`."""

    name: str
    host: str | None = None  # unix:///run/x.sock, ssh://user@host, tcp://host:2376
    context: str | None = None  # a Docker context of the CLI's config
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_verify: bool = True
    platforms: tuple[str, ...] = ()  # declared; empty: the engine's own

    @property
    def address(self) -> str:
        return self.host or f"context {self.context}"

    def cli_env(self) -> dict[str, str]:
        """The environment a docker CLI needs to talk to this engine."""
        return {"DOCKER_CONTEXT": self.context} if self.context else \
            {"DOCKER_HOST": str(self.host)}

    def cli_args(self) -> list[str]:
        """Global CLI options (before the command): the TLS files of a tcp:// engine."""
        if not self.tls_cert:
            return []
        args = ["--tlsverify"] if self.tls_verify else ["--tls"]
        if self.tls_ca:
            args += ["--tlscacert", self.tls_ca]
        return args + ["--tlscert", self.tls_cert, "--tlskey", str(self.tls_key)]

    def sdk_client(self) -> Any:  # docker.DockerClient
        import docker

        from .sshsocket import mend_ssh_socket_close

        mend_ssh_socket_close()  # ssh:// (an address or a context's): docker-py#3218
        if self.context:
            from docker.context import ContextAPI

            found = ContextAPI.get_context(self.context)
            if found is None:
                raise UsageError(f"builder {self.name}: no Docker context {self.context!r} "
                                 "(see `docker context ls`)")
            return docker.DockerClient(base_url=found.Host, tls=found.TLSConfig, timeout=600,
                                       use_ssh_client=str(found.Host).startswith("ssh://"))
        tls = None
        if self.tls_cert:
            tls = docker.tls.TLSConfig(client_cert=(self.tls_cert, str(self.tls_key)),
                                       ca_cert=self.tls_ca, verify=self.tls_verify)
        if tls is None and not str(self.host).startswith("tcp://"):
            return docker.DockerClient(base_url=self.host, timeout=600,
                                       use_ssh_client=str(self.host).startswith("ssh://"))
        if tls is None:
            warn_plain_tcp(str(self.host))
        return _without_environment(lambda version: docker.DockerClient(
            base_url=self.host, tls=tls or False, timeout=600, version=version))


_WARNED_PLAIN: set[str] = set()


def warn_plain_tcp(url: str) -> None:
    """Once per address: a tcp:// engine without TLS (issue 48: used without a word)."""
    if url in _WARNED_PLAIN:
        return
    _WARNED_PLAIN.add(url)
    print(f"infermatrix: warning: the Docker engine at {url} is reached over plain TCP "
          "without TLS: anyone on the network path can read its traffic and drive it (root on "
          "its host); give it TLS files (build.builders' tls:, DOCKER_TLS_VERIFY and "
          "DOCKER_CERT_PATH) or reach it over ssh://", file=sys.stderr)


def _without_environment(make: Callable[[str], Any]) -> Any:
    """An SDK client of a tcp:// engine that ignores the environment's requests settings:
    HTTP(S)_PROXY / ALL_PROXY (the engine's API is not web traffic: a proxy would see and
    could drive it, issue 48) and REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE over the engine's CA
    (the docker CLI never reads them). The API version is then negotiated as version="auto"
    does, which would have asked before trust_env could be turned off."""
    from docker.constants import DEFAULT_DOCKER_API_VERSION

    sdk = make(DEFAULT_DOCKER_API_VERSION)
    sdk.api.trust_env = False
    sdk.api.proxies = {}
    sdk.api._version = sdk.api.version(api_version=False)["ApiVersion"]
    return sdk


def _default_client() -> Any:
    """DOCKER_HOST / the current context's client (docker.from_env); a tcp:// one ignores the
    proxy settings (and warns without TLS), as an endpoint's does."""
    import docker

    host = os.environ.get("DOCKER_HOST", "")
    if not host.startswith("tcp://"):
        return docker.from_env(timeout=600)
    if not os.environ.get("DOCKER_TLS_VERIFY") and not os.environ.get("DOCKER_CERT_PATH"):
        warn_plain_tcp(host)
    return _without_environment(lambda version: docker.from_env(timeout=600, version=version))


def no_proxy_env(url: str | None) -> dict[str, str]:
    """NO_PROXY / no_proxy naming a tcp:// engine's host, for a docker CLI command (its Go
    client would send the API through HTTP(S)_PROXY otherwise)."""
    if not url or not url.startswith("tcp://"):
        return {}
    host = url.removeprefix("tcp://").split("/")[0].rsplit(":", 1)[0].strip("[]")
    merged = ",".join(filter(None, [os.environ.get("NO_PROXY") or os.environ.get("no_proxy"),
                                    host]))
    return {"NO_PROXY": merged, "no_proxy": merged}


def _check_ssh_handshake(url: str | None, where: str) -> None:
    """EngineUnavailable when an ssh:// engine's host does not speak SSH within the bound
    (sshsocket.ssh_handshake_problem): the SDK's ssh would wait for ever (issue 48)."""
    if not url or not str(url).startswith("ssh://"):
        return
    from .sshsocket import HANDSHAKE_ENV, ssh_handshake_problem

    problem = ssh_handshake_problem(str(url))
    if problem:
        raise EngineUnavailable(
            f"cannot reach the Docker engine at {where}: {problem}",
            fix="check the address and port (is sshd running there, and does `ssh HOST` "
                f"answer?); a slow link may need a longer {HANDSHAKE_ENV} (seconds)")


ENDPOINT_FORMS = "[NAME=]unix:///PATH, ssh://[USER@]HOST[:PORT], tcp://HOST[:PORT] or " \
    "[NAME=]CONTEXT"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_CONTEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # the docker CLI's rule for a context
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+")  # a name, IPv4, or [IPv6]


def _port_problem(port: str) -> str | None:
    if not port.isdigit():
        return f"port {port!r} is not a number"
    if not 1 <= int(port) <= 65535:
        return f"port {port} is out of range (1-65535)"
    return None


def endpoint_problem(target: str) -> str | None:
    """What is wrong with the form of an engine address or context name (issue 48: a
    malformed one was taken, then failed as an engine that "does not answer"), or None."""
    if any(c.isspace() for c in target):
        return "it holds a space"
    if "://" not in target:
        return None if _CONTEXT.fullmatch(target) else \
            "not a Docker context name (letters, digits, _ . + -)"
    scheme, rest = target.split("://", 1)
    if scheme not in ("unix", "ssh", "tcp"):
        return "the endpoint must be unix://, ssh:// or tcp:// (TLS files: build.builders " \
            "in matrix.yaml)"
    if scheme == "unix":
        return None if rest.startswith("/") and rest.strip("/") else \
            "unix:// takes the socket's absolute path (unix:///run/docker.sock)"
    if "/" in rest.rstrip("/") or "?" in rest or "#" in rest:
        return f"{scheme}:// takes no path or query"
    rest = rest.rstrip("/")
    user, at, hostport = rest.rpartition("@")
    if scheme == "tcp" and at:
        return "tcp:// takes no user"
    if at and not user:
        return "the user before @ is empty"
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, tail = hostport.partition("]")
        host += "]"
        if tail:
            if not tail.startswith(":"):
                return f"{hostport!r} is not HOST[:PORT]"
            port = tail[1:]
    elif ":" in hostport:
        host, port = hostport.rsplit(":", 1)
    if not host:
        return f"{scheme}:// names no host"
    if not _HOST.fullmatch(host):
        return f"{host!r} is not a host name or address"
    return _port_problem(port) if port is not None else None


def parse_builder(text: str, index: int = 0, flag: str = "--builder") -> Endpoint:
    """`--builder [NAME=]ENDPOINT` or `--builder [NAME=]CONTEXT` (a name without `://`);
    a malformed one is a UsageError (exit 2) naming `flag`."""
    name, sep, target = text.partition("=")
    if not sep or "://" in name:  # no NAME= (an endpoint may hold a "=" of its own)
        name, sep, target = "", "", text
    target = target.strip()
    if not target or (sep and not _NAME.fullmatch(name)):
        raise UsageError(f"{flag} {text!r}: expected {ENDPOINT_FORMS}")
    problem = endpoint_problem(target)
    if problem:
        raise UsageError(f"{flag} {text!r}: {problem}; expected {ENDPOINT_FORMS}")
    if "://" in target:
        return Endpoint(name or f"builder{index + 1}", host=target)
    return Endpoint(name or target, context=target)


@dataclass(frozen=True)
class DockerFacts:
    """What an engine says about itself (`docker info`): the figures builders are sized by."""

    cpus: int
    memory: int  # bytes
    platform: str  # linux/amd64, linux/arm64
    server_version: str | None = None

    def describe(self) -> str:
        return f"{self.platform}, {self.cpus} CPUs, {self.memory / 2**30:.1f} GiB"


class Engine:
    """The Docker engine of this run: owns the SDK client (made on first use) and the BuildKit
    CLI; every SDK error comes out as EngineError. Passed by hand: the command makes one
    (`Run.docker`) and every step and function that talks to Docker takes it as an argument,
    so each call says which engine serves it (a builder's, the smoke's, this machine's)."""

    endpoint: Endpoint | None = None  # class defaults: subclasses (tests' fakes) may skip init
    _sdk: Any = None

    def __init__(self, endpoint: Endpoint | None = None) -> None:
        self._sdk: Any = None
        self.endpoint = endpoint  # None: DOCKER_HOST / the current context / the socket

    # -- the clients -----------------------------------------------------------------------
    def sdk(self) -> Any:  # docker.DockerClient
        """The SDK client: the endpoint's, else DOCKER_HOST, else DOCKER_CONTEXT / the CLI's
        current context."""
        if self._sdk is None:
            import docker

            where = self.endpoint.address if self.endpoint else engine_address()
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
            with _translated("docker ping"):
                return bool(self.sdk().ping())
        except Exception:  # noqa: BLE001 - whatever the failure, the engine does not answer
            return False

    def platform(self) -> str:
        """The engine's platform: this host's for the default engine, else what it says."""
        return self.facts().platform if self.endpoint else host_platform()

    def emulation_of(self, image: str) -> str | None:
        """Why programs of `image` run emulated on this engine ("linux/arm64 under QEMU on
        linux/amd64"), or None when the image is for the engine's own CPU (a remote engine's
        CPU is its host's, not this machine's)."""
        info = self.inspect_image(image) or {}
        if not info.get("Architecture"):
            return None
        image_platform = f"{info.get('Os') or 'linux'}/{info['Architecture']}"
        own = self.platform()
        return None if image_platform == own else f"{image_platform} under QEMU on {own}"

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
            _sdk_log("docker info --format '{{json .Runtimes}} {{json .CDISpecDirs}}'")
            with _translated("docker info"):
                verdicts[setting] = self._gpu_verdict(self.sdk().info(), setting)
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
        address = self.endpoint.address if self.endpoint else engine_address()
        return address.startswith("unix://")

    def label(self) -> str:
        """The engine as a person names it: the builder's name and address, else the address."""
        if self.endpoint:
            return f"{self.endpoint.name} ({self.endpoint.address})"
        return engine_address()

    # -- disk ------------------------------------------------------------------------------
    def local_data_root(self) -> Path | None:
        """Docker's data root when the engine runs on this machine (a unix socket), else None:
        a remote engine's free space cannot be read from here."""
        if "_data_root" not in self.__dict__:  # read once per engine: it does not move
            self._data_root = self._read_local_data_root()
        return self._data_root

    def _read_local_data_root(self) -> Path | None:
        address = self.endpoint.address if self.endpoint else engine_address()
        if not address.startswith("unix://"):
            return None
        _sdk_log("docker info --format '{{.DockerRootDir}}'")
        with _translated("docker info"):
            root = self.sdk().info().get("DockerRootDir")
        return Path(root) if root and Path(root).exists() else None

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

    # -- builds (BuildKit through a CLI) ---------------------------------------------------
    def build_image(self, context_dir: Path, dockerfile: Path | None = None,
                    tag: str | None = None, target: str | None = None,
                    build_args: dict[str, str] | None = None,
                    secrets: dict[str, Path] | None = None, output_dir: Path | None = None,
                    log_path: Path | None = None, timeout: float | None = None,
                    labels: dict[str, str] | None = None, no_cache: bool = False,
                    platform: str | None = None,
                    on_line: Callable[[str], None] | None = None) -> str:
        """Run one BuildKit build; return the image id ("" when exporting to `output_dir`).
        `on_line` sees each line of BuildKit's plain progress as it comes (a progress display).

        Raises CommandFailed (exact command + log tail) when the build fails or times out.
        """
        client = build_client()
        secrets = {k: Path(v) for k, v in (secrets or {}).items()}
        check_secrets(secrets)
        with tempfile.TemporaryDirectory(prefix="infermatrix-iid-") as tmp:
            request = BuildRequest(
                context_dir=Path(context_dir),
                dockerfile=Path(dockerfile) if dockerfile else None, tag=tag, target=target,
                build_args=dict(build_args or {}), secrets=secrets, labels=dict(labels or {}),
                output_dir=Path(output_dir) if output_dir else None,
                iidfile=None if output_dir else Path(tmp) / "iid", no_cache=no_cache,
                platform=platform)
            if request.output_dir is not None:
                request.output_dir.mkdir(parents=True, exist_ok=True)
            argv = request.argv(client)
            proc.run(self.cli(argv[0], argv[1:]), env={**client.env(), **self.cli_env()},
                     log_path=log_path, timeout=timeout, on_line=on_line)
            if request.output_dir is not None:
                return ""
            assert request.iidfile is not None
            image_id = request.iidfile.read_text().strip() if request.iidfile.is_file() else ""
        if not image_id and tag:
            image_id = self.image_id_of(tag) or ""
        if not image_id:
            raise StageFailure(f"build of {context_dir} finished without an image id")
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

    def copy_image_to(self, ref: str, target: "Engine", log_path: Path | None = None,
                      timeout: float | None = 3600) -> None:
        """`docker save REF | docker load` from this engine into `target` (a builder that
        lacks a local base image: it cannot pull one that exists only here)."""
        def side(engine_of: Engine, *command: str) -> str:
            env = [f"{k}={v}" for k, v in engine_of.cli_env().items()]
            return shlex.join([*(["env", *env] if env else []),
                               *engine_of.cli(docker_cli(), list(command))])
        line = f"set -o pipefail; {side(self, 'save', ref)} | {side(target, 'load')}"
        proc.run(["bash", "-c", line], log_path=log_path, timeout=timeout)

    # -- images ----------------------------------------------------------------------------
    @reconnecting
    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        """`docker image inspect` as a dict, or None when there is no such image."""
        import docker

        try:
            return self.sdk().api.inspect_image(ref)
        except docker.errors.NotFound:  # ImageNotFound included
            return None
        except docker.errors.DockerException as exc:
            raise EngineError(f"docker image inspect {ref}: {exc}") from None

    def image_id_of(self, ref: str) -> str | None:
        info = self.inspect_image(ref)
        return info["Id"] if info else None

    def image_exists(self, ref: str) -> bool:
        return self.inspect_image(ref) is not None

    def image_labels(self, ref: str) -> dict[str, str]:
        info = self.inspect_image(ref)
        if info is None:
            raise StageFailure(f"no image {ref}")
        return dict((info.get("Config") or {}).get("Labels") or {})

    def tag_image(self, image: str, ref: str) -> None:
        repository, tag = split_ref(ref)
        _sdk_log(f"docker tag {shlex.quote(image)} {shlex.quote(ref)}")
        with _translated(f"docker tag {image} {ref}"):
            done = self.sdk().api.tag(image, repository, tag, force=True)
        if not done:
            raise StageFailure(f"could not tag {image} as {ref}")

    def remove_image(self, ref: str, force: bool = False) -> bool:
        """Remove an image reference; False when there was none."""
        import docker

        _sdk_log(f"docker rmi {'--force ' if force else ''}{shlex.quote(ref)}")
        try:
            self.sdk().api.remove_image(ref, force=force, noprune=False)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.DockerException as exc:
            raise EngineError(f"docker rmi {ref}: {exc}") from None

    def commit_with_labels(self, image: str, ref: str, labels: dict[str, str]) -> str:
        """A new image = `image` plus `labels`, nothing else changed (its parent is `image`,
        its layers, command and environment are the same), tagged `ref`; returns its id.

        `docker create` (never started, no label or command of our own: commit copies the
        container's config) then `docker commit --change LABEL ...`, then the container is
        removed.
        """
        import docker

        changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items())]
        _sdk_log(f"docker create {shlex.quote(image)} && docker commit "
                 + " ".join(f"--change {shlex.quote(c)}" for c in changes) + f" <container> {ref}")
        api = self.sdk().api
        with _translated(f"docker create {image}"):
            try:
                created = api.create_container(image)
            except docker.errors.APIError:  # an image with neither CMD nor ENTRYPOINT
                created = api.create_container(image, command=["/bin/true"])
                changes.append("CMD []")
        try:
            repository, tag = split_ref(ref)
            with _translated(f"docker commit {ref}"):
                result = api.commit(created["Id"], repository=repository, tag=tag,
                                    changes=changes)
        finally:
            api.remove_container(created["Id"], force=True, v=True)
        return result["Id"]

    # -- containers ------------------------------------------------------------------------
    def run_container(self, image: str, command: list[str] | None = None, *,
                      env: dict[str, str] | None = None, mounts: Iterable[Mount] = (),
                      shm_size: str | None = None, ports: dict[str, Any] | None = None,
                      gpus: "bool | GpuSetting" = False, name: str | None = None,
                      entrypoint: list[str] | None = None, labels: dict[str, str] | None = None,
                      network: str | None = None, user: str | None = None,
                      mem_limit: str | None = None) -> str:
        """Start a detached container; return its id. `ports`: {"8000/tcp": ("127.0.0.1",
        None)}; `gpus`: every NVIDIA GPU (True, or how matrix.yaml's smoke.gpu_access asks:
        `--gpus all`, a CDI device or the host's device nodes)."""
        import docker

        mounts = list(mounts)
        env = dict(env or {})
        ports = dict(ports or {})
        access = self.gpu_access(None if gpus is True else gpus) if gpus else None
        gpu_options: dict[str, Any] = {}
        if access is not None:
            gpu_options = self._gpu_options(image, access)
            env.update(gpu_options.pop("environment"))
        local = self.is_local()
        copied = [m for m in mounts if m.copied_to(local)]
        bound = [m for m in mounts if not m.copied_to(local)]
        _sdk_log(run_command_line(image, command, env, bound, shm_size, ports,
                                  access.cli if access else [], name, entrypoint, network,
                                  mem_limit))
        with _translated(f"cannot start a container of {image}", gpu_request=bool(gpus),
                         engine=self.label()):
            container = self.sdk().containers.create(
                image, command=command, environment=env,
                mounts=[docker.types.Mount(target=m.target, source=m.source or None,
                                           type=m.kind, read_only=m.read_only) for m in bound]
                + gpu_options.pop("mounts", []),
                shm_size=shm_size, ports=ports or None, name=name,
                entrypoint=entrypoint, labels={OWNER_LABEL: "infermatrix", **(labels or {})},
                user=user, mem_limit=mem_limit, **_network_option(network), **gpu_options)
        try:
            for mount in copied:
                self.copy_into_container(container.id, Path(mount.source), mount.target)
            self.__dict__.setdefault("_copy_back", {})[container.id] = \
                [m for m in copied if not m.read_only]
            _sdk_log(f"docker start {container.id[:12]}")
            with _translated(f"cannot start a container of {image}", gpu_request=bool(gpus),
                             engine=self.label()):
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

    def image_env(self, image: str) -> dict[str, str]:
        """The image's configured environment (Config.Env)."""
        found = self.inspect_image(image) or {}
        pairs = (item.partition("=") for item in (found.get("Config") or {}).get("Env") or [])
        return {key: value for key, _, value in pairs}

    @contextlib.contextmanager
    def container(self, image: str, command: list[str] | None = None, *,
                  name: str | None = None, prefix: str = "infermatrix",
                  **kwargs: Any) -> Iterator[str]:
        """A detached container that is always stopped and removed afterwards (an interrupt
        included). It is named up front, so an interrupt that lands while Docker is still
        creating or starting it (before its id came back) still finds it by name."""
        name = name or f"{prefix}-{os.getpid()}-{next(_names)}"
        try:
            container_id = self.run_container(image, command, name=name, **kwargs)
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

    def reads_time_out(self) -> bool:
        """Whether the SDK's reads from this engine honour a timeout: unix:// and tcp:// do;
        the ssh:// transport (an `ssh ... docker system dial-stdio` process per request)
        does not, and a Docker context may stand for either."""
        address = self.endpoint.address if self.endpoint else engine_address()
        return address.startswith(("unix://", "tcp://"))

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
        import docker

        _sdk_log(f"docker stop --time {timeout} {container_id[:12]}")
        try:
            self.sdk().api.stop(container_id, timeout=timeout)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            raise EngineError(f"docker stop {container_id[:12]}: {exc}") from None

    @reconnecting
    def remove_container(self, container_id: str, force: bool = True) -> None:
        import docker

        _sdk_log(f"docker rm {'--force ' if force else ''}{container_id[:12]}")
        try:
            self.sdk().api.remove_container(container_id, force=force, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            raise EngineError(f"docker rm {container_id[:12]}: {exc}") from None

    def exec_in_container(self, container_id: str, command: list[str],
                          env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run a command in a running container; (exit code, output)."""
        _sdk_log(f"docker exec {container_id[:12]} {shlex.join(command)}")
        with _translated(f"docker exec {container_id[:12]}"):
            result = self.sdk().containers.get(container_id).exec_run(
                command, environment=env or None)
        return int(result.exit_code), result.output.decode("utf-8", "replace")

    # -- files out of an image -------------------------------------------------------------
    def copy_from_image(self, image: str, paths: Iterable[str],
                        dest_dir: Path) -> dict[str, Path]:
        """Copy paths out of an image without running it (create a container, read archives).

        Returns {path in image: where it landed under dest_dir}; missing paths are left out.
        """
        import docker

        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        api = self.sdk().api
        _sdk_log(f"docker create {shlex.quote(image)}  # then docker cp for each path")
        with _translated(f"docker create {image}"):
            container = api.create_container(image, command=["/bin/true"],
                                             labels={OWNER_LABEL: "infermatrix"})
        copied: dict[str, Path] = {}
        try:
            for path in paths:
                _sdk_log(f"docker cp {container['Id'][:12]}:{shlex.quote(path)} {dest_dir}")
                try:
                    stream, _stat = api.get_archive(container["Id"], path)
                except docker.errors.NotFound:
                    continue
                with _translated(f"docker cp {path}"):
                    copied[path] = _extract_archive(stream, dest_dir, path)
        finally:
            api.remove_container(container["Id"], force=True, v=True)
        return copied

    @contextlib.contextmanager
    def exported_filesystem(self, image: str) -> Iterator[Iterator[bytes]]:
        """The filesystem of an image as a tar stream (`docker create` + `docker export`),
        read without running the image; the container is removed afterwards."""
        api = self.sdk().api
        _sdk_log(f"docker create {shlex.quote(image)} && docker export <container>")
        with _translated(f"docker create {image}"):
            container = api.create_container(image, command=["/bin/true"],
                                             labels={OWNER_LABEL: "infermatrix"})
        try:
            yield api.export(container["Id"])
        finally:
            api.remove_container(container["Id"], force=True, v=True)


def _extract_archive(stream: Iterable[bytes], dest_dir: Path, path: str) -> Path:
    """Extract a get_archive stream (a tar whose top entry is the path's basename)."""
    with tempfile.TemporaryFile() as spool:
        for chunk in stream:
            spool.write(chunk)
        spool.seek(0)
        with tarfile.open(fileobj=spool) as archive:
            archive.extractall(dest_dir, filter="tar")
    return dest_dir / Path(path.rstrip("/")).name


# Registries (credentials, HTTP API v2, push and pull): registry.py.
