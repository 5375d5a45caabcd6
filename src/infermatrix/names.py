"""One grammar for every name that reaches a path, a Dockerfile line or a tag, and the one
helper that proves a path the tool writes stays inside its root.

Names from matrix.yaml (engines, kernels, bases) follow `NAME`; a cell id and each of its
parts follow `CELL_ID` (versions may carry a local `+suffix`). Neither admits `/`, a leading
`.`, whitespace, a newline, `;`, `$` or quotes, so a name can neither leave `images/`,
`locks/`, `journal/` or `logs/` nor start a new Dockerfile instruction.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import UnsafeName

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_RULE = ("a letter or digit, then letters, digits, '.', '_' or '-' "
             "(at most 64 characters; no '/', spaces, newlines, quotes, ';' or '$')")
CELL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")


def is_name(value: object) -> bool:
    """Whether `value` is a name of the one grammar (fullmatch: no trailing newline)."""
    return isinstance(value, str) and NAME.fullmatch(value) is not None


def is_cell_part(value: object) -> bool:
    """Whether `value` may be (part of) a cell id."""
    return isinstance(value, str) and CELL_ID.fullmatch(value) is not None


def inside(root: Path, *parts: str) -> Path:
    """`root/parts...`, proven (symlinks resolved) to stay inside `root`; else UnsafeName.

    Every path the tool makes under images/, locks/, journal/ and logs/ from a name goes
    through here."""
    path = Path(root).joinpath(*parts)
    if not path.resolve().is_relative_to(Path(root).resolve()):
        raise UnsafeName(f"refusing {path}: it leaves {root}")
    return path


CREDENTIALS_FIX = ("keep credentials out of the reference: set INFERMATRIX_REGISTRY_USER / "
                   "INFERMATRIX_REGISTRY_PASSWORD, or use Docker's credential store "
                   "(`docker login HOST`); write the registry as host[:port][/path]")


def redacted(reference: str) -> str:
    """A registry reference safe to print: whatever precedes an `@` (user:password) hidden."""
    return f"***@{reference.rpartition('@')[2]}" if "@" in reference else reference


def reference_problem(reference: str) -> str | None:
    """Why a registry reference (host[:port][/path]) is refused, or None: credentials in it
    (`user:pw@host`) or a scheme (`https://`, which would be taken as the host). The text
    never quotes what could be a password."""
    if "@" in reference:
        return f"the registry {redacted(reference)!r} carries credentials (user:password@)"
    scheme, sep, _ = reference.partition("://")
    if sep:
        return (f"the registry {reference!r} has a scheme ({scheme}://); a registry reference "
                "is host[:port][/path]")
    return None
