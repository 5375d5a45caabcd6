"""A Docker engine at a plain `tcp://` address, without TLS (issue 48): it was used with no
warning, and its API traffic followed HTTP_PROXY (the engine's API, which is root on its host,
sent to a proxy). The engine is this machine's real one, reached over TCP (a non-loopback
address) through a byte relay to its socket; the "proxy" is a real listening socket that
counts the connections it gets."""

from __future__ import annotations

import os
import socket
import subprocess
import threading

import pytest

from infermatrix.engine import docker as engine

pytestmark = [pytest.mark.docker]


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _non_loopback_address() -> str:
    """An address of this machine that is not loopback: Go's proxy rule (the docker CLI's)
    never proxies a loopback host, so the relay listens where a real remote engine would be
    seen. The docker bridge's gateway is there wherever the engine runs."""
    found = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    v4 = [a for a in found if "." in a and not a.startswith("127.")]
    if not v4:
        pytest.fail(f"no non-loopback IPv4 address on this machine ({found})")
    return v4[0]


class Relay:
    """tcp://ADDRESS:PORT -> the engine's unix socket, byte for byte; a connection from any
    other machine is closed at once (a connection from this one comes from ADDRESS)."""

    def __init__(self, unix_path: str) -> None:
        self.server = socket.socket()
        self.address = _non_loopback_address()
        self.server.bind((self.address, 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.unix_path = unix_path
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                client, peer = self.server.accept()
            except OSError:
                return
            if peer[0] != self.address:  # only this machine (the engine is root here)
                client.close()
                continue
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.unix_path)
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()


class CountingProxy:
    """A listening socket that accepts, counts and closes: any request sent to it fails."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture
def plain_tcp(docker_available):
    address = engine.engine_address().split(" ")[0]
    if not address.startswith("unix://"):
        pytest.fail(f"this test relays to the machine engine's unix socket, not {address}")
    relay = Relay(address.removeprefix("unix://"))
    yield f"tcp://{relay.address}:{relay.port}"
    relay.server.close()


@pytest.fixture
def proxy(monkeypatch):
    found = CountingProxy()
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.setenv(name, found.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield found
    found.server.close()


def test_a_plain_tcp_engine_is_used_with_a_warning_and_never_through_a_proxy(
        plain_tcp, proxy, capsys):
    target = engine.Engine(engine.parse_builder(f"plain={plain_tcp}"))
    facts = target.facts()  # the SDK: `docker info` over the relay
    assert facts.cpus >= 1
    assert proxy.connections == 0
    err = capsys.readouterr().err
    assert f"{plain_tcp}" in err and "without TLS" in err, err
    # the docker CLI, as the build and save | load commands run it, does not go through the
    # proxy either
    cli = subprocess.run(target.cli("docker", ["version", "--format", "{{.Server.Version}}"]),
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, **target.cli_env()})
    assert cli.returncode == 0 and cli.stdout.strip(), cli.stderr
    assert proxy.connections == 0


def test_the_warning_is_said_once_per_engine(plain_tcp, proxy, capsys):
    for _ in range(2):
        engine.Engine(engine.parse_builder(f"plain={plain_tcp}")).facts()
    assert capsys.readouterr().err.count("without TLS") == 1


def test_default_engine_at_a_plain_tcp_docker_host_skips_the_proxy_too(plain_tcp, proxy,
                                                                       monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", plain_tcp)
    assert engine.Engine().facts().cpus >= 1
    assert proxy.connections == 0
    assert "without TLS" in capsys.readouterr().err
