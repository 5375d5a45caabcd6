"""What decides whether a bench's figure is alone on the CPUs.

With the kernel's autogroup scheduling on (`/proc/sys/kernel/sched_autogroup_enabled` = 1, the
default of many distributions), `nice -n 19` only ranks processes within their own session: a
niced test run started from another terminal still takes an equal share of the cores from a
compile. Measured 2026-12-06 on the 2-core host: with it on, four niced pytest/mypy processes
held 62% of each core beside flash-attn's two cicc jobs; with it off, under 2%.
"""

from __future__ import annotations

import sys
from pathlib import Path

AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroup_enabled() -> bool | None:
    """The kernel's autogroup setting (None: no such setting on this kernel)."""
    try:
        return AUTOGROUP.read_text().strip() == "1"
    except OSError:
        return None


def warn_if_nice_is_weak() -> bool | None:
    enabled = autogroup_enabled()
    if enabled:
        print(f"bench: {AUTOGROUP} is 1: `nice` does not keep other sessions' work off the CPUs "
              f"this bench measures (`echo 0 > {AUTOGROUP}` as root, or keep the host idle)",
              file=sys.stderr)
    return enabled
