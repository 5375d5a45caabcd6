"""Templates and tag templates are checked when matrix.yaml loads (issue 47): a missing or broken
template, or a typo in publish.tag, is named at load with its file and line (exit 2), not at the
render or tag step after hours of work. Pure: files in a temp dir."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infermatrix.cli import main
from infermatrix.config import TAG_FIELDS, load_matrix, tag_template_problem
from infermatrix.errors import ConfigError
from tests.paths import REPO, TESTS


@pytest.fixture
def matrix_dir(tmp_path: Path) -> Path:
    """The test matrix with its own copy of the project's templates beside it."""
    shutil.copytree(TESTS / "matrix", tmp_path / "m", ignore=shutil.ignore_patterns("images"))
    shutil.copytree(REPO / "templates", tmp_path / "m" / "templates")
    return tmp_path / "m"


def load_problems(matrix_dir: Path) -> list[ConfigError]:
    with pytest.raises(ConfigError) as info:
        load_matrix(matrix_dir / "matrix.yaml")
    return list(getattr(info.value, "errors", [info.value]))


def test_the_shipped_and_test_matrices_load_with_their_templates(matrix_dir):
    load_matrix(REPO / "matrix.yaml")
    load_matrix(matrix_dir / "matrix.yaml")


def test_a_template_syntax_error_is_named_at_load_with_file_and_line(matrix_dir, tmp_path,
                                                                     capsys):
    broken = matrix_dir / "templates" / "blocks" / "runtime.j2"
    broken.write_text("FROM x\n{% if %}\n")
    [problem] = load_problems(matrix_dir)
    assert problem.path == broken and problem.line == 2
    assert "template syntax error" in problem.message
    code = main(["plan", "--offline", "--matrix", str(matrix_dir / "matrix.yaml"),
                 "--state-dir", str(tmp_path / "state")])
    assert code == 2
    assert "runtime.j2:2: template syntax error" in capsys.readouterr().err


def test_a_missing_template_is_named_at_load(matrix_dir):
    (matrix_dir / "templates" / "blocks" / "toolchain.j2").unlink()
    [problem] = load_problems(matrix_dir)
    assert "includes 'blocks/toolchain.j2'" in problem.message
    assert Path(problem.path).name == "Dockerfile.j2"
    (matrix_dir / "templates" / "files" / "serve.sh.j2").unlink()
    assert any("'files/serve.sh.j2' not found" in p.message for p in load_problems(matrix_dir))


@pytest.mark.parametrize(("template", "what"), [
    ("{cel_id}", "unknown placeholder {cel_id}"),
    ("{cell_id", "does not parse"),
    ("{cell_id}:latest", "not a valid tag"),
    ("{cell_id!z}", "does not format"),
])
def test_a_tag_template_typo_is_caught_at_load(matrix_dir, template, what):
    path = matrix_dir / "matrix.yaml"
    text = path.read_text()
    assert 'tag: "{cell_id}"' in text
    path.write_text(text.replace('tag: "{cell_id}"', f'tag: "{template}"'))
    [problem] = load_problems(matrix_dir)
    assert what in problem.message and problem.message.startswith("publish.tag: ")
    assert problem.line == text.splitlines().index('  tag: "{cell_id}"') + 1


def test_good_tag_templates_pass_and_alias_templates_are_checked_too(matrix_dir):
    assert tag_template_problem("{engine}-{arch_tag}-latest") is None
    path = matrix_dir / "matrix.yaml"
    path.write_text(path.read_text().replace("aliases: []", 'aliases: ["{engin}-latest"]'))
    [problem] = load_problems(matrix_dir)
    assert problem.message.startswith("publish.aliases.0: unknown placeholder {engin}")


def test_the_tag_fields_are_the_ones_publish_fills():
    from infermatrix.model.cell import Cell
    from infermatrix.stages.tagging import tag_fields

    cell = Cell(cuda="13.0", torch="2.13.0", engine="vllm", engine_version="0.19.0",
                arch="sm_120")
    assert tuple(tag_fields(cell)) == TAG_FIELDS
