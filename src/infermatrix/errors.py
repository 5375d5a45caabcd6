"""Errors with exit codes: 2 for usage and configuration mistakes, 1 for failures."""

from __future__ import annotations

from pathlib import Path


class InfermatrixError(Exception):
    exit_code = 1


class UsageError(InfermatrixError):
    """Bad arguments or input: exit code 2, nothing written."""

    exit_code = 2


class ConfigError(UsageError):
    """A mistake in a configuration file, located by file and line."""

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None,
                 fix: str | None = None) -> None:
        self.path, self.line, self.fix, self.message = path, line, fix, message
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        text = f"{where}{message}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class ConfigErrors(ConfigError):
    """Every mistake found in one file, reported together (the first one gives path and line)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        first = errors[0]
        super().__init__(first.message, first.path, first.line, first.fix)
        self.errors = errors
        if len(errors) > 1:
            self.args = (f"{len(errors)} problems:\n" + "\n".join(str(e) for e in errors),)

    def __str__(self) -> str:
        return str(self.args[0])


class StageFailure(InfermatrixError):
    """A pipeline stage failed for one or more cells: exit code 1."""

    exit_code = 1


class CommandFailed(StageFailure):
    """An external command failed; carries the exact command and the tail of its log."""

    def __init__(self, command: str, returncode: int | None, log_tail: str,
                 log_path: Path | None = None) -> None:
        self.command, self.returncode, self.log_tail, self.log_path = (
            command, returncode, log_tail, log_path)
        status = "timed out" if returncode is None else f"exited {returncode}"
        text = f"command {status}: {command}"
        if log_path:
            text += f"\n  log: {log_path}"
        if log_tail:
            text += "\n  last lines:\n" + "\n".join("    " + ln for ln in log_tail.splitlines())
        super().__init__(text)


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached the run: unwound like Ctrl-C (temp directories removed,
    the run lock released, containers stopped), exit 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
