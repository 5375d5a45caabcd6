"""Issue 49: docs/architecture.md's option table is generated from the option table in code
(options.OPTIONS, by options.markdown_table()), so the two cannot drift: a new option, flag,
variable, matrix key or default in code fails this test until the docs say it too."""

from __future__ import annotations

import dataclasses

from tests.paths import REPO

from infermatrix import options

DOCS = REPO / "docs" / "architecture.md"
START = "  <!-- the option table: generated from options.OPTIONS"
END = "  <!-- end of the option table -->"
REGENERATE = ('python -c "from infermatrix.options import markdown_table; '
              'print(markdown_table())" (indented by two spaces, between the markers)')


def committed_table(text: str) -> str:
    """The table between the markers, without the list item's two-space indent."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(START))
    start = next(i for i in range(start, len(lines)) if lines[i].endswith("-->")) + 1
    end = lines.index(END)
    assert all(line.startswith("  ") for line in lines[start:end])
    return "".join(line[2:] + "\n" for line in lines[start:end])


def test_the_docs_option_table_is_the_generated_one():
    assert committed_table(DOCS.read_text(encoding="utf-8")) == options.markdown_table(), \
        f"docs/architecture.md's option table is stale: regenerate it with {REGENERATE}"


def test_the_generated_table_has_a_row_per_option_and_follows_a_change(monkeypatch):
    table = options.markdown_table()
    assert len(table.splitlines()) == 2 + len(options.OPTIONS)
    assert "| `--timeout-min` N | `INFERMATRIX_TIMEOUT_MIN` | `build.timeout_minutes` | `180.0` |" \
        in table
    changed = dict(options.OPTIONS, timeout_min=dataclasses.replace(
        options.OPTIONS["timeout_min"], default=240.0))
    monkeypatch.setattr(options, "OPTIONS", changed)
    assert "`240.0`" in options.markdown_table() != table
