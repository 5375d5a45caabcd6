"""Provisioning starts dockerd in its own session (.ci/detach, issue 47): a Ctrl-C of the job
that provisioned (SIGINT to its foreground process group) never reaches the engine. Checked on a
real process started the way provision starts dockerd, with `sleep` standing in for it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.paths import REPO

DETACH = REPO / ".ci" / "detach"


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def started(tmp_path):
    """The pids .ci/detach printed, each stopped (by its own pid) after the test."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_provision_starts_dockerd_through_detach():
    provision = (REPO / ".ci" / "provision").read_text()
    assert '/detach" "$DOCKERD_LOG" dockerd' in provision
    assert "nohup dockerd" not in provision


def test_the_detached_daemon_has_its_own_session_and_no_terminal_stdin(tmp_path, started):
    log = tmp_path / "daemon.log"
    out = subprocess.run(["bash", str(DETACH), str(log), "sleep", "120"], capture_output=True,
                         text=True, timeout=30, check=True)
    pid = int(out.stdout.strip())
    started.append(pid)
    assert alive(pid)
    assert os.getsid(pid) != os.getsid(0)
    assert os.getpgid(pid) != os.getpgid(0)
    assert os.getsid(pid) == pid  # a session leader: no controlling terminal of ours
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/1") == str(log)


def test_a_ctrl_c_of_the_caller_group_leaves_the_daemon_running(tmp_path, started):
    """The caller's job (a process group of its own, as a terminal's foreground job is) gets
    SIGINT as Ctrl-C sends it; the job ends, the daemon runs on."""
    pid_file = tmp_path / "pid"
    job = subprocess.Popen(
        ["bash", "-c", f'bash {DETACH} {tmp_path / "log"} sleep 120 > {pid_file}; sleep 60'],
        start_new_session=True)
    deadline = time.monotonic() + 20
    while not pid_file.read_text().strip() if pid_file.exists() else True:
        assert time.monotonic() < deadline, "detach printed no pid"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    started.append(pid)
    os.killpg(job.pid, signal.SIGINT)
    assert job.wait(timeout=20) != 0
    time.sleep(0.2)
    assert alive(pid)


def test_detach_without_a_command_is_a_usage_error(tmp_path):
    out = subprocess.run(["bash", str(DETACH), str(tmp_path / "log")], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2
    assert "usage" in out.stderr
