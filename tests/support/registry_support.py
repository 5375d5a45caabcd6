"""A real registry for tests: Debian's docker-registry (distribution 2.8) with htpasswd (bcrypt)
auth on a free loopback port, its data in a directory of the test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml


# The session registry's credentials (tests/conftest.py: session_registry)
SESSION_USER, SESSION_PASSWORD = "publisher", "pw-" + uuid.uuid4().hex[:12]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Registry:
    host: str
    root: Path
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def host_address() -> str:
    """A non-loopback address of this host (the daemon demands TLS of such registries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
        return sock.getsockname()[0]


def self_signed_cert(root: Path, address: str) -> tuple[Path, Path]:
    """A certificate for `address` that no CA bundle trusts."""
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN={address}", "-addext", f"subjectAltName=IP:{address}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def start_registry(root: Path, user: str, password: str, address: str = "127.0.0.1",
                   tls: tuple[Path, Path] | None = None) -> Registry:
    if not shutil.which("docker-registry") or not shutil.which("htpasswd"):
        pytest.skip("needs Debian's docker-registry and apache2-utils (htpasswd)")
    root.mkdir(parents=True, exist_ok=True)
    htpasswd = subprocess.run(["htpasswd", "-Bbn", user, password], check=True,
                              capture_output=True, text=True).stdout
    (root / "htpasswd").write_text(htpasswd)
    port = free_port()
    http: dict = {"addr": f"{address}:{port}"}
    if tls:
        http["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
    config = {"version": 0.1, "log": {"level": "warn"},
              "storage": {"filesystem": {"rootdirectory": str(root / "data")},
                          "delete": {"enabled": True}},
              "http": http,
              "auth": {"htpasswd": {"realm": "infermatrix-test", "path": str(root / "htpasswd")}}}
    (root / "config.yml").write_text(yaml.safe_dump(config))
    with open(root / "registry.log", "w") as log:
        server = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")],
                                  stdout=log, stderr=subprocess.STDOUT)
    host = f"{address}:{port}"
    scheme = "https" if tls else "http"
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(f"{scheme}://{host}/v2/", timeout=2,
                            verify=str(tls[0]) if tls else True).status_code == 401:
                return Registry(host, root, server)
        except requests.ConnectionError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"docker-registry did not start:\n{(root / 'registry.log').read_text()}")
        time.sleep(0.2)
