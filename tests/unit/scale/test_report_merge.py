"""`infermatrix report --merge DIR...` (issue 19), pure: no Docker.

The recorded journal of the report tests (tests/fixtures/journal, 8 records + their logs) is
split cell by cell into state directories, as separate runners leave them; merged, they give
the report of the one journal (and the same log tails, read from each fragment). Conflicting
digests for one tag are refused with both named. The real counterpart, fragments of separate
pipeline runs on the real engine, is in tests/docker/test_builders_docker.py.
"""

from __future__ import annotations

from tests.paths import TESTS

import json
import shutil
from pathlib import Path

import yaml

from infermatrix.cli import main
from infermatrix.scale import merge

FIXTURE = TESTS / "fixtures" / "journal"
STATE = FIXTURE / "state"
PLAN = FIXTURE / "plan.json"
TAGGED = "cu130-torch2.11.0-sglang0.5.11-sm120"
DIGEST = "sha256:3f1c9a0e5b7d2c4f6a8b0c1d2e3f405162738495a6b7c8d9e0f1a2b3c4d5e6f7"


def split_state(tmp_path: Path, parts: int) -> list[Path]:
    """The fixture journal as `parts` state directories, each cell (and its logs) in one."""
    roots = [tmp_path / f"runner-{i}" for i in range(parts)]
    for i, record in enumerate(sorted((STATE / "journal").glob("*.json"))):
        root = roots[i % parts]
        (root / "journal").mkdir(parents=True, exist_ok=True)
        shutil.copy(record, root / "journal" / record.name)
        logs = STATE / "logs" / record.stem
        if logs.is_dir():
            shutil.copytree(logs, root / "logs" / record.stem)
    return roots


def report_of(out: Path) -> dict:
    data = json.loads((out / "report.json").read_text())
    data.pop("generated")
    return data


def report_args(out: Path, tmp_path: Path) -> list[str]:
    return ["--plan", str(PLAN), "--matrix", str(tmp_path / "absent.yaml"), "--out", str(out),
            "--no-docker"]


def test_merged_fragments_give_the_report_of_one_journal(tmp_path, capsys) -> None:
    single = tmp_path / "single"
    assert main(["report", "--state-dir", str(STATE), *report_args(single, tmp_path)]) == 0
    fragments = split_state(tmp_path, 3)
    merged = tmp_path / "merged"
    code = main(["report", "--merge", *map(str, fragments), *report_args(merged, tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert report_of(merged) == report_of(single)
    failed = [c for c in report_of(merged)["cells"] if c["outcome"] == "failed"]
    assert failed and all(c["log_tail"] for c in failed)  # read from each cell's fragment
    # The merged journal is a fragment itself: one file per cell, merged again, same report.
    assert sorted(p.name for p in (merged / "journal").iterdir()) == \
        sorted(p.name for p in (STATE / "journal").iterdir())
    lock = yaml.safe_load((merged / "images.lock").read_text())
    assert lock["images"][TAGGED]["digest"] == DIGEST  # the fixture's one published cell
    again = tmp_path / "again"
    assert main(["report", "--merge", str(merged), *report_args(again, tmp_path)]) == 0
    assert [c["outcome"] for c in report_of(again)["cells"]] == \
        [c["outcome"] for c in report_of(single)["cells"]]


def test_a_folder_of_job_artifacts_stands_for_its_fragments(tmp_path) -> None:
    artifacts = tmp_path / "artifacts"
    for root in split_state(tmp_path, 2):
        shutil.copytree(root, artifacts / f"infermatrix-{root.name}")
    assert merge.fragment_roots([artifacts]) == sorted(
        (artifacts / f"infermatrix-runner-{i}").resolve() for i in range(2))
    assert len(merge.merge_dirs([artifacts]).records) == 8


def publish_record(cell: str, digest: str, updated: str) -> dict:
    entry = {"cell": cell, "repository": "registry.example/im", "tag": "shared-tag",
             "digest": digest, "reference": f"registry.example/im@{digest}",
             "published": updated}
    return {"cell": cell, "image_id": "sha256:" + "1" * 64, "updated": updated,
            "stages": {"publish": {"status": "pass", "details": {"lock_entry": entry}}}}


def write_fragment(root: Path, record: dict) -> Path:
    (root / "journal").mkdir(parents=True)
    (root / "journal" / f"{record['cell']}.json").write_text(json.dumps(record))
    return root


def test_conflicting_digests_for_one_tag_are_refused_naming_both(tmp_path, capsys) -> None:
    one, two = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    first = write_fragment(tmp_path / "a",
                           publish_record("cpu-x1.0-cpu", one, "2026-12-01T10:00:00Z"))
    second = write_fragment(tmp_path / "b",
                            publish_record("cpu-y1.0-cpu", two, "2026-12-01T11:00:00Z"))
    out = tmp_path / "out"
    code = main(["report", "--merge", str(first), str(second), "--matrix",
                 str(tmp_path / "absent.yaml"), "--out", str(out), "--no-docker"])
    err = capsys.readouterr().err
    assert code == 1
    assert one in err and two in err and "registry.example/im:shared-tag" in err
    assert not out.exists()  # nothing written


def test_one_cell_in_two_fragments_keeps_its_newest_record(tmp_path) -> None:
    digest = "sha256:" + "c" * 64
    old = publish_record("cpu-x1.0-cpu", digest, "2026-12-01T10:00:00Z")
    new = publish_record("cpu-x1.0-cpu", digest, "2026-12-01T12:00:00Z")
    merged = merge.merge_dirs([write_fragment(tmp_path / "new", new),
                               write_fragment(tmp_path / "old", old)])
    assert merged.records["cpu-x1.0-cpu"].updated == "2026-12-01T12:00:00Z"
    assert merged.sources["cpu-x1.0-cpu"] == (tmp_path / "new").resolve()
    assert merged.lock["images"]["cpu-x1.0-cpu"]["published"] == "2026-12-01T12:00:00Z"


def test_a_directory_without_journal_is_a_usage_error(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["report", "--merge", str(tmp_path / "empty"), "--matrix",
                 str(tmp_path / "absent.yaml"), "--no-docker"]) == 2
    assert "holds no journal/" in capsys.readouterr().err


def test_a_journal_file_named_for_another_cell_is_refused_naming_both(tmp_path, capsys) -> None:
    """A verdict is bound to its cell (issue 44): cell A's record copied under cell B's file
    name would report (and lock) A's results as B's; the merge refuses it, exit 1, nothing
    written."""
    fragments = split_state(tmp_path, 2)
    records = sorted((fragments[0] / "journal").glob("*.json"))
    victim = records[1].stem
    data = json.loads(records[0].read_text())
    (fragments[0] / "journal" / f"{victim}.json").write_text(json.dumps(data))
    out = tmp_path / "merged"
    code = main(["report", "--merge", *map(str, fragments), *report_args(out, tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and f"its record is of cell {data['cell']}, not {victim}" in err, err
    assert not (out / "report.json").exists()
    # ... and a publish lock entry of another cell in a record of the right name
    fragments = split_state(tmp_path / "again", 1)
    path = fragments[0] / "journal" / f"{TAGGED}.json"
    data = json.loads(path.read_text())
    details = data["stages"]["publish"]["details"]
    details["lock_entry"] = {"cell": victim, "digest": details.get("digest") or DIGEST,
                             "repository": "r.example/x", "tag": victim}
    path.write_text(json.dumps(data))
    code = main(["report", "--merge", str(fragments[0]), *report_args(out, tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and f"its publish lock entry is of cell {victim}, not {TAGGED}" in err, err
