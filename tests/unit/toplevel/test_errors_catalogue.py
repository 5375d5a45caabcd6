"""The error catalogue (errors.py, issue 28): every kind has its exit code and a docstring, the
module's table says the same, every error prints as its message then `  fix: ...`, and no fix is
glued into a message string again. Pure; no Docker."""

from __future__ import annotations

import ast
import re
import signal
from pathlib import Path

import pytest

from infermatrix import errors
from infermatrix.errors import (CATALOGUE, CommandFailed, ConfigError, ConfigErrors,
                                DigestMismatch, EngineUnavailable, InfermatrixError, Interrupted,
                                MissingTool, RegistryUnreachable, SignatureError, StageFailure,
                                UsageError)

SRC = Path(errors.__file__).resolve().parent


def exit_code_of(kind: type[BaseException]) -> int:
    if kind is Interrupted:
        return Interrupted(signal.SIGINT).exit_code
    return kind.exit_code  # type: ignore[attr-defined]


def table_rows() -> dict[str, tuple[str, str]]:
    """class -> (code, default fix) from the module docstring's table."""
    rows = {}
    for line in (errors.__doc__ or "").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].isidentifier() and cells[1] != "class":
            rows[cells[1]] = (cells[0], cells[3])
    return rows


@pytest.mark.parametrize("kind", CATALOGUE, ids=lambda k: k.__name__)
def test_every_kind_has_an_exit_code_and_a_docstring(kind):
    code = exit_code_of(kind)
    assert isinstance(code, int) and code > 0
    assert "__doc__" in vars(kind) and kind.__doc__, f"{kind.__name__} needs a docstring"
    assert kind is Interrupted or issubclass(kind, InfermatrixError)


def test_the_module_table_lists_every_kind_with_its_code_and_default_fix():
    rows = table_rows()
    assert list(rows) == [k.__name__ for k in CATALOGUE]
    for kind in CATALOGUE:
        code, fix = rows[kind.__name__]
        if kind is Interrupted:
            assert code == "128+N"
            continue
        assert int(code) == kind.exit_code, kind.__name__
        assert (fix != "-") == bool(kind.default_fix), kind.__name__


def test_every_infermatrix_error_class_is_in_the_catalogue():
    """A kind defined anywhere under src/ is one of the catalogue's (subclasses defined
    elsewhere would escape the table)."""
    import importlib
    import pkgutil

    import infermatrix

    for module in pkgutil.walk_packages(infermatrix.__path__, "infermatrix."):
        if ".harness" not in module.name and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    seen, todo = set(), [InfermatrixError]
    while todo:
        kind = todo.pop()
        seen.add(kind)
        todo.extend(k for k in kind.__subclasses__() if k not in seen)
    mine = {k for k in seen if k.__module__.startswith("infermatrix.")}
    assert mine <= set(CATALOGUE), sorted(k.__name__ for k in mine - set(CATALOGUE))


def test_codes_usage_2_failure_1_and_their_own_for_tools_engine_registry():
    assert (UsageError.exit_code, ConfigError.exit_code, StageFailure.exit_code) == (2, 2, 1)
    assert (MissingTool.exit_code, EngineUnavailable.exit_code,
            RegistryUnreachable.exit_code) == (3, 4, 5)
    assert issubclass(MissingTool, UsageError) and issubclass(EngineUnavailable, UsageError)
    assert Interrupted(signal.SIGTERM).exit_code == 143


# --- one printed form ------------------------------------------------------------------------

@pytest.mark.parametrize(("error", "printed"), [
    (UsageError("bad flag"), "bad flag"),
    (UsageError("bad flag", fix="drop it"), "bad flag\n  fix: drop it"),
    (MissingTool("debootstrap is not installed", fix="apt-get install -y debootstrap"),
     "debootstrap is not installed\n  fix: apt-get install -y debootstrap"),
    (SignatureError("cpu-x: unsigned", fix="publish it with a key"),
     "cpu-x: unsigned\n  fix: publish it with a key"),
    (EngineUnavailable("cannot reach the Docker engine at unix:///nothing.sock: refused"),
     "cannot reach the Docker engine at unix:///nothing.sock: refused\n"
     "  fix: start dockerd, or set DOCKER_HOST / DOCKER_CONTEXT"),
    (DigestMismatch("pulled x does not match images.lock", fix=""),  # "" drops the default
     "pulled x does not match images.lock"),
    (StageFailure("tag t already names i", fix="`docker rmi t`"),
     "tag t already names i\n  fix: `docker rmi t`"),
])
def test_message_then_the_fix_line(error, printed):
    assert str(error) == printed
    assert error.message == printed.split("\n  fix: ")[0]


def test_a_default_fix_is_used_unless_the_raise_gives_one():
    assert DigestMismatch("x").fix == DigestMismatch.default_fix
    assert str(DigestMismatch("x", fix="y")) == "x\n  fix: y"


def test_config_error_keeps_its_location_and_format():
    assert str(ConfigError("unknown key 'x'", "m.yaml", 3, "remove it")) == \
        "m.yaml:3: unknown key 'x'\n  fix: remove it"
    assert str(ConfigError("file not found", "m.yaml")) == "m.yaml: file not found"
    assert str(ConfigError("no matrix")) == "no matrix"
    many = ConfigErrors([ConfigError("a", "m.yaml", 1, "fa"), ConfigError("b", "m.yaml", 2)])
    assert str(many) == "2 problems:\nm.yaml:1: a\n  fix: fa\nm.yaml:2: b"
    one = ConfigErrors([ConfigError("a", "m.yaml", 1, "fa")])
    assert str(one) == "m.yaml:1: a\n  fix: fa" and one.exit_code == 2


def test_command_failed_keeps_its_format():
    error = CommandFailed("docker build .", 1, "step 1\nstep 2", Path("/l/b.log"))
    assert str(error) == ("command exited 1: docker build .\n  log: /l/b.log\n"
                          "  last lines:\n    step 1\n    step 2")


def test_one_line_for_a_field_that_must_stay_one_line():
    assert UsageError("a", fix="b").one_line() == "a; fix: b"
    assert UsageError("a").one_line() == "a"


def test_main_prints_the_error_line_then_the_fix_line(capsys, monkeypatch):
    from infermatrix import cli

    def fail(_args):
        raise MissingTool("cosign is not installed", fix="run `bash .ci/provision`")

    monkeypatch.setattr(cli, "build_parser", lambda: _Parser(fail))
    assert cli.main(["x"]) == 3
    assert capsys.readouterr().err == ("infermatrix: error: cosign is not installed\n"
                                       "  fix: run `bash .ci/provision`\n")


class _Parser:
    def __init__(self, func):
        self.func = func

    def parse_args(self, argv):
        import argparse
        return argparse.Namespace(func=self.func)


# --- no fix glued into a message ---------------------------------------------------------------

# Where a `fix:` literal belongs: the catalogue itself, the in-image programs (their own output
# format), and the doctor's report lines (report text, not exceptions).
ALLOWED = ("errors.py", "harness/", "host/doctor.py")
FIX_WORD = re.compile(r"(?<![A-Za-z_])fix:")
# The canonical fix line printed by itself (`render --check`'s report), never in a raise.
FIX_LINE_START = "  fix: "


def _strings_with_fix(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, text, inside an exception) of every string constant holding `fix:`."""
    kinds = {k.__name__ for k in CATALOGUE}
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_error: bool) -> None:
        if isinstance(node, ast.Raise):
            in_error = True
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else ""
            in_error = in_error or name in kinds or name.endswith(("Error", "Failure"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and FIX_WORD.search(node.value):
            found.append((node.lineno, node.value, in_error))
        for child in ast.iter_child_nodes(node):
            visit(child, in_error)

    visit(tree, False)
    return found


def glued_fixes(source: str) -> list[str]:
    return [f"{line}: {text!r}" for line, text, in_error in _strings_with_fix(ast.parse(source))
            if in_error or not text.startswith(FIX_LINE_START)]


def test_no_fix_is_glued_into_a_message_under_src():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith(ALLOWED):
            continue
        offenders += [f"{relative}:{o}" for o in glued_fixes(path.read_text(encoding="utf-8"))]
    assert not offenders, ("a fix glued into a message; pass it as fix=... (errors.py):\n"
                           + "\n".join(offenders))


@pytest.mark.parametrize("source", [
    'raise UsageError("bad; fix: do this")',
    'raise UsageError(f"{x}\\n  fix: {y}")',
    'raise StageFailure(f"{x}\\n" "  fix: do this")',
    'return SignatureError(f"{cell}: {what}; fix: {fix}")',
    'error = registries.DigestMismatch(f"{a}; " f"fix: {b}")',
    'text = f"{what}: {why}; fix: {how}"',
])
def test_the_glue_check_catches_the_old_forms(source):
    assert glued_fixes(source)


@pytest.mark.parametrize("source", [
    'raise UsageError("bad", fix="do this")',
    'print(f"  fix: {how}", file=sys.stderr)',
    'suffix = "a"  # suffix: and prefix: are other words',
    'x = {"prefix:": 1}',
])
def test_the_glue_check_lets_the_canonical_forms_pass(source):
    assert not glued_fixes(source)
