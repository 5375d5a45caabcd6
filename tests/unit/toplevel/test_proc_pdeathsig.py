"""proc.run(die_with_parent=True) (issue 44): a command that holds credentials (cosign) does not
run on after its parent is killed by SIGKILL, although it runs in its own session. Real
processes: a Python parent running `sleep` through proc.run, killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PARENT = """
import sys
from infermatrix import proc
proc.run(["sleep", "300"], die_with_parent=sys.argv[1] == "1", timeout=600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.is_file() and "State:\tZ" in status.read_text())


def sleep_child_of(parent: int, deadline_s: float = 20) -> int:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-P", str(parent), "-x", "sleep"],
                               capture_output=True, text=True).stdout.split()
        if found:
            return int(found[0])
        time.sleep(0.1)
    pytest.fail("the parent never started sleep")


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_a_command_dies_with_its_killed_parent_only_when_asked(die_with_parent):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "1" if die_with_parent else "0"])
    child = sleep_child_of(parent.pid)
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive(child) is not die_with_parent  # without it: the orphan the issue found
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
