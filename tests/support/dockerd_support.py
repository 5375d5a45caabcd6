"""A private Docker engine on this machine, for the tests that kill an engine, fill its disk or
build on a second one (the fault tests, issue 17; the several-builders tests, issue 19).

It is a real dockerd with everything of its own: data root (on the disk, or on a tmpfs of
`size_mb` for the disk-full tests), exec root, pidfile, socket (/run/<prefix>-*/docker.sock,
short: socket paths are limited), optionally tcp:// with --tlsverify, a containerd of its own
(started apart, as a service manager would: SIGKILLing dockerd is then a clean "engine died",
and a restarted dockerd reconnects to it), and a bridge of its own (never docker0: a dockerd
started with --bridge=none would delete the shared docker0), no iptables of its own. With
`nat=True` its builds and containers reach PyPI: this helper adds a MASQUERADE rule for its
subnet and FORWARD accepts for its bridge (what dockerd's --ip-masq would do, without a second
dockerd editing the first one's chains), removed again by `stop()`. Only this engine is ever
killed; `stop()` kills its processes and removes its mounts, data root, bridge and rules.
Needs root and Debian's docker.io (dockerd, containerd).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
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


def make_certificates(directory: Path, prefix: str) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl), as
    Docker's "protect the daemon socket" guide makes them."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={prefix}-ca", "-keyout", "ca-key.pem", "-out", "ca.pem")
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        (directory / f"{name}.ext").write_text(
            f"extendedKeyUsage = {usage}\n" + ("subjectAltName = IP:127.0.0.1\n"
                                               if name == "server" else ""))
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={prefix}-{name}",
                "-keyout", f"{name}-key.pem", "-out", f"{name}.csr")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}-cert.pem")


def nat_rules(bridge: str, network: str) -> list[tuple[str, str, list[str]]]:
    """(table, chain, rule) that let a bridge's containers out through the host (masquerade),
    with the replies let back in: the machine's dockerd set FORWARD's policy to DROP."""
    return [("nat", "POSTROUTING", ["-s", network, "!", "-o", bridge, "-j", "MASQUERADE"]),
            ("filter", "FORWARD", ["-i", bridge, "!", "-o", bridge, "-j", "ACCEPT"]),
            ("filter", "FORWARD", ["-o", bridge, "-m", "conntrack", "--ctstate",
                                   "RELATED,ESTABLISHED", "-j", "ACCEPT"])]


def _end(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class PrivateDockerd:
    def __init__(self, prefix: str, subnet: str, size_mb: int | None = None,
                 tls_port: int | None = None, nat: bool = False, niceness: int = 0) -> None:
        """`niceness`: of its dockerd and containerd, so of every build step and container
        it runs (they descend from them): the real lane's is the critical path of CI."""
        self.niceness = niceness
        Path("/run").mkdir(exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/run"))
        if size_mb:  # a small disk of its own, to fill
            self.data = self.root / "d"
            self.data.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m",
                            f"{prefix}-tmpfs", str(self.data)], check=True)
        else:  # on the machine's disk (/run is a small tmpfs)
            self.data = Path(tempfile.mkdtemp(prefix=f"{prefix}-engine-", dir="/var/lib"))
        self.socket = self.root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.env = {"DOCKER_HOST": self.host}
        self.proc: subprocess.Popen[bytes] | None = None
        self.containerd: subprocess.Popen[bytes] | None = None
        self.containerd_socket = self.root / "containerd.sock"
        self.certs = self.root / "certs"
        self.tcp = f"tcp://127.0.0.1:{tls_port}" if tls_port else None
        if tls_port:
            make_certificates(self.certs, prefix)
        self.bridge = f"{prefix}br{self.root.name[-6:]}".replace("_", "x")[:15]
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", subnet, "dev", self.bridge], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        self.nat_rules = nat_rules(self.bridge, str(ipaddress.ip_interface(subnet).network)) \
            if nat else []
        for table, chain, rule in self.nat_rules:
            subprocess.run(["iptables", "-t", table, "-I", chain, "1", *rule], check=True)

    def start(self) -> None:
        if self.containerd is None or self.containerd.poll() is not None:
            self._start_containerd()
        log = open(self.root / "dockerd.log", "ab")
        tls = ["-H", self.tcp, "--tlsverify", "--tlscacert", str(self.certs / "ca.pem"),
               "--tlscert", str(self.certs / "server-cert.pem"),
               "--tlskey", str(self.certs / "server-key.pem")] if self.tcp else []
        self.proc = subprocess.Popen(
            [*self._nice(), "dockerd", "--data-root", str(self.data / "docker"), "--exec-root",
             str(self.root / "x"), "--pidfile", str(self.root / "dockerd.pid"),
             "--containerd", str(self.containerd_socket), "-H", self.host,
             f"--bridge={self.bridge}", "--iptables=false", "--ip-masq=false",
             "--log-level=warn", *tls], stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.answers, 120, "the private dockerd to answer", interval=0.5)

    def _start_containerd(self) -> None:
        config = self.root / "containerd.toml"
        config.write_text('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
        log = open(self.root / "containerd.log", "ab")
        self.containerd = subprocess.Popen(
            [*self._nice(), "containerd", "--config", str(config), "--root", str(self.data / "containerd"),
             "--state", str(self.root / "cs"), "--address", str(self.containerd_socket),
             "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.containerd_socket.exists, 60, "the private containerd socket")

    def _nice(self) -> list[str]:
        return ["nice", "-n", str(self.niceness)] if self.niceness else []

    def answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError("the private dockerd exited: "
                                 + (self.root / "dockerd.log").read_text()[-2000:])
        return self.docker("version").returncode == 0

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/usr/bin/docker", "-H", self.host, *args], capture_output=True,
                              text=True, timeout=300)

    def image_id(self, ref: str) -> str | None:
        found = self.docker("image", "inspect", "--format", "{{.Id}}", ref)
        return found.stdout.strip() if found.returncode == 0 else None

    def load(self, image: str) -> None:
        """Copy an image of the machine's engine into this one (a base, say)."""
        subprocess.run(f"docker save {image} | docker -H {self.host} load -q", shell=True,
                       check=True, capture_output=True)

    def free_mb(self) -> float:
        stat = os.statvfs(self.data)
        return stat.f_bavail * stat.f_frsize / 2**20

    def kill(self) -> None:
        """SIGKILL dockerd (an engine that dies mid-run); its containerd is left running."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, background_removal: bool = False) -> None:
        """Stop the engine and remove its data. `background_removal`: a detached `rm -rf`
        removes the data root (the real lane's holds ~30 GB of overlay layers; removing it takes
        ~90 s on CI's disk), so the lane ends without waiting; while it runs, its command line
        names the root, so reclaim_stale_engines leaves it alone, and a removal cut short is
        reclaimed by the next run."""
        _end(self.proc)
        _end(self.containerd)
        # Mounts the engine left (overlay layers, shm of containers, the tmpfs) before removing
        # its data, deepest first.
        mounts = Path("/proc/mounts").read_text().splitlines()
        for line in reversed(mounts):
            target = line.split()[1]
            if target.startswith((str(self.data), str(self.root))):
                subprocess.run(["umount", "-l", target], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for table, chain, rule in self.nat_rules:
            subprocess.run(["iptables", "-t", table, "-D", chain, *rule], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if background_removal and self.data.exists():
            subprocess.Popen(["rm", "-rf", "--one-file-system", str(self.data)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        else:
            shutil.rmtree(self.data, ignore_errors=True)


STALE_DATA = re.compile(r"im[a-z0-9]+-engine-[a-z0-9_]+")  # PrivateDockerd's data roots


def _live_command_lines() -> str:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(cmdline.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
        except OSError:
            continue
    return "\n".join(found)


def stale_engine_dirs(parent: Path = Path("/var/lib")) -> list[Path]:
    """Data roots of private engines no process uses any more: a run killed before `stop()`
    (CI cancelled, the time guard, a SIGKILL) leaves one behind, up to 30 GB for the real
    lane's."""
    live = _live_command_lines()
    return sorted(d for d in parent.iterdir()
                  if d.is_dir() and STALE_DATA.fullmatch(d.name) and str(d) not in live)


def reclaim_stale_engines(parent: Path = Path("/var/lib")) -> list[Path]:
    """Unmount what the dead engines left mounted (deepest first) and remove their data."""
    stale = stale_engine_dirs(parent)
    mounts = Path("/proc/mounts").read_text().splitlines()
    for directory in stale:
        for line in reversed(mounts):
            target = line.split()[1]
            if target.startswith(str(directory) + "/"):
                subprocess.run(["umount", "-l", target], capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)
    return stale


def bridges_on_this_machine() -> list[str]:
    listed = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True,
                            text=True).stdout
    return [line.split(":", 2)[1].strip().split("@")[0] for line in listed.splitlines()
            if line.count(":") >= 2]


def rules_naming(bridge: str) -> list[tuple[str, list[str]]]:
    """(table, rule without its -A) of every iptables rule that names `bridge`."""
    found = []
    for table in ("nat", "filter"):
        listed = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True,
                                text=True).stdout
        for line in listed.splitlines():
            words = shlex.split(line)
            if words[:1] == ["-A"] and bridge in words:
                found.append((table, words[1:]))
    return found


def reclaim_stale_bridges(prefix: str = "im") -> list[str]:
    """The bridges and NAT rules of private engines no process uses any more (a run killed
    before `stop()`): left behind, the next run's engine on the same subnet could not reach
    PyPI. Only names of this helper's shape (PREFIXbrXXXXXX) are touched, and only before the
    lanes start (a bridge exists a moment before its dockerd names it on its command line)."""
    shape = re.compile(rf"{re.escape(prefix)}[a-z0-9]*br[a-z0-9_x]+")
    live = _live_command_lines()
    stale = [b for b in bridges_on_this_machine()
             if shape.fullmatch(b) and f"--bridge={b}" not in live]
    for bridge in stale:
        for table, rule in rules_naming(bridge):
            subprocess.run(["iptables", "-t", table, "-D", *rule], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    return stale
