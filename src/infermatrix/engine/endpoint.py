"""Where a Docker engine is and how to reach it: an `Endpoint` (a builder of `build.builders`
/ `--builder`: `unix://`, `ssh://`, `tcp://` with TLS, or a Docker context), its address
checked as typed (`parse_builder`), and the SDK client made for it (or for DOCKER_HOST / the
current context)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import EngineUnavailable, UsageError


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
