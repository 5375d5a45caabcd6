"""`infermatrix report --merge DIR...`: one journal, one report and one images.lock from the
fragments many runners (CI jobs, builders) left behind (issue 19).

A fragment is a directory that holds `journal/` (a state directory, or what a CI job uploaded:
its journal and report fragment) and, where the runner published, an `images.lock`. A
directory without `journal/` whose subdirectories have one (`actions/download-artifact` into
one folder) stands for those subdirectories.

Records are per cell, so fragments merge cell by cell: a cell in several fragments keeps its
newest record (the `updated` stamp; on a tie the later fragment). images.lock entries come
from the fragments' lock files and from the publish stage's journal details (`lock_entry`);
one tag (`repository:tag`) pinned to two digests is a conflict, refused with both named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import DigestConflict, StageFailure, UsageError
from ..journal import CellRecord, load_records
from ..outcome import PublishDetails
from ..state import StatePaths
from ..imageslock import IMAGES_LOCK_NAME, empty_images_lock, read_images_lock


@dataclass
class Fragment:
    root: Path
    records: dict[str, CellRecord]
    lock: dict[str, Any]


@dataclass
class Merged:
    records: dict[str, CellRecord]
    lock: dict[str, Any]
    sources: dict[str, Path] = field(default_factory=dict)  # cell id -> fragment it came from


def fragment_roots(dirs: Iterable[Path | str]) -> list[Path]:
    """Each DIR with a journal/, or its subdirectories that have one; none: a usage error."""
    roots: list[Path] = []
    for given in dirs:
        path = Path(given)
        if not path.is_dir():
            raise UsageError(f"--merge {path}: not a directory")
        if (path / "journal").is_dir():
            roots.append(path.resolve())
            continue
        found = sorted(p.resolve() for p in path.iterdir() if (p / "journal").is_dir())
        if not found:
            raise UsageError(f"--merge {path}: holds no journal/ (neither a state directory "
                             "nor a folder of job fragments)")
        roots.extend(found)
    return list(dict.fromkeys(roots))


def load_fragment(root: Path) -> Fragment:
    lock_file = root / IMAGES_LOCK_NAME
    state = StatePaths.at(root)
    check_record_cells(state)
    return Fragment(root, load_records(state),
                    read_images_lock(lock_file) if lock_file.is_file() else empty_images_lock())


def check_record_cells(state: StatePaths) -> None:
    """Each journal file holds the record of the cell it is named for, and its publish lock
    entry is of that cell too (a record of cell A under B's name would report, and put in
    images.lock, A's results as B's): a StageFailure naming both (exit 1)."""
    from ..journal import load_all

    for cell_id, data in load_all(state).items():
        named, entry = data.get("cell"), CellRecord.from_json(cell_id, data).publish.lock_entry
        found = [(what, value) for what, value in (
            ("its record is of cell", named),
            ("its publish lock entry is of cell", entry.cell if entry else cell_id))
            if value != cell_id]
        if found and not (named is None and data.get("problems")):
            what, value = found[0]
            raise StageFailure(f"{state.journal / (cell_id + '.json')}: {what} {value}, not "
                               f"{cell_id}", fix="leave this fragment out, or restore the "
                               "journal file the run wrote")


def _newer(candidate: CellRecord, current: CellRecord | None) -> bool:
    return current is None or (candidate.updated or "") >= (current.updated or "")


def journal_lock_entries(records: dict[str, CellRecord]) -> dict[str, dict[str, Any]]:
    """images.lock entries the publish stage recorded in the journal (passed publishes)."""
    entries: dict[str, dict[str, Any]] = {}
    for cell_id, record in records.items():
        publish = record.stage("publish")
        if not publish or publish.status != "pass":
            continue
        entry = publish.details.get("lock_entry") or _entry_from_details(cell_id,
                                                                         record.publish)
        if isinstance(entry, dict) and entry.get("digest"):
            entries[cell_id] = entry
    return entries


def _entry_from_details(cell_id: str, details: PublishDetails) -> dict[str, Any] | None:
    """A journal written before publish recorded its lock entry: tag, digest and reference."""
    tag, digest = details.tag, details.digest
    if not tag or ":" not in tag.rpartition("/")[2] or not digest:
        return None
    repository, _, name = tag.rpartition(":")
    return {"cell": cell_id, "repository": repository, "tag": name, "digest": digest,
            "reference": details.reference or f"{repository}@{digest}"}


def _tag_of(entry: dict[str, Any]) -> str:
    return f"{entry.get('repository', '?')}:{entry.get('tag', entry.get('cell', '?'))}"


class _LockMerger:
    """Adds entries one by one; remembers which fragment pinned each tag to which digest."""

    def __init__(self) -> None:
        self.lock = empty_images_lock()
        self.pinned: dict[str, tuple[str, Path]] = {}  # tag -> (digest, fragment)

    def add(self, cell_id: str, entry: dict[str, Any], source: Path) -> None:
        self._pin(_tag_of(entry), str(entry["digest"]), source)
        current = self.lock["images"].get(cell_id)
        if current is None or str(entry.get("published") or "") >= \
                str(current.get("published") or ""):
            self.lock["images"][cell_id] = entry

    def add_alias(self, alias: str, entry: dict[str, Any], source: Path) -> None:
        if entry.get("digest"):
            self._pin(str(entry.get("tag") or alias), str(entry["digest"]), source)
        self.lock["aliases"][alias] = entry

    def _pin(self, tag: str, digest: str, source: Path) -> None:
        known = self.pinned.get(tag)
        if known and known[0] != digest:
            raise DigestConflict(
                f"conflicting digests for {tag}: {known[0]} (in {known[1]}) and {digest} "
                f"(in {source}); a tag is immutable: publish one of them under another tag "
                "or leave one fragment out")
        self.pinned.setdefault(tag, (digest, source))


def merge_fragments(fragments: list[Fragment]) -> Merged:
    merged = Merged({}, empty_images_lock())
    locks = _LockMerger()
    for fragment in fragments:
        for cell_id, record in fragment.records.items():
            if _newer(record, merged.records.get(cell_id)):
                merged.records[cell_id] = record
                merged.sources[cell_id] = fragment.root
        for cell_id, entry in fragment.lock.get("images", {}).items():
            if isinstance(entry, dict) and entry.get("digest"):
                locks.add(str(cell_id), entry, fragment.root / IMAGES_LOCK_NAME)
        for cell_id, entry in journal_lock_entries(fragment.records).items():
            locks.add(cell_id, entry, fragment.root / "journal" / f"{cell_id}.json")
        for alias, entry in fragment.lock.get("aliases", {}).items():
            if isinstance(entry, dict):
                locks.add_alias(str(alias), entry, fragment.root / IMAGES_LOCK_NAME)
    merged.lock = locks.lock
    return merged


def merge_dirs(dirs: Iterable[Path | str]) -> Merged:
    return merge_fragments([load_fragment(root) for root in fragment_roots(dirs)])


def write_merged_journal(merged: Merged, state: StatePaths) -> None:
    """The merged records as one journal (one file per cell, as the stages write them)."""
    from ..journal import record_path
    from ..state import write_json_atomic

    for cell_id, record in merged.records.items():
        data = {"cell": record.cell, "input_hash": record.input_hash,
                "image_id": record.image_id, "updated": record.updated,
                "stages": {n: s.to_json() for n, s in record.stages.items()}, **record.extra}
        if record.problems:
            data["problems"] = record.problems
        write_json_atomic(record_path(state, cell_id), data)


def describe(merged: Merged) -> str:
    fragments = sorted(set(merged.sources.values()))
    return (f"merged {len(merged.records)} cell(s) from {len(fragments)} fragment(s); "
            f"{len(merged.lock['images'])} image(s) in {IMAGES_LOCK_NAME}")

