"""Secrets leave nothing behind (issue 44), with the real cosign, a real docker-registry with
htpasswd auth on loopback and the real Docker engine (the fixtures of test_signing_registry.py).

The registry credentials cosign needs go into a private directory under the state directory
(`<state>/secrets/auth-<pid>-*`, 0700, its config.json 0600). A publish killed by SIGKILL while
cosign signs leaves no cosign running (it dies with its parent) and its credentials directory
is removed by the next run, which signs and leaves the secrets directory empty.

The one fake: FAKE_SLOW_COSIGN, the real cosign started after a pause on `sign`, so that the
kill lands while cosign holds the credentials (a timing a real cosign does not give on cue)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from infermatrix.engine import cosign
from infermatrix.engine import registry as registry_api
from infermatrix.stages import publish
from tests.docker.test_publish_registry import CPU_CELL
from tests.docker.test_signing_registry import (  # noqa: F401 (fixtures)
    KEY_PASSWORD, PASSWORD, USER, assert_no_secret_in, context_dir, env, images, keys,
    mark_passed, publish_cli, registry, secrets_of)

pytestmark = [pytest.mark.docker, pytest.mark.registry]

FAKE_SLOW_COSIGN = """#!{python}
# FAKE_SLOW_COSIGN: the real cosign, after a pause on `sign` (the test kills its parent then)
import os, sys, time
if sys.argv[1:2] == ["sign"]:
    with open(os.environ["FAKE_COSIGN_MARKER"], "w") as handle:
        handle.write(f"{{os.getpid()}} {{os.environ.get('DOCKER_CONFIG', '')}}")
    time.sleep(120)
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead: it only waits for its parent to read its status
    status = Path(f"/proc/{pid}/status")
    return not (status.is_file() and "State:\tZ" in status.read_text())


def test_a_killed_signing_leaves_no_credentials_and_no_cosign(tmp_path, registry, images, keys,
                                                              env, capsys):
    repo = f"secrets-{uuid.uuid4().hex[:6]}"
    root = context_dir(tmp_path / "publisher", registry.host, repo)
    lock = root / "images.lock"
    mark_passed(root / "state", CPU_CELL, images["cpu"])
    fake = tmp_path / "FAKE_SLOW_COSIGN"
    fake.write_text(FAKE_SLOW_COSIGN.format(python=sys.executable, real=cosign.binary()))
    fake.chmod(0o755)
    marker = tmp_path / "cosign-started"
    child_env = {**os.environ, cosign.COSIGN_ENV: str(fake), "FAKE_COSIGN_MARKER": str(marker),
                 cosign.KEY_FILE_ENV: str(keys["private"]), cosign.PASSWORD_ENV: KEY_PASSWORD,
                 registry_api.REGISTRY_USER_ENV: USER,
                 registry_api.REGISTRY_PASSWORD_ENV: PASSWORD}
    run = subprocess.Popen(
        [sys.executable, "-m", "infermatrix", "publish", "--matrix", str(root / "matrix.yaml"),
         "--state-dir", str(root / "state"), "--select", CPU_CELL, "--lock", str(lock),
         "--wait"], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not (marker.is_file() and marker.read_text()):
            assert run.poll() is None, run.stdout.read().decode() if run.stdout else ""
            assert time.monotonic() < deadline, "cosign sign never started"
            time.sleep(0.2)
        pid_text, docker_config = marker.read_text().split(" ", 1)
        cosign_pid = int(pid_text)
        secrets = root / "state" / cosign.SECRETS_DIR
        auth = Path(docker_config)
        # while cosign signs: its credentials are in the state's private directory, 0700/0600
        assert auth.parent == secrets and auth.name.startswith(f"auth-{run.pid}-")
        assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
        assert stat.S_IMODE(auth.stat().st_mode) == 0o700
        assert stat.S_IMODE((auth / "config.json").stat().st_mode) == 0o600
        assert alive(cosign_pid)
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        deadline = time.monotonic() + 10
        while alive(cosign_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(cosign_pid), "cosign runs on as an orphan after its parent's SIGKILL"
        assert (auth / "config.json").is_file()  # what the killed run could not remove
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()

    # the next run (the real cosign) removes it, signs, and leaves no credentials behind
    env.setenv(cosign.KEY_FILE_ENV, str(keys["private"]))
    env.setenv(cosign.PASSWORD_ENV, KEY_PASSWORD)
    out = publish_cli(root, CPU_CELL, lock, capsys)
    assert f"({CPU_CELL}, signed)" in out
    assert publish.read_images_lock(lock)["images"][CPU_CELL]["signing"]["signed"]
    assert not auth.exists()
    assert list(secrets.iterdir()) == []
    assert_no_secret_in([root], secrets_of(keys["private"]))
