"""A real sshd on loopback for the ssh:// builder tests (Debian's openssh-server, started here
with its own config, host key and client key; never the system's service).

The docker CLI and the SDK reach `ssh://root@127.0.0.1:PORT` through the `ssh` binary, which
takes the user's identity from an ssh-agent (SSH_AUTH_SOCK, set for this process and the
commands it starts) and the host key from the user's known_hosts. OpenSSH reads that file from
the passwd home, not $HOME, so the test appends one line for [127.0.0.1]:PORT and removes
exactly that line afterwards.

Used by the main job's end-to-end test (tests/docker/test_pipeline.py: the CPU cell built, audited,
served, tagged and published through the ssh:// builder) and the cut-connection test
(tests/docker/test_ssh_builder.py)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.registry_support import free_port

SSHD = "/usr/sbin/sshd"


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents first (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


@dataclass
class LoopbackSshd:
    root: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    agent_pid: int | None = None
    known_line: str = ""

    @property
    def endpoint(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"SSH_AUTH_SOCK": str(self.root / "agent.sock")}

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(self.root / name)], check=True)
        shutil.copy(self.root / "client_key.pub", self.root / "authorized_keys")
        (self.root / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.root / 'host_key'}\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            f"PidFile {self.root / 'sshd.pid'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "StrictModes no\n"
            # every SDK connection is an `ssh ... docker system dial-stdio`: on a loaded 2-core
            # CI machine more than sshd's default 10 may be authenticating at once
            "MaxStartups 100:30:200\n")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
        agent = subprocess.run(["ssh-agent", "-a", str(self.root / "agent.sock"), "-s"],
                               capture_output=True, text=True, check=True).stdout
        self.agent_pid = int(agent.split("SSH_AGENT_PID=", 1)[1].split(";", 1)[0])
        subprocess.run(["ssh-add", "-q", str(self.root / "client_key")], check=True,
                       env={**os.environ, **self.env})
        host_key = (self.root / "host_key.pub").read_text().split()[:2]
        self.known_line = f"[127.0.0.1]:{self.port} {' '.join(host_key)}"
        known = self.known_hosts()
        known.parent.mkdir(mode=0o700, exist_ok=True)
        with known.open("a") as handle:
            handle.write(self.known_line + "\n")

    @staticmethod
    def known_hosts() -> Path:
        return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"

    def start(self) -> None:
        """sshd in the foreground (-D), its log beside the config; up when the port answers."""
        log = (self.root / "sshd.log").open("a")
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                        stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"sshd did not listen on {self.port}: "
                           + (self.root / "sshd.log").read_text()[-2000:])

    def cut(self) -> None:
        """Kill this sshd and every session it serves (its process tree, however the sessions
        grouped themselves): each ssh connection drops at once."""
        if self.process is None:
            return
        tree = [self.process.pid, *descendants(self.process.pid)]
        for pid in reversed(tree):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        self.process = None

    def close(self) -> None:
        self.cut()
        if self.agent_pid:
            os.kill(self.agent_pid, signal.SIGTERM)
        known = self.known_hosts()
        if known.is_file():
            kept = [line for line in known.read_text().splitlines() if line != self.known_line]
            known.write_text("".join(line + "\n" for line in kept))


def serve_loopback_sshd(root: Path):  # -> Iterator[LoopbackSshd]
    """A started LoopbackSshd with SSH_AUTH_SOCK set for this process and what it starts;
    everything undone afterwards (a pytest fixture's body: `yield from`)."""
    import pytest

    if not Path(SSHD).is_file():
        pytest.fail(f"no {SSHD}: .ci/provision installs openssh-server")
    server = LoopbackSshd(root)
    before = os.environ.get("SSH_AUTH_SOCK")
    server.prepare()
    server.start()
    os.environ.update(server.env)
    try:
        yield server
    finally:
        server.close()
        if before is None:
            os.environ.pop("SSH_AUTH_SOCK", None)
        else:
            os.environ["SSH_AUTH_SOCK"] = before
