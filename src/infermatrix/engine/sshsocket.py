"""The Docker SDK's `ssh://` transport (`use_ssh_client=True`), closing safely.

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
import subprocess
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
        sshconn.SSHSocket.close = close_tolerating_an_ended_ssh
