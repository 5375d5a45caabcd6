"""The SDK's ssh:// socket closes a connection whose ssh process has already ended
(docker-py#3218): the real SSHSocket class, a real ended process, no Docker."""

from __future__ import annotations

import subprocess

import docker
import pytest
from docker.transport.sshconn import SSHSocket

from infermatrix.engine import docker as engine
from infermatrix.engine.sshsocket import SDK_CLOSE, close_tolerating_an_ended_ssh


def ended_process() -> subprocess.Popen:
    """What a pooled connection holds once `docker system dial-stdio` ended its stream."""
    proc = subprocess.Popen(["true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.wait()
    return proc


def test_the_sdks_own_close_raises_on_an_ended_process():
    """The fault the mend is for, shown on the SDK's own close."""
    sock = SSHSocket("root@127.0.0.1:22")
    sock.proc = ended_process()
    original = getattr(SSHSocket.close, SDK_CLOSE, SSHSocket.close)  # mended or not yet
    assert original is not close_tolerating_an_ended_ssh
    with pytest.raises(BrokenPipeError):
        original(sock)


def test_an_ssh_engines_client_closes_an_ended_process_quietly():
    nobody = engine.Endpoint("remote", host="ssh://root@127.0.0.1:1")  # refuses: port 1
    with pytest.raises(docker.errors.DockerException, match="server API version"):
        nobody.sdk_client()  # mends the SDK's close before its first connection
    sock = SSHSocket("root@127.0.0.1:1")
    sock.proc = ended_process()
    sock.close()
    sock.close()  # twice: a pool may close what the response closed already
    assert sock.proc.stdin.closed


def test_a_running_ssh_process_is_terminated_and_reaped():
    sock = SSHSocket("root@127.0.0.1:1")
    sock.proc = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    close_tolerating_an_ended_ssh(sock)
    assert sock.proc.returncode is not None  # reaped: no zombie per request


@pytest.fixture
def silent_port():
    """A real listening TCP socket that never answers: the kernel completes the handshake
    (backlog), nothing is ever sent (issue 48: an ssh:// builder on such a host hung the run)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


@pytest.mark.timeout(60)  # before the fix this hung: ssh waits for the banner for ever
def test_an_ssh_builder_that_never_speaks_ssh_is_left_out_in_bounded_time(silent_port,
                                                                          monkeypatch):
    from infermatrix.engine import builders

    monkeypatch.setenv("INFERMATRIX_SSH_HANDSHAKE_S", "2")
    said: list[str] = []
    up, down = builders.connect([engine.Endpoint("mute", host=f"ssh://root@127.0.0.1:"
                                                 f"{silent_port}")], said.append)
    assert up == []
    assert "no SSH banner" in down["mute"] and f"127.0.0.1:{silent_port}" in down["mute"]
    assert said == [f"builder mute left out: {down['mute']}"]


@pytest.mark.timeout(60)
def test_a_smoke_engine_that_never_speaks_ssh_is_unavailable_naming_the_fix(silent_port,
                                                                            monkeypatch):
    from infermatrix.errors import EngineUnavailable

    monkeypatch.setenv("INFERMATRIX_SSH_HANDSHAKE_S", "2")
    target = engine.Engine(engine.parse_builder(f"ssh://127.0.0.1:{silent_port}"))
    with pytest.raises(EngineUnavailable, match="no SSH banner") as raised:
        target.sdk()
    assert "INFERMATRIX_SSH_HANDSHAKE_S" in str(raised.value)
    assert not target.available()


def test_the_handshake_check_passes_a_real_ssh_banner(monkeypatch):
    """A server that sends an SSH identification line passes the check (the SDK's ssh then
    does the rest)."""
    import socket
    import threading

    from infermatrix.engine.sshsocket import ssh_handshake_problem

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def greet() -> None:
        conn, _ = server.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
        conn.recv(1)
        conn.close()

    threading.Thread(target=greet, daemon=True).start()
    try:
        assert ssh_handshake_problem(f"ssh://u@127.0.0.1:{server.getsockname()[1]}", 5) is None
    finally:
        server.close()
