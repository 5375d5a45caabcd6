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
