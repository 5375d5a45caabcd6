"""`infermatrix report` filling missing image sizes from the real engine (the report's unit
tests: tests/unit/stages/test_report.py)."""

from __future__ import annotations

import pytest

from infermatrix.stages.report import build_report
from tests.unit.stages.test_report import (
    RENDERED,
    TAGGED,
    VERIFIED,
    cell,
    report,  # noqa: F401,F811 - a fixture of the tests below
)


@pytest.mark.docker
def test_cli_fills_missing_image_sizes_from_docker(built_base, tmp_path):
    from infermatrix.engine import docker as engine
    from infermatrix.journal import records_of
    from infermatrix.stages.report import fill_image_sizes

    info = engine.Engine().inspect_image(built_base)
    records = records_of({
        TAGGED: {"image_id": info["Id"], "stages": {"build": {"status": "pass"}}},
        RENDERED: {"image_id": None, "stages": {}},
        VERIFIED: {"image_id": info["Id"], "image_size_bytes": 123, "stages": {}}})
    assert fill_image_sizes(records, engine.Engine()) == 1
    assert records[TAGGED].extra["image_size_bytes"] == info["Size"] > 0
    assert records[VERIFIED].extra["image_size_bytes"] == 123  # a recorded size wins
    assert cell(build_report(records, []), TAGGED).image_size == info["Size"]
