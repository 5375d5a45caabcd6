"""The typed stage details (outcome.py, issue 49): every recorded journal reads back typed,
the recorded values unchanged; odd shapes read as empty fields, never an exception; a typed
writer writes the journal's JSON form."""

from __future__ import annotations

import json

import pytest

from infermatrix import journal
from infermatrix.outcome import (AuditDetails, BuildDetails, Level, PublishDetails,
                                 SmokeDetails, TagDetails, TrainDetails)
from infermatrix.state import StatePaths
from tests.paths import TESTS

RECORDED = sorted((TESTS / "fixtures" / "journal" / "state" / "journal").glob("*.json"))
TYPED = {"build": BuildDetails, "audit": AuditDetails, "smoke": SmokeDetails, "tag": TagDetails,
         "publish": PublishDetails, "train": TrainDetails}


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_every_recorded_journal_reads_back_typed_with_its_values(path):
    data = json.loads(path.read_text())
    record = journal.CellRecord.from_json(path.stem, data)
    for name, stage in data["stages"].items():
        if name not in TYPED:
            continue
        raw = stage.get("details") or {}
        typed = getattr(record, name)
        assert isinstance(typed, TYPED[name])
        written = typed.to_json()
        # a recorded key keeps its value (a number as a float); none is lost
        assert {k: written[k] for k in raw} == json.loads(json.dumps(raw)), (name, path.name)


def test_the_fields_of_a_tagged_cell():
    path = next(p for p in RECORDED if p.stem == "cu130-torch2.11.0-sglang0.5.11-sm120")
    record = journal.CellRecord.from_json(path.stem, json.loads(path.read_text()))
    assert record.tag.kind == "tested" and record.tag.tagged_image_id == record.image_id
    assert record.smoke.levels["model"].figures() == {"single": 41.7, "concurrent": 118.4}
    assert record.smoke.levels["gpu"].status == "pass"
    assert [c.name for c in record.audit.checks][:2] == ["kernels", "cuda-major"]
    assert record.audit.checks[0].extra["objects"] == 3  # a check's own data is kept
    assert record.audit.versions["sglang"] == "0.5.11"
    assert record.build.kernels["flashinfer"]["cache"] == "hit"
    assert record.publish.digest and record.publish.lock_entry is None  # recorded before it


@pytest.mark.parametrize("details", [
    None, "a string", [1, 2], {"levels": ["pass", None]}, {"levels": {"model": "pass"}},
    {"checks": [1, "x", None, {"name": 3}]}, {"uncovered": 42, "versions": ["a"]},
    {"image_id": 12, "tokens_per_s": "fast", "lock_entry": "x", "base_images": [1]},
])
def test_odd_details_read_as_empty_fields(details):
    for kind in TYPED.values():
        typed = kind.from_json(details)
        json.dumps(typed.to_json())
    smoke, audit = SmokeDetails.from_json(details), AuditDetails.from_json(details)
    assert all(isinstance(level, Level) for level in smoke.levels.values())
    assert all(isinstance(c.name, str) for c in audit.checks)
    assert isinstance(audit.uncovered, list) and isinstance(audit.versions, dict)
    assert PublishDetails.from_json(details).lock_entry is None
    assert BuildDetails.from_json(details).base_images is None


def test_a_typed_writer_records_the_journals_form(tmp_path):
    state = StatePaths.at(tmp_path)
    details = TrainDetails("sha256:" + "1" * 64, None, "infermatrix-local:c-train",
                           "sha256:" + "2" * 64, {"k": {"cache": "miss"}}, {})
    journal.record_stage(state, "c", "train", journal.Status.PASS, details=details)
    stored = journal.load(state, "c")["stages"]["train"]["details"]
    assert stored == {"image_id": "sha256:" + "1" * 64, "tag": None,
                      "local_tag": "infermatrix-local:c-train", "input_hash": "sha256:" + "2" * 64,
                      "kernels": {"k": {"cache": "miss"}}, "coverage": {}}
    assert journal.cell_record(state, "c").train == details
