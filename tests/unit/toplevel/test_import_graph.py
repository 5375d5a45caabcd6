"""The package's import structure (issue 28): its parts (cli, pipeline, stages, model, engine,
host, harness and the top-level modules) import each other without a cycle, lazy imports inside
functions included, and only engine/ imports the Docker SDK. Pure: the sources are parsed."""

from __future__ import annotations

from tests.paths import REPO

import ast
from pathlib import Path

PACKAGE = REPO / "src" / "infermatrix"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules `path` imports, at the top or inside a function."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def part(module: str) -> str:
    """cli, stages, model, ... or the top-level module's own name."""
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "infermatrix"


def part_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        for target in imports_of(path, set(paths)):
            if part(target) != part(module):
                graph.setdefault(part(module), set()).add(part(target))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for target in graph.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen
    return sorted((a, b) for a in graph for b in graph[a] if a in reachable(b))


def test_the_parts_import_each_other_without_a_cycle():
    graph = part_graph()
    assert {"cli", "stages", "model", "engine", "host"} <= set(graph)
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == \
        [("a", "b"), ("b", "c"), ("c", "a")]


def test_only_engine_imports_the_docker_sdk():
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name == "docker" or name.startswith("docker.") for name in names):
                importers.add(path.relative_to(PACKAGE).parts[0])
    assert importers == {"engine"}


def test_no_current_engine_and_no_module_level_forwarders():
    """The engine is passed by hand: engine/docker.py has no thread-local, no `current()`,
    `bound()` or `use()`, and no module-level function that calls an engine's method."""
    tree = ast.parse((PACKAGE / "engine" / "docker.py").read_text(encoding="utf-8"))
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert not {"current", "bound", "use", "build_image", "inspect_image", "container"} & functions
    assert "threading.local" not in (PACKAGE / "engine" / "docker.py").read_text()
