"""`infermatrix watch` (#45): releases newer than the committed plan with a settle delay, the
ones a pin blocks, and yanked ones the plan uses; answers cached, offline from the cache."""

from __future__ import annotations

import datetime
import json

import pytest

from infermatrix.model.index import IndexUnavailable
from infermatrix.stages import releasewatch
from infermatrix.stages.releasewatch import Release, planned_versions, releases_of, watch

NOW = datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc)


def wheel(version: str, when: str, platform: str = "manylinux_2_28_x86_64", yanked=False):
    return {"filename": f"vllm-{version}-cp38-abi3-{platform}.whl", "upload-time": when,
            "yanked": yanked}


def test_releases_take_the_first_linux_wheel_and_are_yanked_only_when_every_wheel_is():
    files = [wheel("0.33.0", "2026-11-01T10:00:00Z"), wheel("0.33.0", "2026-11-01T09:00:00Z",
                                                             "manylinux_2_28_aarch64"),
             wheel("0.34.0", "2026-11-16T23:51:51Z", yanked="broken pin"),
             wheel("0.35.0", "2026-12-01T00:00:00Z", "macosx_11_0_arm64"),
             {"filename": "vllm-0.36.0.tar.gz", "upload-time": "2026-12-02T00:00:00Z"}]
    got = {r.version: r for r in releases_of("vllm", files)}
    assert set(got) == {"0.33.0", "0.34.0"}  # no Linux wheel: 0.35.0, 0.36.0
    assert got["0.33.0"].uploaded == "2026-11-01T09:00:00Z" and not got["0.33.0"].yanked
    assert got["0.34.0"].yanked and got["0.34.0"].yanked_reason == "broken pin"


def releases(*rows):
    return {"vllm": [Release("vllm", v, when, yanked) for v, when, yanked in rows]}


def test_settled_waiting_blocked_and_yanked():
    known = releases(("0.33.0", "2026-11-01T00:00:00Z", True),
                     ("0.34.0", "2026-11-16T00:00:00Z", False),
                     ("0.35.0", "2026-12-03T00:00:00Z", False),
                     ("0.36.0rc1", "2026-11-01T00:00:00Z", False))
    lines = watch({"vllm": {"0.33.0"}}, known, NOW, 7)
    assert [(line.kind, line.version) for line in lines] == [
        ("yanked", "0.33.0"), ("settled", "0.34.0"), ("waiting", "0.35.0")]
    assert "settles on 2026-12-10" in lines[2].detail
    blocked = watch({"vllm": {"0.33.0"}}, known, NOW, 7,
                    lambda e, v: "it pins flashinfer-python==0.7.3" if v == "0.34.0" else None)
    assert blocked[1].kind == "blocked" and "flashinfer-python==0.7.3" in blocked[1].detail
    assert watch({"vllm": {"0.35.0"}}, known, NOW, 7) == []  # nothing newer, none yanked used


def test_planned_versions_leave_pruned_cells_out():
    snapshot = {"cells": {"a": {"engine": "vllm", "version": "0.33.0", "status": "planned"},
                          "b": {"engine": "vllm", "version": "0.19.0", "status": "unverified"},
                          "c": {"engine": "vllm", "version": "0.20.0", "status": "pruned"}}}
    assert planned_versions(snapshot) == {"vllm": {"0.33.0", "0.19.0"}}


def test_answers_are_cached_and_offline_reads_the_cache(tmp_path, monkeypatch):
    page = {"files": [wheel("0.34.0", "2026-11-16T00:00:00Z")]}
    monkeypatch.setattr(releasewatch, "_http_get", lambda url, headers=None: json.dumps(page))
    online = releasewatch.fetch_releases(tmp_path, "vllm", "https://pypi.org/simple")
    assert [r.version for r in online] == ["0.34.0"]

    def down(url, headers=None):
        raise IndexUnavailable("no network")
    monkeypatch.setattr(releasewatch, "_http_get", down)
    assert releasewatch.fetch_releases(tmp_path, "vllm", "x", offline=True) == online
    assert releasewatch.fetch_releases(tmp_path, "vllm", "x") == online  # unreachable: cache
    with pytest.raises(IndexUnavailable, match="run once online"):
        releasewatch.fetch_releases(tmp_path, "sglang", "x", offline=True)
