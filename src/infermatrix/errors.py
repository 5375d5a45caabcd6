"""The error catalogue: every failure infermatrix reports is one of these classes, each with its
exit code, what it means and, where it is always the same, its fix.

One printed form for all of them (`str(error)`, after main()'s `infermatrix: error: `):

    <message>
      fix: <fix>

the second line only when there is a fix. A message names what failed and why; the fix goes in
the `fix=` field, never into the message text (tests/unit/toplevel/test_errors_catalogue.py checks).

| code | class | meaning | default fix |
|---|---|---|---|
| 1 | InfermatrixError | a failure (the base of the catalogue) | - |
| 1 | StageFailure | a pipeline stage failed for one or more cells | - |
| 1 | CommandFailed | an external command failed (the command, its log, the log's tail) | - |
| 1 | EngineError | the Docker engine refused or failed a request | - |
| 1 | GpuUnavailable | the engine has no way to hand a GPU to a container | - |
| 1 | RegistryError | a registry refused or failed a request | - |
| 1 | RegistryAuthError | the registry refused the credentials | - |
| 1 | RegistryNotFound | the repository, tag or digest is not in the registry | check images.lock |
| 1 | RegistryTLSError | the TLS handshake with the registry failed | - |
| 1 | DigestMismatch | the registry or daemon holds another image than images.lock | publish again |
| 1 | SignatureError | a signature or attestation is missing, foreign or tampered | - |
| 1 | DigestConflict | two report fragments pin one tag to different digests | - |
| 1 | UnifiedMemoryShort | too little unified memory is available to start an engine | - |
| 1 | ImageGone | an image the journal or images.lock names is no longer in the engine | - |
| 1 | KernelStageEmpty | a kernel's build stage ended without its wheel | - |
| 1 | ServerNotReady | a server or replica did not answer its health check in time | - |
| 1 | ModelNotServed | the server lists no model, or not the one asked for | pass --model |
| 2 | UsageError | bad arguments or input; nothing written | - |
| 2 | ConfigError | a mistake in a configuration file, with file and line | - |
| 2 | ConfigErrors | every mistake found in one file, reported together | - |
| 2 | DamagedStateFile | a state file that cannot be read as its kind | - |
| 2 | UnsafeName | a name or path that could escape its root or reach a Dockerfile | - |
| 2 | InputFileError | a line of an input file (prompts, results, compose) that cannot be read | - |
| 2 | UnknownChoice | a name that is none of its table's (a level, base, GPU, selector) | - |
| 2 | MissingPrerequisite | a step needs what an earlier step makes (lock, render, build) | - |
| 3 | MissingTool | a program infermatrix needs is not installed on this host | - |
| 4 | EngineUnavailable | the Docker engine cannot be reached | start dockerd |
| 5 | RegistryUnreachable | no connection to the registry | - |
| 128+N | Interrupted | signal N (SIGHUP 129, SIGINT 130, SIGTERM 143) | - |

A default fix (`default_fix`, shortened in the table) is used when the raise gives none; a `-`
means the fix depends on the case and each raise gives it. MissingTool and EngineUnavailable
are UsageErrors (`except UsageError` still catches them) with codes of their own, so a script
can tell "install X" (3) or "start the engine" (4) from "fix the arguments" (2);
RegistryUnreachable (5) is the registry failure worth retrying later. Interrupted is a
KeyboardInterrupt, so that it unwinds like Ctrl-C.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

FIX_LINE = "\n  fix: "  # the one place the fix line's form is written


class InfermatrixError(Exception):
    """A failure: exit code 1. The base of the catalogue; `fix` is the second printed line."""

    exit_code: ClassVar[int] = 1
    default_fix: ClassVar[str | None] = None

    def __init__(self, message: str = "", *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        # fix="" drops a class's default fix
        self.fix = self.default_fix if fix is None else fix

    def headline(self) -> str:
        """The message line(s), before the fix (ConfigError puts its location first)."""
        return self.message

    def __str__(self) -> str:
        return self.headline() + (FIX_LINE + self.fix if self.fix else "")

    def one_line(self) -> str:
        """The same text on one line, for a field that must stay one line (a JSON fact, a
        report row); the terminal gets str()."""
        return self.headline() + (f"; fix: {self.fix}" if self.fix else "")


# --- exit code 2: usage and configuration, nothing written ---------------------------------

class UsageError(InfermatrixError):
    """Bad arguments or input: exit code 2, nothing written."""

    exit_code = 2


class ConfigError(UsageError):
    """A mistake in a configuration file, located by file and line: exit code 2."""

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None,
                 fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.path, self.line = path, line

    def headline(self) -> str:
        path, line = self.path, self.line
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        return f"{where}{self.message}"


class ConfigErrors(ConfigError):
    """Every mistake found in one file, reported together (the first one gives path and line):
    exit code 2."""

    def __init__(self, errors: list[ConfigError]) -> None:
        first = errors[0]
        super().__init__(first.message, first.path, first.line, first.fix)
        self.errors = errors

    def __str__(self) -> str:
        if len(self.errors) == 1:
            return super().__str__()
        return f"{len(self.errors)} problems:\n" + "\n".join(str(e) for e in self.errors)


class DamagedStateFile(ConfigError):
    """A state file that cannot be read as its kind: named, with the fix (exit code 2)."""


class UnsafeName(UsageError):
    """A name or path that could escape its root or reach a Dockerfile line: exit code 2."""


class InputFileError(ConfigError):
    """A line of an input file that cannot be read (the prompts, a results file, a deployment's
    compose.yaml or record), located by file and line: exit code 2, nothing written."""


class UnknownChoice(UsageError):
    """A name that is none of its table's (a smoke level, a base, a GPU class, a fixture
    variant, a selector matching no cell): exit code 2; the message lists the choices."""


class MissingPrerequisite(UsageError):
    """A step asked for before the step that makes its input (a lock file, a rendered
    Dockerfile, a built image, a pulled image): exit code 2, nothing written; the fix is the
    command that makes it."""


class MissingTool(UsageError):
    """A program infermatrix needs is not installed here (cuobjdump, debootstrap, a BuildKit
    client, cosign, qemu-user for a foreign platform): exit code 3; the fix says how to get
    it."""

    exit_code = 3


class EngineUnavailable(UsageError):
    """The Docker engine cannot be reached (not running, wrong DOCKER_HOST or context): exit
    code 4."""

    exit_code = 4
    default_fix = "start dockerd, or set DOCKER_HOST / DOCKER_CONTEXT"


# --- exit code 1: failures -------------------------------------------------------------------

class StageFailure(InfermatrixError):
    """A pipeline stage failed for one or more cells: exit code 1."""

    exit_code = 1


class CommandFailed(StageFailure):
    """An external command failed; carries the exact command and the tail of its log: exit
    code 1."""

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


class EngineError(StageFailure):
    """The Docker engine refused or failed a request (an SDK error, translated): exit code 1."""


class GpuUnavailable(EngineError):
    """The engine has no way to hand a GPU to a container (no nvidia runtime, no CDI spec, no
    device nodes), or it refused a GPU request: exit code 1, one line naming the engine."""


class RegistryError(StageFailure):
    """A registry refused or failed a request: exit code 1. The message is one line, the fix
    (engine/registry.py's `fix_for`) the next."""


class RegistryAuthError(RegistryError):
    """The registry refused the credentials (or there were none and it wants some): exit 1."""


class RegistryNotFound(RegistryError):
    """The repository, tag or digest is not in the registry: exit code 1."""

    default_fix = ("check the reference in images.lock and that the cell was published there "
                   "(`infermatrix publish`)")


class RegistryUnreachable(RegistryError):
    """No connection to the registry (down, wrong host or port, DNS, firewall): exit code 5,
    worth retrying later."""

    exit_code = 5


class RegistryTLSError(RegistryError):
    """The TLS handshake failed (unknown CA, wrong name) or TLS met a plain-HTTP registry: exit
    code 1."""


class DigestMismatch(RegistryError):
    """What the registry or the daemon holds is not the image images.lock pins: exit code 1."""

    default_fix = ("the registry's copy is not the one images.lock pins: publish the cell "
                   "again or use the images.lock that was written with it")


class SignatureError(StageFailure):
    """A signature or attestation is missing, of another key or digest, or tampered: exit
    code 1."""


class DigestConflict(StageFailure):
    """Two fragments pin one tag to different digests: exit code 1, nothing written."""


class UnifiedMemoryShort(StageFailure):
    """Too little memory is available now to start an engine on a unified-memory GPU: exit
    code 1."""


class ImageGone(StageFailure):
    """An image the journal or images.lock names (built, tested, pulled) is no longer in the
    engine, or is another image now: exit code 1; the fix rebuilds or pulls it."""


class KernelStageEmpty(StageFailure):
    """A kernel's build stage (kernel-<name>) ended without leaving its wheel in /wheels/:
    exit code 1."""


class ServerNotReady(StageFailure):
    """A server or replica exited, or did not answer its health check in time: exit code 1,
    naming the replicas that did not."""


class ModelNotServed(StageFailure):
    """The server's /v1/models lists no model, or not the one asked for: exit code 1."""

    default_fix = "pass --model with a name the server's /v1/models lists"


# --- 128 + the signal's number --------------------------------------------------------------

class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached the run: unwound like Ctrl-C (temp directories removed,
    the run lock released, containers stopped), exit 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# Every kind, in the order of the table above (tests/unit/toplevel/test_errors_catalogue.py holds them to it).
CATALOGUE: tuple[type[BaseException], ...] = (
    InfermatrixError, StageFailure, CommandFailed, EngineError, GpuUnavailable, RegistryError,
    RegistryAuthError, RegistryNotFound, RegistryTLSError, DigestMismatch, SignatureError,
    DigestConflict, UnifiedMemoryShort, ImageGone, KernelStageEmpty, ServerNotReady,
    ModelNotServed, UsageError, ConfigError, ConfigErrors, DamagedStateFile, UnsafeName,
    InputFileError, UnknownChoice, MissingPrerequisite, MissingTool, EngineUnavailable,
    RegistryUnreachable, Interrupted,
)
