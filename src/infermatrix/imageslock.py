"""images.lock: every published image pinned by its registry digest, with the versions inside,
its smoke results and how to serve it. `publish` writes it; `pull`, `deploy`, `verify`, `doctor`
and `report --merge` read it. One reader (checked entry by entry) and one atomic writer."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

import yaml

from .errors import UsageError
from .model.selectors import matches
from .names import reference_problem
from .state import DamagedStateFile, read_state_text, write_text_atomic

IMAGES_LOCK_NAME = "images.lock"
IMAGES_LOCK_VERSION = 1
IMAGES_LOCK_HEADER = (
    "# images.lock: written by `infermatrix publish`, read by `infermatrix pull` and\n"
    "# `infermatrix doctor`. Every image is pinned by its registry digest.\n")


def empty_images_lock() -> dict[str, Any]:
    return {"version": IMAGES_LOCK_VERSION, "images": {}, "aliases": {}}


IMAGES_LOCK_FIX = ("restore it (`git checkout images.lock`) or remove the damaged entry; "
                   "`infermatrix publish` writes the entry again")
ENTRY_TYPES = {"repository": str, "digest": str, "tag": str, "reference": str, "image_id": str,
               "labels": dict, "run": dict, "versions": dict, "smoke": dict,
               "signing": dict}  # when set
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def read_images_lock(path: Path) -> dict[str, Any]:
    """The one reader of images.lock: its data, checked entry by entry; a damaged file (not
    YAML, binary, entries of the wrong shape) is a DamagedStateFile naming it, with the fix."""
    if not path.is_file():
        empty = empty_images_lock()
        _remember(path, empty)
        return empty
    text = read_state_text(path, "images.lock", IMAGES_LOCK_FIX)
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise DamagedStateFile(f"malformed images.lock: {exc}", path,
                               mark.line + 1 if mark else None, IMAGES_LOCK_FIX) from None
    except RecursionError:  # issue 48's fuzz: `[[[[...` deeper than the parser goes
        raise DamagedStateFile("malformed images.lock: nested too deep", path, 1,
                               IMAGES_LOCK_FIX) from None
    if not isinstance(data, dict) or data.get("version") != IMAGES_LOCK_VERSION:
        raise DamagedStateFile(f"not an images.lock of version {IMAGES_LOCK_VERSION}", path, 1,
                               IMAGES_LOCK_FIX)
    data.setdefault("images", {})
    data.setdefault("aliases", {})
    problems = images_lock_problems(data)
    if problems:
        where = next((i + 1 for i, line in enumerate(text.splitlines())
                      if line.strip().startswith(f"{problems[0][0]}:")), None)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DamagedStateFile(f"damaged images.lock: {problems[0][1]}{more}", path, where,
                               IMAGES_LOCK_FIX)
    _remember(path, data)  # the base of this reader's later write_images_lock (its merge)
    return data


def images_lock_problems(lock: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, what is wrong) for every entry of images.lock whose shape publish, pull, doctor
    and deploy could not use."""
    images, aliases = lock.get("images"), lock.get("aliases")
    if not isinstance(images, dict) or not isinstance(aliases, dict):
        return [("images", "`images` and `aliases` must be mappings")]
    found = [(str(key), problem) for key, entry in images.items()
             if (problem := _entry_problem(key, entry))]
    found += [(str(alias), f"alias {alias!r} is not a mapping with cell and digest")
              for alias, entry in aliases.items()
              if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str)
                                                        for k in ("cell", "digest"))]
    return found


def _entry_problem(key: Any, entry: Any) -> str | None:
    """What is wrong with one entry, or None. A field left out (or null) is the business of
    the command that needs it (deploy: "no digest reference"); one of the wrong type is not."""
    if not isinstance(entry, dict):
        return f"entry {key!r} is not a mapping"
    if entry.get("cell") != key:
        return f"entry {key!r} is for cell {entry.get('cell')!r}"
    wrong = [k for k, kind in ENTRY_TYPES.items()
             if entry.get(k) is not None and not isinstance(entry[k], kind)]
    if wrong:
        return f"entry {key!r}: {', '.join(wrong)} of the wrong type"
    if entry.get("digest") and not DIGEST.fullmatch(entry["digest"]):
        return f"entry {key!r} has digest {entry['digest']!r}, not sha256:<64 hex>"
    problem = reference_problem(entry["repository"]) if entry.get("repository") else None
    return f"entry {key!r}: {problem}" if problem else None


def dump_images_lock(lock: dict[str, Any]) -> str:
    return IMAGES_LOCK_HEADER + yaml.safe_dump(lock, sort_keys=True, default_flow_style=False,
                                               allow_unicode=True, width=100)


# What each images.lock dict this process handed out (read_images_lock) or wrote held then:
# id -> (the dict, its path, a copy of its images and aliases). The base of
# write_images_lock's merge; the dict is kept with it, so that its id is not reused. The last
# few only (a process reads images.lock a handful of times).
_BASES: OrderedDict[int, tuple[dict[str, Any], Path, dict[str, dict[str, Any]]]] = OrderedDict()
_BASES_KEPT = 64


def _sections(lock: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: copy.deepcopy(dict(lock.get(name) or {})) for name in ("images", "aliases")}


def _remember(path: Path, lock: dict[str, Any]) -> None:
    _BASES[id(lock)] = (lock, path.resolve(), _sections(lock))
    _BASES.move_to_end(id(lock))
    while len(_BASES) > _BASES_KEPT:
        _BASES.popitem(last=False)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock for images.lock's read-merge-write. The lock is on the folder
    that holds it (the file itself is replaced by a rename, so a lock on its inode would not
    exclude a writer that opened the new one): no lock file is left in the checkout."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _merged(on_disk: dict[str, Any], mine: dict[str, Any],
            base: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A three-way merge per entry: what this writer changed since it read (`base`) wins;
    every other entry is as on disk (another run's, added or changed meanwhile)."""
    merged = {**on_disk, **{k: v for k, v in mine.items() if k not in ("images", "aliases")}}
    for name in ("images", "aliases"):
        theirs, ours, was = dict(on_disk.get(name) or {}), dict(mine.get(name) or {}), base[name]
        for key in set(ours) | set(was):
            if key not in ours:
                theirs.pop(key, None)  # removed by this writer
            elif key not in was or ours[key] != was[key]:
                theirs[key] = ours[key]  # added or changed by this writer
        merged[name] = theirs
    return merged


def write_images_lock(path: Path, lock: dict[str, Any]) -> None:
    """Atomic write: a reader (or an interrupted publish) sees the old file or the new one.
    Two writers (two `publish` runs from different state directories on one checkout) are
    serialised by an exclusive lock and merged: the entries this writer added, changed or
    removed since it read `lock` (read_images_lock) are applied to what is on disk now, so
    another run's cells stay. `lock` is updated in place to what was written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path):
        remembered = _BASES.get(id(lock))
        if remembered and remembered[0] is lock and remembered[1] == path.resolve() \
                and path.is_file():
            merged = _merged(read_images_lock(path), lock, remembered[2])
        else:  # not read from `path` by this process (report --merge's): written as given
            merged = lock
        write_text_atomic(path, dump_images_lock(merged))
        if merged is not lock:
            lock.clear()
            lock.update(merged)
        _remember(path, lock)


def select_entries(lock: dict[str, Any], selector: str) -> list[dict[str, Any]]:
    ids = sorted(lock["images"])
    chosen = [lock["images"][i] for i in ids if i == selector or matches(selector, i)]
    if not chosen:
        raise UsageError(f"no cell of images.lock matches {selector!r}"
                         f" (published: {', '.join(ids) or 'none'})")
    return chosen
