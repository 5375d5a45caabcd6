"""The Docker SDK's `ssh://` transport (`use_ssh_client=True`): a bounded handshake check
before it is used, and closing safely.

The SDK's transport runs `ssh HOST docker system dial-stdio` with no timeout of its own: a host
that accepts the TCP connection but never speaks SSH (a hung sshd, a port forwarded to
something else) kept ssh waiting for the server's banner for ever, and the run with it (issue
48). `ssh_handshake_problem` connects to the address ssh would use (`ssh -G`) and waits a
bounded time (INFERMATRIX_SSH_HANDSHAKE_S, default 15 s) for the `SSH-` identification line.

Each pooled connection of that transport is one `ssh HOST docker system dial-stdio` process;
its socket's `close()` writes two newlines to the process's stdin before terminating it. When
the process has already ended (dial-stdio ends with the stream it carried: an `exec` whose
output was read to the end, a connection urllib3 found dropped), that write raises
BrokenPipeError out of whatever SDK call was closing the connection, though the call itself
succeeded (docker/docker-py#3218, open for docker 7.x). Seen here as a bare
`BrokenPipeError: [Errno 32] Broken pipe` failing the model level over an ssh:// builder, at
random: it depends on whether ssh exited before the close. The close below is the SDK's, less
that failure, and it reaps the process it terminates (the SDK's leaves a zombie per request).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from typing import Any

SDK_CLOSE = "sdk_close"  # where the mended close keeps the SDK's own (tests show its fault)


def close_tolerating_an_ended_ssh(sock: Any) -> None:
    """SSHSocket.close, where an ssh process that ended already is not an error."""
    proc = sock.proc
    if not proc or proc.stdin.closed:
        return
    with contextlib.suppress(OSError):  # BrokenPipeError: the process is gone
        proc.stdin.write(b"\n\n")
        proc.stdin.flush()
    with contextlib.suppress(OSError):
        proc.stdin.close()  # a second close() returns at once, as the SDK's check intends
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def mend_ssh_socket_close() -> None:
    """Install the close above on the SDK's SSHSocket (once; before an ssh:// client)."""
    from docker.transport import sshconn

    if sshconn.SSHSocket.close is not close_tolerating_an_ended_ssh:
        setattr(close_tolerating_an_ended_ssh, SDK_CLOSE, sshconn.SSHSocket.close)
        setattr(sshconn.SSHSocket, "close", close_tolerating_an_ended_ssh)  # a method, replaced


HANDSHAKE_ENV = "INFERMATRIX_SSH_HANDSHAKE_S"
HANDSHAKE_DEFAULT_S = 15.0


def handshake_timeout_s() -> float:
    try:
        return max(0.1, float(os.environ.get(HANDSHAKE_ENV) or HANDSHAKE_DEFAULT_S))
    except ValueError:
        return HANDSHAKE_DEFAULT_S


def _ssh_config(user: str | None, host: str, port: str | None) -> dict[str, str] | None:
    """What ssh would use for this host (`ssh -G`: ~/.ssh/config applied, nothing sent), or
    None without an ssh client (the SDK then says so itself)."""
    if not shutil.which("ssh"):
        return None
    argv = ["ssh", "-G", *(["-l", user] if user else []), *(["-p", port] if port else []),
            "--", host]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    config: dict[str, str] = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        config.setdefault(key.lower(), value.strip())
    return config


def ssh_handshake_problem(url: str, timeout_s: float | None = None) -> str | None:
    """Why the ssh:// engine `url` cannot be used, found within `timeout_s`: it accepted the
    TCP connection but sent no SSH banner, or accepted no connection at all. None when the
    banner came, or when the check cannot tell (no ssh client, a ProxyCommand / ProxyJump in
    the way, a connection refused at once: the SDK says so itself)."""
    timeout_s = handshake_timeout_s() if timeout_s is None else timeout_s
    target = url.removeprefix("ssh://").rstrip("/")
    user, _, hostport = target.rpartition("@")
    host, port = hostport, None
    if hostport.count(":") == 1:
        host, port = hostport.split(":")
    config = _ssh_config(user or None, host, port)
    if config is None:
        return None
    if any(config.get(k, "none").lower() != "none" for k in ("proxycommand", "proxyjump")):
        return None  # reached through another program or host: not a direct connection
    address = (config.get("hostname") or host, int(config.get("port") or port or 22))
    shown = f"{address[0]}:{address[1]}"
    deadline = time.monotonic() + timeout_s
    try:
        conn = socket.create_connection(address, timeout=timeout_s)
    except TimeoutError:
        return (f"{url}: {shown} accepted no TCP connection within {timeout_s:g} s")
    except OSError:
        return None  # refused, unresolvable: ssh fails at once and the SDK names it
    received = b""
    try:
        with conn:
            while time.monotonic() < deadline:
                conn.settimeout(max(0.05, deadline - time.monotonic()))
                try:
                    chunk = conn.recv(256)
                except TimeoutError:
                    break
                if not chunk:
                    return (f"{url}: {shown} closed the connection without an SSH banner")
                received += chunk
                if any(line.startswith(b"SSH-") for line in received.split(b"\n")):
                    return None
                if len(received) > 8192:  # RFC 4253: lines before the banner are short
                    break
    except OSError as exc:
        return f"{url}: {shown} dropped the connection before an SSH banner ({exc})"
    said = f" (it sent {received[:60]!r})" if received else ""
    return (f"{url}: {shown} accepted the TCP connection but sent no SSH banner within "
            f"{timeout_s:g} s{said}: not an SSH server, or a hung sshd")
