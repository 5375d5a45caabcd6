"""The package's import structure (issue 28): its parts (cli, pipeline, stages, model, engine,
host, harness and the top-level modules) import each other without a cycle, and so do its
modules (issue 49: a circle inside a part, closed by an import inside a function, is invisible
to Python's import and to the part graph), lazy imports inside functions included; only
engine/ imports the Docker SDK. Pure: the sources are parsed."""

from __future__ import annotations

from tests.paths import REPO

import ast
from pathlib import Path

PACKAGE = REPO / "src" / "infermatrix"


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], root: Path = PACKAGE.parent) -> set[str]:
    """The package's modules `path` imports, at the top or inside a function. `from P import
    m` imports the module P.m, and P itself unless P is a package `path` sits in (started
    before any of its modules) and every name taken is a module of it (`from . import sign`)."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names
                          if f"{base}.{alias.name}" in modules]
            inside_base = here == base or here.startswith(base + ".")
            takes_from_base = len(submodules) < len(node.names)
            names = submodules + ([base] if takes_from_base or not inside_base else [])
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


def module_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (at the top or inside a function)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {module: imports_of(path, set(paths)) - {module} for module, path in paths.items()}


def test_the_parts_import_each_other_without_a_cycle():
    graph = part_graph()
    assert {"cli", "stages", "model", "engine", "host", "job", "supplychain",
            "reproducibility"} <= set(graph)
    assert cycles(graph) == []


def test_stages_holds_the_steps_and_their_parts_only():
    """Issue 49: what is not a step lives with its concept (the job, the supply chain,
    reproducibility); stages/ imports the job (the smoke's throughput and workload levels run
    it) and the supply chain (publish signs), and neither imports a step."""
    graph = part_graph()
    assert "stages" not in graph.get("job", set()) | graph.get("supplychain", set())
    assert {"job", "supplychain"} <= graph["stages"]


def test_the_modules_import_each_other_without_a_cycle():
    """No circle of modules, e.g. attest → tagging → publish → sign → attest (a helper lives in
    a module both sides can import, as tagging.render_tag and base.bytecode_hosts)."""
    graph = module_graph()
    assert len(graph) > 100 and "infermatrix.model.tagpolicy" in graph["infermatrix.supplychain.attest"]
    assert {f"infermatrix.stages.{m}" for m in ("plan", "tagging", "report")} <= \
        graph["infermatrix.stages"]  # the step table's imports, inside step_modules()
    assert cycles(graph) == []


def test_an_import_inside_a_function_closes_a_circle(tmp_path):
    """The module graph sees `from .x import y` inside a function, and `from . import x` of a
    sibling without the package it sits in; a name taken from a package is an edge to it."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("def helper():\n    from . import a\n")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def late():\n    from .a import thing\n")
    (package / "c.py").write_text("from . import helper\n")
    paths = {module_name(p, tmp_path): p for p in package.glob("*.py")}
    edges = {name: imports_of(path, set(paths), tmp_path) - {name}
             for name, path in paths.items()}
    assert edges == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"},
                     "pkg.c": {"pkg"}}
    assert cycles(edges) == [("pkg.a", "pkg.b"), ("pkg.b", "pkg.a")]


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
    """The engine is passed by hand: engine/docker.py and the parts its Engine is made of have
    no thread-local, no `current()`, `bound()` or `use()`, and no module-level function that
    calls an engine's method."""
    for part in ("docker", "endpoint", "host", "images", "containers", "builds"):
        text = (PACKAGE / "engine" / f"{part}.py").read_text(encoding="utf-8")
        functions = {node.name for node in ast.parse(text).body
                     if isinstance(node, ast.FunctionDef)}
        assert not {"current", "bound", "use", "build_image", "inspect_image",
                    "container"} & functions, part
        assert "threading.local" not in text, part
