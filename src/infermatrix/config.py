"""Load and validate matrix.yaml; every mistake is reported with its file and line.

Validation is the published JSON Schema (schema/matrix.schema.json, also what editors use)
plus the cross-references a schema cannot express (an engine named on an axis must be
defined, floors must be valid specifiers, ...). YAML node marks give the lines.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
import string
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Iterable

import jinja2
import jinja2.meta
import jsonschema
import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from .datafiles import DATA_DIR, read_data
from .errors import ConfigError, ConfigErrors
from . import levels as level_table
from .names import CREDENTIALS_FIX, NAME_RULE, is_name, reference_problem

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "schema" / "matrix.schema.json"
ARCHES_PATH = DATA_DIR / "arches.yaml"
# Byte-order marks of encodings other than UTF-8, named in the error (longest first).
FOREIGN_BOMS = ((b"\x00\x00\xfe\xff", "UTF-32-BE"), (b"\xff\xfe\x00\x00", "UTF-32-LE"),
                (b"\xfe\xff", "UTF-16-BE"), (b"\xff\xfe", "UTF-16-LE"))
COMBINATORS = ("oneOf", "anyOf", "allOf", "not", "if", "then", "else")
UTF8_BOM = b"\xef\xbb\xbf"
RESAVE_FIX = "save the file as UTF-8 (with or without BOM), e.g. `iconv -t UTF-8`"
MAX_CONFIG_BYTES = 1 << 20  # a matrix file is ~10 KB; more is not a matrix
MAX_YAML_NODES = 100_000  # nodes once every alias is expanded (an alias bomb has billions)


def load_schema() -> dict[str, Any]:
    path = SCHEMA_PATH
    if not path.is_file():  # installed as a wheel: the copy shipped in the package
        path = DATA_DIR / "matrix.schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    levels = {"enum": list(level_table.NAMES)}  # the names come from the level table
    schema["properties"]["smoke"]["properties"]["levels"]["items"] = levels
    schema["properties"]["tag_policy"]["properties"]["require"]["items"] = levels
    return schema


class _Locator:
    """Finds the line of a key path in a composed YAML document."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def node(self, path: Iterable[Any]) -> yaml.Node | None:
        """The node at a key path, or None when the path leaves the document."""
        node = self.root
        for part in path:
            if isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if k.value == str(part)), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) \
                    and part < len(node.value):
                node = node.value[part]
            else:
                return None
        return node

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


def _expanded_size(root: yaml.Node | None, path: Path) -> int:
    """How many nodes the document has with every alias expanded, computed once per shared
    node; a ConfigError when it passes MAX_YAML_NODES or an alias contains itself."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise ConfigError("an alias refers to a node that contains it (recursive YAML)",
                              path, node.start_mark.line + 1, "write the value out instead")
        open_nodes.add(id(node))
        children = [c for pair in node.value for c in pair] \
            if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        total = 1 + sum(size(c) for c in children)
        open_nodes.discard(id(node))
        if total > MAX_YAML_NODES:
            raise ConfigError(f"YAML aliases expand to more than {MAX_YAML_NODES} values "
                              "(an alias bomb?)", path, node.start_mark.line + 1,
                              "write the values out, or use fewer nested aliases")
        sizes[id(node)] = total
        return total

    return size(root) if root is not None else 0


def _duplicate_keys(node: yaml.Node | None, path: Path,
                    seen_nodes: set[int] | None = None) -> list[ConfigError]:
    """Duplicate keys of every mapping, each shared (aliased) node looked at once."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    if node is None or id(node) in seen_nodes:
        return []
    seen_nodes.add(id(node))
    found: list[ConfigError] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if not isinstance(key, yaml.ScalarNode):
                continue  # a complex key: the schema reports it
            if key.value in seen:
                found.append(ConfigError(
                    f"duplicate key {key.value!r} (first at line {seen[key.value]})",
                    path, line, "keep one of the two entries"))
            seen[key.value] = line
            found += _duplicate_keys(value, path, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found += _duplicate_keys(item, path, seen_nodes)
    return found


def read_config_text(path: Path) -> str:
    """The text of a config file: UTF-8 (a BOM is accepted); anything else is a ConfigError
    naming what the file is instead (a directory, a device or FIFO, too large, unreadable,
    UTF-16, binary...)."""
    try:
        raw = _read_regular_file(path)
    except FileNotFoundError:
        raise ConfigError("file not found", path, fix="pass --matrix PATH or run from the "
                          "directory that holds matrix.yaml") from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a matrix file", path,
                          fix=f"pass the file itself, e.g. --matrix {path / 'matrix.yaml'}") from None
    except PermissionError:
        raise ConfigError("permission denied: the file cannot be read", path,
                          fix="make it readable by this user (chmod u+r)") from None
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror or exc}", path) from None
    for bom, name in FOREIGN_BOMS:
        if raw.startswith(bom):
            raise ConfigError(f"the file is {name} (byte-order mark); matrix files are UTF-8",
                              path, 1, RESAVE_FIX)
    raw = raw.removeprefix(UTF8_BOM)
    if b"\x00" in raw:
        line = raw.count(b"\n", 0, raw.index(b"\x00")) + 1
        raise ConfigError("NUL bytes in the file: binary, or UTF-16 without a byte-order mark",
                          path, line, RESAVE_FIX)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"not UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
                          "cannot be decoded (a binary file, or Latin-1/UTF-16 text?)",
                          path, line, RESAVE_FIX) from None
    return text


def _read_regular_file(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_CONFIG_BYTES (stat first: opening a FIFO
    would block, a device would never end)."""
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(path)
    if not stat.S_ISREG(mode):
        raise ConfigError("not a regular file (a device, FIFO or socket)", path,
                          fix="pass a matrix file with --matrix PATH")
    with open(path, "rb") as handle:
        raw = handle.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"larger than {MAX_CONFIG_BYTES // 1024} KiB: not a matrix file", path,
                          fix="pass the matrix file itself with --matrix PATH")
    return raw


def _parse(text: str, path: Path) -> tuple[Any, yaml.Node | None]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _expanded_size(node, path)  # before anything (merge keys included) expands aliases
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(f"malformed YAML: {exc.problem or exc}", path, line,
                          "check indentation, brackets and quotes on this line") from None
    except yaml.reader.ReaderError as exc:  # a control character: no mark, a position
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(f"character {exc.character!r} is not allowed in YAML", path, line,
                          "remove it (a binary file, or a stray control character?)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {exc}", path, 1) from None
    except RecursionError:
        raise ConfigError("malformed YAML: nested too deeply", path, 1) from None
    duplicates = _duplicate_keys(node, path)
    if duplicates:
        raise ConfigErrors(duplicates)
    return data, node


def _describe_schema_error(error: jsonschema.ValidationError,
                           locator: "_Locator") -> tuple[list[Any], str, str | None]:
    """(path to the offending node, message, fix) of one schema error."""
    where = list(error.absolute_path)
    unquoted = _unquoted_number(error, locator.node(where))
    if unquoted:
        return where, *unquoted
    if error.validator == "additionalProperties":
        schema = error.schema if isinstance(error.schema, dict) else {}  # a bool schema: none
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        key = extra[0] if extra else "?"
        close = difflib.get_close_matches(str(key), allowed, n=1)
        fix = (f"did you mean {close[0]!r}? " if close else "") + \
            (f"allowed keys here: {', '.join(allowed)}" if allowed else "remove it")
        return where + [key], f"unknown key {key!r}", fix
    if error.validator == "required":
        missing = error.message.split(" is a required property")[0]
        return where, f"{missing} is required here", f"add {missing.strip(chr(39))}: at this level"
    if error.validator == "pattern":
        return where, f"{error.instance!r} is not a valid value here", \
            f"expected a value matching {error.validator_value}"
    if error.validator == "enum":
        return where, f"{error.instance!r} is not one of {error.validator_value}", None
    return where, error.message, None


def _unquoted_number(error: jsonschema.ValidationError,
                     node: yaml.Node | None) -> tuple[str, str] | None:
    """A string written as a plain number: YAML made it a float or int (`12.10` -> 12.1), so
    the message quotes the text as written, never the number."""
    if error.validator != "type" or isinstance(error.instance, bool) \
            or not isinstance(error.instance, (int, float)) \
            or "string" not in _as_list(error.validator_value):
        return None
    if not isinstance(node, yaml.ScalarNode) or node.style is not None:
        return None
    written = node.value
    return (f"{written} is unquoted, so YAML reads it as the number {error.instance!r}, not "
            "the text", f'quote it: "{written}"')


def _deepest(context: list[jsonschema.ValidationError]) -> jsonschema.ValidationError | None:
    """Of a oneOf/anyOf's alternatives, the one that got furthest into the value (an item of the
    list form rather than "not the string form"); ties go to jsonschema's best match."""
    if not context:
        return None
    depth = max(len(e.absolute_path) for e in context)
    return jsonschema.exceptions.best_match([e for e in context if len(e.absolute_path) == depth])


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@lru_cache(maxsize=None)
def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """A schema `pattern` as ECMA-262 reads it: `$` is the end of the text only. Python's `$`
    also matches before a final newline, so "cpu\n" would pass "^(...|cpu)$"."""
    # An unescaped `$` outside a character class becomes `\Z`.
    return re.compile(re.sub(r"(\\.|\[(?:\\.|[^\]])*\])|\$",
                             lambda m: m.group(1) or r"\Z", pattern))


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    if validator.is_type(instance, "string") and not ecma_pattern(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


# The published schema's validator with ECMA `pattern` semantics (see ecma_pattern).
MatrixValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                               {"pattern": _pattern})


def _schema_errors(data: Any, path: Path, locator: "_Locator") -> list[ConfigError]:
    """Every schema violation, without the ones a more specific error below them explains."""
    validator = MatrixValidator(load_schema())
    errors = list(validator.iter_errors(data))
    paths = [tuple(e.absolute_path) for e in errors]
    found: dict[tuple[int | None, str], ConfigError] = {}
    for error, where in zip(errors, paths):
        if error.validator in COMBINATORS:
            if any(len(other) > len(where) and other[:len(where)] == where for other in paths):
                continue  # the deeper error says what is wrong
            error = _deepest(error.context) or error
        key_path, message, fix = _describe_schema_error(error, locator)
        dotted = ".".join(str(p) for p in key_path)
        line = locator.line(key_path)
        text = f"{dotted}: {message}" if dotted else message
        found.setdefault((line, text), ConfigError(text, path, line, fix))
    return sorted(found.values(), key=lambda e: (e.line or 0, e.message))


def load_arches() -> dict[str, dict[str, Any]]:
    """Known GPU arches (data/arches.yaml): sm_XX -> capability and allowed suffixes."""
    return read_data(ARCHES_PATH)["arches"]


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
        return self.data.get("tag_policy", {})  # stages/tagging.py's DEFAULT_POLICY under it

    @property
    def publish(self) -> dict[str, Any]:
        return self.data.get("publish", {})

    @cached_property
    def floors(self) -> dict[str, SpecifierSet]:
        return {name: SpecifierSet(spec) for name, spec in self.model["floors"].items()}


def load_matrix(path: Path | str) -> Matrix:
    """Read, parse and validate a matrix file; raise ConfigError (exit 2) on any mistake,
    with every problem found in the file (ConfigErrors) rather than only the first."""
    path = Path(path)
    data, node = _parse(read_config_text(path), path)
    locator = _Locator(node)
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping (key: value lines)", path, 1,
                          "start from the shipped matrix.yaml")
    problems = _schema_errors(data, path, locator)
    matrix = Matrix(path=path, data=data, locator=locator)
    problems += _reference_errors(matrix, schema_valid=not problems)
    if problems:
        raise ConfigErrors(problems)
    return matrix


def _reference_errors(m: Matrix, schema_valid: bool) -> list[ConfigError]:
    """Cross-field problems; after schema errors the data may be any shape, so a check that
    trips over it is left out (the schema error already names the place)."""
    found: list[ConfigError] = []
    for check in (_check_names, _check_kernel_paths, _check_registries, _check_arches,
                  _check_references, _check_tag_templates, _check_templates):
        try:
            check(m, found)
        except ConfigError as exc:
            found.append(exc)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            if schema_valid:
                raise
    return found


# Mappings whose keys name directories, Dockerfile stages, LABELs and tags.
NAMED_MAPPINGS = (("engines",), ("axes", "engine"), ("build", "kernels"), ("bases", "definitions"))


def _check_names(m: Matrix, found: list[ConfigError]) -> None:
    """Every engine, kernel and base name is of the one grammar (names.NAME)."""
    for key_path in NAMED_MAPPINGS:
        mapping = _at(m.data, key_path)
        for name in mapping if isinstance(mapping, dict) else ():
            if not is_name(name):
                found.append(m.error(f"{'.'.join(key_path)}: {name!r} is not a valid name",
                                     *key_path, name, fix=f"use {NAME_RULE}"))
    for i, inc in enumerate(m.data.get("include") or []):
        torch = inc.get("torch") if isinstance(inc, dict) else None
        if isinstance(torch, str) and not re.fullmatch(r"[0-9][A-Za-z0-9.+]*", torch):
            found.append(m.error(f"include[{i}].torch: {torch!r} is not a valid version",
                                 "include", i, "torch", fix="a version such as 2.11.0"))


OUTSIDE_OPT_IN = "allow_path_outside_repo"
MAX_TREE_ENTRIES = 20000  # a kernel source tree is walked for symlinks; more is refused


def repository_root(directory: Path) -> Path:
    """The git work tree holding `directory` (resolved), else `directory` itself."""
    directory = directory.resolve()
    return next((d for d in (directory, *directory.parents) if (d / ".git").exists()), directory)


def _check_kernel_paths(m: Matrix, found: list[ConfigError]) -> None:
    """A kernel's `path` (and every symlink in its tree) stays inside the repository: its
    files are copied into the committed images/ and into the image. `allow_path_outside_repo:
    true` on the kernel is the explicit opt-in."""
    repo = repository_root(m.root)
    kernels = m.build.get("kernels")
    for name, spec in kernels.items() if isinstance(kernels, dict) else ():
        if not isinstance(spec, dict) or not isinstance(spec.get("path"), str) \
                or spec.get(OUTSIDE_OPT_IN) is True:
            continue
        problem = _escape_problem(m.root / spec["path"], repo)
        if problem is not None:
            found.append(m.error(
                f"build.kernels.{name}.path: {problem}", "build", "kernels", name, "path",
                fix=f"move the tree into the repository, or set {OUTSIDE_OPT_IN}: true on "
                    "this kernel to copy it from there on purpose"))


def _escape_problem(tree: Path, repo: Path) -> str | None:
    """Why `tree` may lead outside `repo`: it, or a symlink in it, resolves outside; or it is
    too large to check. A tree that does not exist copies nothing (render and lock name it)."""
    if not tree.exists():
        return None
    if not tree.resolve().is_relative_to(repo):
        return f"{tree.resolve()} is outside the repository {repo}"
    seen = 0
    for directory, dirs, files in os.walk(tree):
        for entry in (*dirs, *files):
            path = Path(directory) / entry
            if path.is_symlink() and not path.resolve().is_relative_to(repo):
                return f"{path} leads outside the repository {repo}"
            seen += 1
            if seen > MAX_TREE_ENTRIES:
                return f"{tree} holds more than {MAX_TREE_ENTRIES} entries, too many to check"
    return None


REGISTRY_KEYS = (("publish", "registry"), ("build", "kernel_cache", "registry"))


def _check_registries(m: Matrix, found: list[ConfigError]) -> None:
    """Registry references carry no credentials and no scheme."""
    for key_path in REGISTRY_KEYS:
        value = _at(m.data, key_path)
        problem = reference_problem(value) if isinstance(value, str) else None
        if problem:
            found.append(m.error(f"{'.'.join(key_path)}: {problem}", *key_path,
                                 fix=CREDENTIALS_FIX))


def _at(data: Any, key_path: tuple[str, ...]) -> Any:
    for key in key_path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _arch_entries(m: Matrix) -> list[tuple[tuple[Any, ...], Any]]:
    entries: list[tuple[tuple[Any, ...], Any]] = [
        (("axes", "arch", i), a) for i, a in enumerate(m.data["axes"]["arch"])]
    entries += [(("include", i, "arch"), inc["arch"])
                for i, inc in enumerate(m.data.get("include", []))]
    return entries


def _check_arches(m: Matrix, found: list[ConfigError]) -> None:
    """Every arch is `cpu` or a known GPU arch (data/arches.yaml) with a suffix it has."""
    known = load_arches()
    for where, arch in _arch_entries(m):
        if not isinstance(arch, str) or arch == "cpu":
            continue
        base, suffix = (arch[:-1], arch[-1]) if arch[-1:] in ("a", "f") else (arch, "")
        if base in known and (not suffix or suffix in known[base].get("suffixes", [])):
            continue
        if base in known:
            allowed = ", ".join(base + s for s in known[base].get("suffixes", [])) or "none"
            found.append(m.error(f"{arch!r}: NVIDIA defines no {suffix!r} target for {base}",
                                 *where, fix=f"use {base} (suffixed forms: {allowed})"))
            continue
        close = difflib.get_close_matches(base, list(known), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        found.append(m.error(
            f"unknown GPU arch {arch!r}", *where,
            fix=f"{hint}known arches (src/infermatrix/data/arches.yaml): "
                f"{', '.join(known)}, or cpu"))


def _check_references(m: Matrix, found: list[ConfigError]) -> None:
    """Cross-field checks the schema cannot express."""
    for name, spec in m.model["floors"].items():
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            found.append(m.error(f"bad version specifier {spec!r} for {name}", "model", "floors",
                                 name, fix="use a PEP 440 specifier such as '>=0.5.10'"))
    axis = m.data["axes"]["engine"]
    engine_entries: list[tuple[tuple[Any, ...], str]] = []
    if isinstance(axis, list):
        engine_entries += [(("axes", "engine", i), e) for i, e in enumerate(axis)]
    else:
        for name, value in axis.items():
            _check_engine_name(m, found, name, name, ("axes", "engine", name))
            for where, selector in _selectors(value, ("axes", "engine", name)):
                _check_selector(m, found, selector, where)
    engine_entries += [(("include", i, "engine"), inc["engine"])
                       for i, inc in enumerate(m.data.get("include", []))]
    for where, spec in engine_entries:
        name, _, version = spec.partition("==")
        _check_engine_name(m, found, name, spec, where)
        _check_version(m, found, version, where)
    torch_axis = m.data["axes"].get("torch", "from-engine")
    for i, version in enumerate(torch_axis if isinstance(torch_axis, list) else []):
        _check_version(m, found, version, ("axes", "torch", i))
    for i, inc in enumerate(m.data.get("include", [])):
        _check_version(m, found, inc["torch"], ("include", i, "torch"))
    kernels = m.build.get("kernels", {})
    for name, engine in m.engines.items():
        for i, kernel in enumerate(engine.get("kernels", [])):
            if kernel not in kernels:
                known = ", ".join(sorted(kernels)) or "none"
                found.append(m.error(f"engine {name!r} names unknown kernel package {kernel!r}",
                                     "engines", name, "kernels", i,
                                     fix=f"define it under build.kernels (known: {known})"))
    definitions = m.bases["definitions"]
    names = ", ".join(sorted(definitions))
    if m.bases["default"] not in definitions:
        found.append(m.error(f"default base {m.bases['default']!r} is not defined", "bases",
                             "default", fix=f"one of: {names}"))
    for i, entry in enumerate(m.bases.get("select", [])):
        if entry["base"] not in definitions:
            found.append(m.error(f"bases.select names undefined base {entry['base']!r}",
                                 "bases", "select", i, "base", fix=f"one of: {names}"))
    for name, base in definitions.items():
        if base["strategy"] == "wheels" and base.get("from") not in definitions:
            found.append(m.error(f"base {name!r} (strategy wheels) needs `from:` naming another "
                                 "base", "bases", "definitions", name, fix=f"from: one of {names}"))


def _check_engine_name(m: Matrix, found: list[ConfigError], name: str, spec: str,
                       where: tuple[Any, ...]) -> None:
    if name not in m.engines:
        found.append(m.error(
            f"unknown engine {name!r} in {spec!r}", *where,
            fix=f"define it under `engines:` (known: {', '.join(sorted(m.engines))})"))


def _selectors(value: Any, where: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, list):
        return [((*where, j), v) for j, v in enumerate(value)]
    return [(where, value)]


def _check_selector(m: Matrix, found: list[ConfigError], selector: Any,
                    where: tuple[Any, ...]) -> None:
    """`latest`, `floor`, an exact version, a specifier, or {versions: SPEC, newest: N}."""
    text = selector.get("versions", "") if isinstance(selector, dict) else str(selector).strip()
    if not isinstance(selector, dict) and text in ("latest", "floor"):
        return
    if not isinstance(selector, dict) and (text.startswith("==") or text[:1].isdigit()):
        _check_version(m, found, text.lstrip("="), where)
        return
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        found.append(m.error(f"bad release selector {text!r}", *where,
                             fix="use latest, floor, an exact version, a PEP 440 specifier such "
                             "as '>=0.5.10', or {versions: '>=0.5.10', newest: 3}"))


def _check_version(m: Matrix, found: list[ConfigError], version: str,
                   where: tuple[Any, ...]) -> None:
    if not isinstance(version, str):
        return  # the schema error names it (an unquoted number, ...)
    try:
        Version(version)
    except InvalidVersion:
        found.append(m.error(f"{version!r} is not a valid version", *where,
                             fix="a PEP 440 version such as 2.11.0"))


# --- templates and tag templates, checked when the matrix loads (issue 47) --------------------

# What a publish.tag / publish.aliases template may name: stages/tagging.py tag_fields (a test
# keeps the two equal) and Docker's tag grammar, the same as tagging's TAG_PATTERN.
TAG_FIELDS = ("cell_id", "cuda", "cuda_tag", "torch", "engine", "engine_version", "arch",
              "arch_tag")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# The Dockerfile's entry template and the files every cell renders (stages/render.py).
ENTRY_TEMPLATE = "Dockerfile.j2"
REQUIRED_TEMPLATES = (ENTRY_TEMPLATE, "files/dockerignore.j2", "files/with-secrets.sh.j2",
                      "files/serve.sh.j2")


def _tag_templates(m: Matrix) -> list[tuple[tuple[Any, ...], Any]]:
    publish = m.data.get("publish") or {}
    found: list[tuple[tuple[Any, ...], Any]] = []
    if "tag" in publish:
        found.append((("publish", "tag"), publish["tag"]))
    for index, alias in enumerate(publish.get("aliases") or []):
        found.append((("publish", "aliases", index), alias))
    return found


def tag_template_problem(template: str) -> str | None:
    """Why a tag template cannot give a tag for every cell (an unknown placeholder, a broken
    brace, characters a tag may not hold), or None."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template)
                 if name is not None]
    except ValueError as exc:
        return f"tag template {template!r} does not parse: {exc}"
    unknown = [n for n in names if n not in TAG_FIELDS]
    if unknown:
        return f"unknown placeholder {{{unknown[0]}}} in tag template {template!r}"
    try:
        sample = template.format(**{f: "x0" for f in TAG_FIELDS})
    except (IndexError, KeyError, ValueError) as exc:
        return f"tag template {template!r} does not format: {exc}"
    if not _TAG.fullmatch(sample):
        return f"tag template {template!r} gives {sample!r}, which is not a valid tag"
    return None


def _check_tag_templates(m: Matrix, found: list[ConfigError]) -> None:
    """publish.tag and each alias template: a typo is said at load, not at the tag step after
    the audit and the smoke."""
    for key_path, template in _tag_templates(m):
        if not isinstance(template, str):
            continue  # the schema names it
        problem = tag_template_problem(template)
        if problem:
            found.append(m.error(f"{'.'.join(map(str, key_path))}: {problem}", *key_path,
                                 fix="placeholders: " + ", ".join("{" + f + "}"
                                                                  for f in TAG_FIELDS)))


def templates_of(m: Matrix) -> Path:
    """`templates/` beside the matrix when it has one, else the project's: what render
    renders with and the check parses."""
    beside = m.root / "templates"
    return beside if (beside / ENTRY_TEMPLATE).is_file() else REPO_ROOT / "templates"


def _check_templates(m: Matrix, found: list[ConfigError]) -> None:
    """Every template render needs is there, and every template parses; a constant include
    names a template that exists. Each problem names the template file (and line)."""
    directory = templates_of(m)
    fix = f"restore it from the project's templates/ (git checkout -- {directory.name}/)"
    for name in REQUIRED_TEMPLATES:
        if not (directory / name).is_file():
            found.append(ConfigError(f"template {name!r} not found in {directory}",
                                     directory / name, fix=fix))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(directory)),
                             trim_blocks=True, lstrip_blocks=True)
    for path in sorted(directory.rglob("*.j2")):
        name = path.relative_to(directory).as_posix()
        try:
            tree = env.parse(path.read_text(encoding="utf-8"), name, str(path))
        except jinja2.TemplateSyntaxError as exc:
            found.append(ConfigError(f"template syntax error: {exc.message}", path, exc.lineno,
                                     fix="correct the template"))
            continue
        except (OSError, UnicodeDecodeError) as exc:
            found.append(ConfigError(f"template unreadable: {exc}", path, fix=fix))
            continue
        for included in jinja2.meta.find_referenced_templates(tree):
            if included is not None and not (directory / included).is_file():
                found.append(ConfigError(f"template {name} includes {included!r}, which is "
                                         f"not in {directory}", path, fix=fix))
