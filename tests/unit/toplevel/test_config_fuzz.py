"""Fuzz the config loader: many mutations of valid matrix files (lines dropped, doubled,
swapped or re-indented, characters replaced, values unquoted, bytes cut off) must each either
load or raise ConfigError with the file and a line (exit 2). Any other exception is a
traceback the user would have seen. Pure logic, no Docker; hypothesis shrinks a failure to
the smallest mutation."""

from __future__ import annotations

from tests.paths import TESTS

import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermatrix.config import load_matrix
from infermatrix.errors import ConfigError, ConfigErrors

from tests.support.planning_support import DATA

SEEDS = [(DATA / "mini_matrix.yaml").read_text(),
         (TESTS / "matrix" / "matrix.yaml").read_text()]
NASTY = ["", " ", "\t", ":", "- ", "[", "]", "{", "}", "'", '"', "#", "&a", "*a", "!!python/object:x",
         "~", "null", "12.10", "1e3", "0x1f", "yes", "no", "---", "...", "\x00", "\ufeff", "é",
         "%YAML 1.1", "<<: *a", "? ", "|", ">", "@", "`", "\\", "sm_999", "2.99.0", "cpu"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    lines = draw(st.sampled_from(SEEDS)).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "double", "swap", "indent", "dedent", "char",
                                   "insert", "unquote", "truncate", "value"]))
        line = lines[i]
        if op == "drop":
            del lines[i]
        elif op == "double":
            lines.insert(i, line)
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "indent":
            lines[i] = "  " + line
        elif op == "dedent":
            lines[i] = line.lstrip(" ")
        elif op == "char" and line:
            k = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:k] + draw(st.sampled_from(NASTY)) + line[k + 1:]
        elif op == "insert":
            lines.insert(i, draw(st.sampled_from(NASTY)) + draw(st.text(max_size=8)) + "\n")
        elif op == "unquote":
            lines[i] = re.sub(r'"([0-9][0-9.]*)"', r"\1", line)
        elif op == "value":
            value = draw(st.sampled_from(NASTY))
            lines[i] = re.sub(r":\s.*", lambda _: ": " + value, line, count=1)
        elif op == "truncate":
            lines = lines[:i]
    data = "".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()) and data:  # and sometimes cut in the middle of a UTF-8 sequence
        data = data[: draw(st.integers(0, len(data)))]
    return data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_every_mutation_loads_or_is_a_located_config_error(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matrix.yaml"
        path.write_bytes(data)
        try:
            load_matrix(path)
        except ConfigError as exc:
            assert exc.exit_code == 2
            found = exc.errors if isinstance(exc, ConfigErrors) else [exc]
            for error in found:
                assert error.path == path, str(error)
                assert error.line is not None and error.line >= 1, str(error)
                assert error.message
