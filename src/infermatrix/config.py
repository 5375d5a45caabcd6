"""Load and validate matrix.yaml; every mistake is reported with its file and line.

Validation is the published JSON Schema (schema/matrix.schema.json, also what editors use)
plus the cross-references a schema cannot express (an engine named on an axis must be
defined, floors must be valid specifiers, ...). YAML node marks give the lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "schema" / "matrix.schema.json"
DATA_DIR = Path(__file__).resolve().parent / "data"


def load_schema() -> dict[str, Any]:
    path = SCHEMA_PATH
    if not path.is_file():  # installed as a wheel: the copy shipped in the package
        path = DATA_DIR / "matrix.schema.json"
    return json.loads(path.read_text(encoding="utf-8"))


class _Locator:
    """Finds the line of a key path in a composed YAML document."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def line(self, path: Iterable[Any], key_line: bool = True) -> int | None:
        node = self.root
        best = node.start_mark.line + 1 if node is not None else None
        for part in path:
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if key.value == str(part):
                        best = (key if key_line else value).start_mark.line + 1
                        node = value
                        break
                else:
                    return best
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) \
                    and part < len(node.value):
                node = node.value[part]
                best = node.start_mark.line + 1
            else:
                return best
        return best


def _check_duplicate_keys(node: yaml.Node | None, path: Path) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if key.value in seen:
                raise ConfigError(f"duplicate key {key.value!r} (first at line {seen[key.value]})",
                                  path, line, "keep one of the two entries")
            seen[key.value] = line
            _check_duplicate_keys(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item, path)


def _parse(text: str, path: Path) -> tuple[Any, yaml.Node | None]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(f"malformed YAML: {exc.problem or exc}", path, line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {exc}", path) from None
    _check_duplicate_keys(node, path)
    return data, node


def _describe_schema_error(error: jsonschema.ValidationError) -> tuple[list[Any], str, str | None]:
    """(path to the offending node, message, fix) for the most useful schema error."""
    where = list(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        key = extra[0] if extra else "?"
        fix = f"allowed keys here: {', '.join(allowed)}" if allowed else None
        return where + [key], f"unknown key {key!r}", fix
    if error.validator == "required":
        return where, error.message.replace("is a required property", "is required here"), None
    if error.validator == "pattern":
        return where, f"{error.instance!r} is not a valid value here", \
            f"expected a value matching {error.validator_value}"
    if error.validator == "enum":
        return where, f"{error.instance!r} is not one of {error.validator_value}", None
    return where, error.message, None


@dataclass
class Matrix:
    """A validated matrix.yaml: its data, where it came from, and a line locator."""

    path: Path
    data: dict[str, Any]
    locator: _Locator = field(repr=False)

    @property
    def root(self) -> Path:
        return self.path.parent

    def line_of(self, *key_path: Any) -> int | None:
        return self.locator.line(key_path)

    def error(self, message: str, *key_path: Any, fix: str | None = None) -> ConfigError:
        return ConfigError(message, self.path, self.line_of(*key_path), fix)

    # Convenient views -------------------------------------------------------------------
    @property
    def python(self) -> str:
        return self.data["python"]

    @property
    def engines(self) -> dict[str, dict[str, Any]]:
        return self.data["engines"]

    @property
    def model(self) -> dict[str, Any]:
        return self.data["model"]

    @property
    def bases(self) -> dict[str, Any]:
        return self.data["bases"]

    @property
    def build(self) -> dict[str, Any]:
        return self.data.get("build", {})

    @property
    def smoke(self) -> dict[str, Any]:
        return self.data.get("smoke", {})

    @property
    def tag_policy(self) -> dict[str, Any]:
        return self.data.get("tag_policy", {"require": ["static", "gpu", "model"],
                                            "allow_static_only": False})

    @property
    def publish(self) -> dict[str, Any]:
        return self.data.get("publish", {})

    @cached_property
    def floors(self) -> dict[str, SpecifierSet]:
        return {name: SpecifierSet(spec) for name, spec in self.model["floors"].items()}


def load_matrix(path: Path | str) -> Matrix:
    """Read, parse and validate a matrix file; raise ConfigError (exit 2) on any mistake."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", path, fix="pass --matrix PATH or run from the "
                          "directory that holds matrix.yaml") from None
    data, node = _parse(text, path)
    locator = _Locator(node)
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping", path, 1)
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), str(e.path)))
    if errors:
        # The deepest error is the most specific one; report it first.
        error = max(errors, key=lambda e: len(e.absolute_path))
        where, message, fix = _describe_schema_error(error)
        dotted = ".".join(str(p) for p in where)
        raise ConfigError(f"{dotted}: {message}" if dotted else message, path,
                          locator.line(where), fix)
    matrix = Matrix(path=path, data=data, locator=locator)
    _check_references(matrix)
    return matrix


def _check_references(m: Matrix) -> None:
    """Cross-field checks the schema cannot express."""
    for name, spec in m.model["floors"].items():
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise m.error(f"bad version specifier {spec!r} for {name}", "model", "floors", name,
                          fix="use a PEP 440 specifier such as '>=0.5.10'") from None
    axis = m.data["axes"]["engine"]
    engine_entries: list[tuple[tuple[Any, ...], str]] = []
    if isinstance(axis, list):
        engine_entries += [(("axes", "engine", i), e) for i, e in enumerate(axis)]
    else:
        for name, value in axis.items():
            _check_engine_name(m, name, name, ("axes", "engine", name))
            for where, selector in _selectors(value, ("axes", "engine", name)):
                _check_selector(m, selector, where)
    engine_entries += [(("include", i, "engine"), inc["engine"])
                       for i, inc in enumerate(m.data.get("include", []))]
    for where, spec in engine_entries:
        name, _, version = spec.partition("==")
        _check_engine_name(m, name, spec, where)
        _check_version(m, version, where)
    torch_axis = m.data["axes"].get("torch", "from-engine")
    for i, version in enumerate(torch_axis if isinstance(torch_axis, list) else []):
        _check_version(m, version, ("axes", "torch", i))
    for i, inc in enumerate(m.data.get("include", [])):
        _check_version(m, inc["torch"], ("include", i, "torch"))
    kernels = m.build.get("kernels", {})
    for name, engine in m.engines.items():
        for i, kernel in enumerate(engine.get("kernels", [])):
            if kernel not in kernels:
                raise m.error(f"engine {name!r} names unknown kernel package {kernel!r}",
                              "engines", name, "kernels", i,
                              fix=f"define it under build.kernels (known: {', '.join(sorted(kernels)) or 'none'})")
    definitions = m.bases["definitions"]
    if m.bases["default"] not in definitions:
        raise m.error(f"default base {m.bases['default']!r} is not defined", "bases", "default",
                      fix=f"one of: {', '.join(sorted(definitions))}")
    for i, entry in enumerate(m.bases.get("select", [])):
        if entry["base"] not in definitions:
            raise m.error(f"bases.select names undefined base {entry['base']!r}",
                          "bases", "select", i, "base", fix=f"one of: {', '.join(sorted(definitions))}")
    for name, base in definitions.items():
        if base["strategy"] == "wheels" and base.get("from") not in definitions:
            raise m.error(f"base {name!r} (strategy wheels) needs `from:` naming another base",
                          "bases", "definitions", name)


def _check_engine_name(m: Matrix, name: str, spec: str, where: tuple[Any, ...]) -> None:
    if name not in m.engines:
        raise m.error(f"unknown engine {name!r} in {spec!r}", *where,
                      fix=f"define it under `engines:` (known: {', '.join(sorted(m.engines))})")


def _selectors(value: Any, where: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, list):
        return [((*where, j), v) for j, v in enumerate(value)]
    return [(where, value)]


def _check_selector(m: Matrix, selector: Any, where: tuple[Any, ...]) -> None:
    """`latest`, `floor`, an exact version, a specifier, or {versions: SPEC, newest: N}."""
    text = selector.get("versions", "") if isinstance(selector, dict) else str(selector).strip()
    if not isinstance(selector, dict) and text in ("latest", "floor"):
        return
    if not isinstance(selector, dict) and (text.startswith("==") or text[:1].isdigit()):
        _check_version(m, text.lstrip("="), where)
        return
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        raise m.error(f"bad release selector {text!r}", *where,
                      fix="use latest, floor, an exact version, a PEP 440 specifier such as "
                      "'>=0.5.10', or {versions: '>=0.5.10', newest: 3}") from None


def _check_version(m: Matrix, version: str, where: tuple[Any, ...]) -> None:
    try:
        Version(version)
    except InvalidVersion:
        raise m.error(f"{version!r} is not a valid version", *where) from None
