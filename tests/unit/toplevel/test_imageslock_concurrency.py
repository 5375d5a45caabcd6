"""images.lock written by two `publish` runs at once (issue 48): two runs from different state
directories on one checkout each read images.lock at their start and wrote their whole copy
after each cell, so the last writer dropped the other's cells. The write now takes an exclusive
lock (fcntl) and merges what is on disk: each run's changes, every other run's entries. Real
processes, a real file, real locks; the writers follow publish's pattern (read once, then set
an entry and write after each cell)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from infermatrix.imageslock import read_images_lock, write_images_lock


def _entry(cell: str, digest_char: str) -> dict:
    digest = "sha256:" + digest_char * 64
    return {"cell": cell, "repository": "registry.example/im", "tag": cell, "digest": digest,
            "reference": f"registry.example/im@{digest}"}


def _publisher(path: str, name: str, cells: int, start, digest_char: str) -> None:
    lock = read_images_lock(Path(path))  # at the run's start, as Publisher does
    start.wait(30)  # every run has read before any writes
    for i in range(cells):
        cell = f"{name}-cell{i}"
        lock["images"][cell] = _entry(cell, digest_char)
        lock["aliases"][f"{name}-latest"] = {"cell": cell, "digest": "sha256:" + digest_char * 64}
        write_images_lock(Path(path), lock)


def _run(path: Path, runs: dict[str, str], cells: int) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(runs))
    procs = [ctx.Process(target=_publisher, args=(str(path), name, cells, start, char))
             for name, char in runs.items()]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0


def test_two_publish_runs_at_once_keep_every_cell(tmp_path: Path) -> None:
    path = tmp_path / "images.lock"
    write_images_lock(path, {"version": 1, "images": {"old": _entry("old", "0")},
                             "aliases": {}})
    _run(path, {"a": "a", "b": "b", "c": "c"}, cells=12)
    lock = read_images_lock(path)
    expected = {"old"} | {f"{n}-cell{i}" for n in "abc" for i in range(12)}
    assert set(lock["images"]) == expected
    assert set(lock["aliases"]) == {"a-latest", "b-latest", "c-latest"}
    assert lock["images"]["b-cell3"]["digest"] == "sha256:" + "b" * 64
    assert not [p.name for p in tmp_path.iterdir() if p.name != "images.lock"]  # no temp left


def test_a_run_overwrites_what_it_changed_not_what_it_read(tmp_path: Path) -> None:
    """Run A read cell X before run B republished it; A then publishes Y: B's X stays."""
    path = tmp_path / "images.lock"
    write_images_lock(path, {"version": 1, "images": {"x": _entry("x", "1")}, "aliases": {}})
    a = read_images_lock(path)
    b = read_images_lock(path)
    b["images"]["x"] = _entry("x", "2")
    write_images_lock(path, b)
    a["images"]["y"] = _entry("y", "3")
    write_images_lock(path, a)
    lock = read_images_lock(path)
    assert lock["images"]["x"]["digest"] == "sha256:" + "2" * 64
    assert set(lock["images"]) == {"x", "y"}
    assert a["images"]["x"]["digest"] == "sha256:" + "2" * 64  # the writer's copy is merged too


def test_an_entry_the_writer_removed_is_removed_and_one_it_never_saw_is_kept(tmp_path) -> None:
    path = tmp_path / "images.lock"
    write_images_lock(path, {"version": 1, "images": {"x": _entry("x", "1")}, "aliases": {}})
    a = read_images_lock(path)
    b = read_images_lock(path)
    b["images"]["z"] = _entry("z", "4")
    write_images_lock(path, b)
    del a["images"]["x"]
    write_images_lock(path, a)
    assert set(read_images_lock(path)["images"]) == {"z"}
