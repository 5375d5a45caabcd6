"""Compose, whichever implementation the host has: the v2 plugin (`docker compose`) or Debian's
`docker-compose` (1.29, Python). Every call goes through proc.run, so each is logged exactly.

Used to start and stop a deployment written by `infermatrix deploy` (tests, bench, the
throughput level of a deployed cell); the Compose file itself is consumer/deploy.py's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .. import proc
from ..errors import UsageError
from .builds import candidate_clients

INSTALL_HINT = ("no Compose here: install Debian's `docker-compose` package (apt-get install "
                "docker-compose) or the Compose v2 plugin (`docker compose`)")


def compose_command() -> list[str]:
    """`docker compose` when a docker client has the plugin, else `docker-compose`."""
    for binary in candidate_clients():
        try:
            answer = subprocess.run([binary, "compose", "version"], capture_output=True,
                                    timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if answer.returncode == 0:
            return [binary, "compose"]
    found = shutil.which("docker-compose")
    if found:
        return [found]
    raise UsageError(INSTALL_HINT)


def compose(directory: Path, project: str, *args: str, timeout: float | None = 600,
            check: bool = True, log_path: Path | None = None) -> proc.Completed:
    """Run a Compose subcommand on DIRECTORY/compose.yaml as project PROJECT."""
    argv = [*compose_command(), "-p", project, "-f", str(directory / "compose.yaml"), *args]
    return proc.run(argv, cwd=directory, timeout=timeout, check=check, log_path=log_path)


def up(directory: Path, project: str, log_path: Path | None = None) -> None:
    compose(directory, project, "up", "-d", log_path=log_path)


def down(directory: Path, project: str, log_path: Path | None = None) -> None:
    """Stop and remove the project's containers (and its network); never its image."""
    compose(directory, project, "down", "--timeout", "10", check=False, log_path=log_path)


def kill(directory: Path, project: str, service: str) -> None:
    compose(directory, project, "kill", service)
