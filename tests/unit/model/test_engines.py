"""The serving-engine table (data/engines.yaml, model/engines.py, issue 49): every engine of the
shipped matrix has its row, the rows hold only the table's columns, and no module outside the
table branches on an engine's name. Pure."""

from __future__ import annotations

import ast
import re

import yaml

from infermatrix.model import capacity, engines, unifiedmem
from tests.paths import REPO

PACKAGE = REPO / "src" / "infermatrix"
COLUMNS = {"harness", "memory_flag", "max_seqs_flag", "flags_of", "log_backends"}


def table() -> dict[str, dict[str, str]]:
    return yaml.safe_load(engines.DATA.read_text(encoding="utf-8"))["engines"]


def test_every_engine_of_the_shipped_matrix_has_a_row_of_the_tables_columns():
    shipped = yaml.safe_load((REPO / "matrix.yaml").read_text(encoding="utf-8"))["engines"]
    assert set(shipped) <= set(table())
    for name, row in table().items():
        assert set(row) <= COLUMNS, name
        assert row.get("flags_of") in (None, *table()), name
        for kind, patterns in (row.get("log_backends") or {}).items():
            assert kind in ("attention", "gdn") and all(re.compile(p).groups == 1
                                                        for p in patterns), name


def test_the_users_read_the_rows():
    assert engines.harness_name("sglang") == "sglang"
    assert engines.harness_name("vllm-cpu") == engines.harness_name("trtllm") == "none"
    assert capacity.max_seqs_flag("vllm-cpu") == table()["vllm-cpu"]["max_seqs_flag"]
    sizing = unifiedmem.size(128 * 2**30, 100 * 2**30, "sglang")
    assert sizing.flag == table()["sglang"]["memory_flag"]


def test_no_module_branches_on_an_engines_name():
    """A string literal that is an engine key, compared with (==, in) or listed: a second
    home of an engine fact (the harness runs in the image, where the table is not)."""
    names = set(table())
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("harness/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                items = [node.left, *node.comparators]
                items += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List,
                                                                         ast.Set)) for e in c.elts]
            elif isinstance(node, ast.Dict):
                items = [key for key in node.keys if key is not None]
            else:
                continue
            if any(isinstance(i, ast.Constant) and i.value in names for i in items):
                found.append(f"{where}:{node.lineno}")
    assert found == []
