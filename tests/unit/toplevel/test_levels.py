"""The smoke level table (src/infermatrix/levels.py, issue 49): the one home of the levels.
Every level named in the package comes from it, its functions exist, and what a user reads
(`--levels` and its help, the default tag policy, the matrix check) is the table's."""

from __future__ import annotations

import ast
import inspect

import pytest

from infermatrix import levels as level_table
from infermatrix.consumer import verify
from infermatrix.options import OPTIONS, level_list
from infermatrix.stages import smoke, tagging
from tests.paths import REPO

PACKAGE = REPO / "src" / "infermatrix"
# literals that hold two level names without being a list of levels
NOT_LEVELS = {"model/capacity.py": "an estimate's axes: the GPU class and the model"}


def literal_level_lists() -> list[str]:
    """`file:line` of every tuple, list, set, dict or `in (...)` literal outside the table
    naming two or more levels: a second list of the levels (the harness runs in the image,
    where the package is not)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where == "levels.py" or where.startswith("harness/") or where in NOT_LEVELS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                items = node.elts
            elif isinstance(node, ast.Dict):
                items = [key for key in node.keys if key is not None]
            else:
                continue
            names = {i.value for i in items if isinstance(i, ast.Constant)} & set(level_table.NAMES)
            if len(names) >= 2:
                found.append(f"{where}:{node.lineno} {sorted(names)}")
    return found


def test_no_module_lists_the_levels_but_the_table():
    assert literal_level_lists() == []


def test_the_levels_option_and_its_help_are_the_tables():
    row = OPTIONS["levels"]
    assert f"subset of {','.join(level_table.NAMES)} " in row.help
    assert f"(default: {','.join(level_table.DEFAULT_LEVELS)})" in row.help
    assert level_list(",".join(level_table.NAMES)) == list(level_table.NAMES)
    with pytest.raises(ValueError, match="unknown smoke level 'perf'"):
        level_list("static,perf")


def test_each_rows_functions_exist_with_the_runners_signature():
    runner_params = list(inspect.signature(smoke.run_model).parameters)
    for level in level_table.LEVELS:
        runner = getattr(smoke, level.runner)
        assert list(inspect.signature(runner).parameters) == runner_params, level.name
        if level.summary:
            assert callable(getattr(smoke, level.summary)), level.name
        if level.verify:
            assert list(inspect.signature(getattr(verify, level.verify)).parameters) == ["v"]
    assert set(level_table.VERIFY_LEVELS) <= set(level_table.ALL_VERIFY_LEVELS)


def test_the_default_tag_policy_and_the_matrix_check_read_the_table():
    from infermatrix.config import load_schema

    assert tagging.DEFAULT_POLICY["require"] == list(level_table.REQUIRED_LEVELS)
    properties = load_schema()["properties"]
    for items in (properties["smoke"]["properties"]["levels"]["items"],
                  properties["tag_policy"]["properties"]["require"]["items"]):
        assert items == {"enum": list(level_table.NAMES)}


def test_levels_run_in_the_tables_order():
    assert level_table.parse(",".join(reversed(level_table.NAMES))) == list(level_table.NAMES)
    with pytest.raises(ValueError, match="subset of gpu,model,workload"):
        level_table.parse("static", level_table.ALL_VERIFY_LEVELS)
