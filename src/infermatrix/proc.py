"""Every external command the tool runs goes through here, so each is logged exactly.

The logged line is a shell command a user can paste to re-run it (environment overrides
first). Secret values never reach argv or the environment shown: callers pass secret *ids*
(BuildKit `--secret id=...,src=...` names a file, never its content).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO
from dataclasses import dataclass
from pathlib import Path

from .errors import CommandFailed

log = logging.getLogger("infermatrix.commands")

# Environment variables whose values are shown as *** in logs.
_SECRET_HINTS = ("TOKEN", "PASSWORD", "SECRET", "AUTH", "CREDENTIAL")


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if any(h in k.upper() for h in _SECRET_HINTS) else v)
            for k, v in env.items()}


def format_command(argv: list[str], env: dict[str, str] | None = None,
                   cwd: Path | None = None) -> str:
    """The exact command line, as a user would type it to run it again."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(env or {}).items()))
    line = shlex.join([str(a) for a in argv])
    line = f"{prefix} {line}" if prefix else line
    return f"(cd {shlex.quote(str(cwd))} && {line})" if cwd else line


@dataclass
class Completed:
    command: str
    returncode: int
    output: str  # stdout+stderr, possibly truncated to the tail when logged to a file
    duration_s: float
    log_path: Path | None


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        log_path: Path | None = None, timeout: float | None = None, check: bool = True,
        input_bytes: bytes | None = None, tail_lines: int = 40,
        on_line: Callable[[str], None] | None = None,
        die_with_parent: bool = False) -> Completed:
    """Run `argv`, logging the exact command; stream output to `log_path` when given, and
    each output line to `on_line` as it arrives (a progress display).

    With `check`, a non-zero exit or a timeout raises CommandFailed carrying the command and
    the log tail. `die_with_parent`: the command is killed when this process dies, even by
    SIGKILL (Linux PR_SET_PDEATHSIG; a command holding credentials must not run on alone).
    """
    command = format_command(argv, env, cwd)
    log.info("$ %s", command)
    full_env = {**os.environ, **(env or {})}
    started = time.monotonic()
    kept: deque[str] = deque(maxlen=max(tail_lines, 200))
    returncode: int | None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    with (open(log_path, "a", encoding="utf-8", errors="replace") if log_path else _Null()) as sink:
        sink.write(f"$ {command}\n")
        sink.flush()
        # its own process group: an interrupt of this run signals it and all it started
        # (children()), whatever signal reached us and from where
        proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=full_env,
                                stdin=subprocess.PIPE if input_bytes is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                preexec_fn=_pdeathsig(os.getpid()) if die_with_parent else None)
        with _LIVE_LOCK:
            _LIVE.add(proc)
        if input_bytes is not None:
            assert proc.stdin is not None
            proc.stdin.write(input_bytes)
            proc.stdin.close()
        try:
            returncode = _pump(proc, sink, kept, started, timeout, on_line)
        except BaseException:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    duration = time.monotonic() - started
    output = "".join(kept)
    if check and returncode != 0:
        raise CommandFailed(command, returncode, tail(output, tail_lines), log_path)
    return Completed(command, -1 if returncode is None else returncode, output, duration, log_path)


def _pdeathsig(parent: int) -> Callable[[], None]:
    """For the child before exec: SIGKILL when `parent` dies (Linux prctl PR_SET_PDEATHSIG);
    a parent already gone by then ends the child at once. prctl is looked up here, in the
    parent: the child between fork and exec only calls it (no import, no allocation of note)."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)

    def arm() -> None:
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)
    return arm


_LIVE: set[subprocess.Popen] = set()  # the commands running now, in any thread
_LIVE_LOCK = threading.Lock()
# Set by signal_children (the run is being interrupted): a worker thread waiting for a turn
# (disk space, compile width) gives up instead of starting work after its peers were stopped.
STOPPING = threading.Event()


def _kill_group(proc: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def signal_children(signum: int = signal.SIGTERM) -> int:
    """Send `signum` to every running command's process group (an interrupt of this run:
    `docker build` cancels its build, uv stops resolving); how many were signalled. Safe in a
    signal handler: it only reads the set and calls killpg."""
    STOPPING.set()
    with _LIVE_LOCK:
        running = [p for p in _LIVE if p.poll() is None]
    for proc in running:
        _kill_group(proc, signum)
    return len(running)


def reap_children(grace_s: float = 10.0) -> None:
    """After signal_children: wait up to `grace_s` for them, then SIGKILL what is left."""
    deadline = time.monotonic() + grace_s
    with _LIVE_LOCK:
        running = list(_LIVE)
    for proc in running:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()


def _pump(proc: subprocess.Popen, sink: TextIO | _Null, kept: deque[str], started: float,
          timeout: float | None, on_line: Callable[[str], None] | None = None) -> int | None:
    """Copy the process output to the sink; kill it past the timeout (returns None then)."""
    import selectors

    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    buffer = b""
    while True:
        remaining = None if timeout is None else timeout - (time.monotonic() - started)
        if remaining is not None and remaining <= 0:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
            sink.write(f"\n[infermatrix] killed after {timeout:.0f} s timeout\n")
            return None
        # EOF counts as readable, so an exited process always ends the loop below.
        if not selector.select(timeout=min(remaining, 1.0) if remaining is not None else 1.0):
            continue
        chunk = proc.stdout.read1(65536)  # type: ignore[attr-defined]
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            text = raw.decode("utf-8", "replace") + "\n"
            kept.append(text)
            sink.write(text)
            if on_line is not None:
                on_line(text)
        sink.flush()
    if buffer:
        text = buffer.decode("utf-8", "replace")
        kept.append(text)
        sink.write(text)
    return proc.wait()


class _Null:
    def __enter__(self) -> "_Null":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def write(self, _text: str) -> None:
        return None

    def flush(self) -> None:
        return None
