"""A second, private Docker engine on this machine for the several-builders tests (issue 19).

It is a real dockerd with everything of its own: data root, exec root, pidfile, socket
(/run/im19-*/docker.sock), a containerd of its own (started apart, as a service manager would:
SIGKILLing dockerd is then a clean "engine died"), and a bridge of its own (im19br*, never
docker0: a dockerd started with --bridge=none would delete the shared docker0), no iptables.
Only this engine is ever killed; `stop()` kills its processes and removes its data root and
bridge. Needs root and Debian's docker.io (dockerd, containerd).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path


def wait_for(condition, timeout: float, what: str, interval: float = 0.3) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def make_certificates(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl), as
    Docker's "protect the daemon socket" guide makes them."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=im19-ca",
            "-keyout", "ca-key.pem", "-out", "ca.pem")
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        (directory / f"{name}.ext").write_text(
            f"extendedKeyUsage = {usage}\n" + ("subjectAltName = IP:127.0.0.1\n"
                                               if name == "server" else ""))
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=im19-{name}",
                "-keyout", f"{name}-key.pem", "-out", f"{name}.csr")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}-cert.pem")


class SecondEngine:
    def __init__(self, subnet: str = "172.31.0.1/16", tls_port: int | None = None) -> None:
        Path("/run").mkdir(exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="im19-", dir="/run"))  # short socket paths
        self.data = Path(tempfile.mkdtemp(prefix="im19-engine-", dir="/var/lib"))
        self.socket = self.root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.bridge = f"im19br{self.root.name[-5:]}".replace("_", "x")[:15]
        self.proc: subprocess.Popen[bytes] | None = None
        self.containerd: subprocess.Popen[bytes] | None = None
        self.containerd_socket = self.root / "containerd.sock"
        self.certs = self.root / "certs"
        self.tcp = f"tcp://127.0.0.1:{tls_port}" if tls_port else None
        if tls_port:
            make_certificates(self.certs)
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", subnet, "dev", self.bridge], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)

    def start(self) -> None:
        if self.containerd is None or self.containerd.poll() is not None:
            self._start_containerd()
        log = open(self.root / "dockerd.log", "ab")
        tls = ["-H", self.tcp, "--tlsverify", "--tlscacert", str(self.certs / "ca.pem"),
               "--tlscert", str(self.certs / "server-cert.pem"),
               "--tlskey", str(self.certs / "server-key.pem")] if self.tcp else []
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.data / "docker"), "--exec-root",
             str(self.root / "x"), "--pidfile", str(self.root / "dockerd.pid"),
             "--containerd", str(self.containerd_socket), "-H", self.host,
             f"--bridge={self.bridge}", "--iptables=false", "--ip-masq=false",
             "--log-level=warn", *tls], stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.answers, 120, "the second dockerd to answer", interval=0.5)

    def _start_containerd(self) -> None:
        config = self.root / "containerd.toml"
        config.write_text('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
        log = open(self.root / "containerd.log", "ab")
        self.containerd = subprocess.Popen(
            ["containerd", "--config", str(config), "--root", str(self.data / "containerd"),
             "--state", str(self.root / "cs"), "--address", str(self.containerd_socket),
             "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.containerd_socket.exists, 60, "the second containerd socket")

    def answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError("the second dockerd exited: "
                                 + (self.root / "dockerd.log").read_text()[-2000:])
        return self.docker("version").returncode == 0

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/usr/bin/docker", "-H", self.host, *args], capture_output=True,
                              text=True, timeout=300)

    def image_id(self, ref: str) -> str | None:
        found = self.docker("image", "inspect", "--format", "{{.Id}}", ref)
        return found.stdout.strip() if found.returncode == 0 else None

    def kill(self) -> None:
        """SIGKILL dockerd (an engine that dies mid-run); its containerd is left running."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        for process in (self.proc, self.containerd):
            if process and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        # Mounts the engine left (overlay layers, shm of containers) before removing its data.
        mounts = Path("/proc/mounts").read_text().splitlines()
        for line in reversed(mounts):
            target = line.split()[1]
            if target.startswith((str(self.data), str(self.root))):
                subprocess.run(["umount", "-l", target], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.data, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)
