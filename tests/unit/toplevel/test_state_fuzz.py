"""Fuzz the state-file loaders (issue 48; test_config_fuzz.py does the matrix): the journal,
the metadata and kernel caches, the plan files (locks/plan.json and a report's plan JSON), a
committed lock and images.lock. Many mutations of a valid file of each kind (lines dropped,
doubled, swapped or cut, characters replaced, bytes cut off, JSON/YAML values replaced by
values of another type, deep nesting, paths that climb out) must each load, or raise the
project's error naming the file (exit 2). And nothing outside the state directory changes:
a loader may remove a damaged cache entry of its own, never touch the checkout or anything
else. Pure logic, no Docker; hypothesis shrinks a failure to the smallest mutation."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermatrix import journal
from infermatrix.cli.plandiff import load_snapshot
from infermatrix.cli.report import _read_plan_file
from infermatrix.errors import ConfigError, InfermatrixError
from infermatrix.imageslock import read_images_lock
from infermatrix.kernels import kernelcache
from infermatrix.model.index import ReleaseList, ReleaseMetadata, cached_entry, typed
from infermatrix.model.spec import read_lock_text
from infermatrix.state import StatePaths

from tests.paths import REPO, TESTS

CELL = "cpu-torch2.13.0-vllm-cpu0.32.0-cpu"
KEY = kernelcache.KernelKey("fixture-kernel", "1.0", "2.13.0", "13.0", "3.12", ("sm_120",))
CLIMB = "../../../../outside/sentinel"  # from a kernel cache entry: the temporary root
DEEP = "DEEP-NESTING-HERE"

NASTY_TEXT = ["", " ", "\t", ":", "- ", "[", "]", "{", "}", "'", '"', "#", "&a", "*a",
              "!!python/object:x", "~", "null", "1e999", "-1", "0x1f", "yes", "\x00", "\ufeff",
              "é", "<<: *a", "|", "\\", CLIMB, "/etc/passwd", "sha256:zz"]
NASTY_VALUES: list[Any] = [None, 0, -1, 1.5, True, "", [], {}, "x" * 5000, CLIMB,
                           "/etc/passwd", [CLIMB], ["/etc/hostname"], {"a": [1, {"b": None}]},
                           ["\x00"],
                           "sha256:" + "0" * 64]


# the wheel the seed's entry holds, and its sha256 (an entry is hashed again before use)
WHEEL_BYTES = b"PK\x05\x06" + b"\0" * 18


def _kernel_entry() -> bytes:
    return (json.dumps({"key": KEY.as_dict(), "wheels": ["fixture_kernel-1.0-cp312-linux.whl"],
                        "sha256": {"fixture_kernel-1.0-cp312-linux.whl":
                                   hashlib.sha256(WHEEL_BYTES).hexdigest()},
                        "stored": "2026-01-01T00:00:00Z", "details": {"seconds": 3}},
                       indent=2, sort_keys=True) + "\n").encode()


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class Loader:
    """One state file: where it lives (under `state/` or in the checkout), a valid file,
    how it is read, and what it may raise (the project's errors naming the file)."""

    name: str
    where: str  # relative to the temporary root: state/... is the state directory
    seed: bytes = field(repr=False)
    load: Callable[[Path, Path], Any] = field(repr=False)  # (root, the file) -> its data
    format: str = "json"  # json, yaml or text: how values are mutated
    strict: bool = True  # True: errors are ConfigError naming the file; False: never any


def _journal(root: Path, path: Path) -> Any:
    state = StatePaths.at(root / "state")
    record = journal.load(state, CELL)
    assert isinstance(record, dict) and isinstance(record.get("stages", {}), dict)
    typed_record = journal.cell_record(state, CELL)
    for name in journal.STAGES:
        typed_record.stage(name)
    return record


def _metadata(root: Path, path: Path) -> Any:
    found = cached_entry(path, lambda d: typed(ReleaseMetadata, d, ("requires_dist",)))
    assert found is None or isinstance(found, ReleaseMetadata)
    return found


def _releases(root: Path, path: Path) -> Any:
    found = cached_entry(path, lambda d: typed(ReleaseList, d, ("versions",)))
    assert found is None or isinstance(found, ReleaseList)
    return found


def _kernel(root: Path, path: Path) -> Any:
    found = kernelcache.lookup(StatePaths.at(root / "state"), KEY)
    if found is not None:  # every wheel it names is a file of the entry itself
        for wheel in found.wheels:
            assert wheel.resolve().parent == path.parent.resolve(), wheel
    return found


LOADERS = [
    Loader("journal", f"state/journal/{CELL}.json",
           (TESTS / "fixtures" / "journal" / "state" / "journal" / f"{CELL}.json").read_bytes(),
           _journal, "json", strict=False),
    Loader("metadata-cache", "state/cache/metadata/vllm-0.19.0.json",
           _json({"name": "vllm", "version": "0.19.0", "wheel": "vllm-0.19.0.whl",
                  "url": "https://pypi.org/project/vllm/0.19.0/",
                  "requires_dist": ["torch==2.10.0", "xformers; platform_machine == 'x86_64'"]}),
           _metadata, "json", strict=False),
    Loader("release-list-cache", "state/cache/metadata/releases-vllm.json",
           _json({"name": "vllm", "versions": ["0.18.0", "0.19.0"],
                  "fetched_at": "2026-01-01T00:00:00Z", "url": "https://pypi.org/simple/vllm/"}),
           _releases, "json", strict=False),
    Loader("kernel-cache", f"state/cache/kernels/{KEY.slug}/{kernelcache.ENTRY_FILE}",
           _kernel_entry(), _kernel, "json", strict=False),
    Loader("locks-plan.json", "checkout/locks/plan.json", (REPO / "locks" / "plan.json")
           .read_bytes(), lambda root, path: load_snapshot(root / "checkout"), "json",
           strict=True),
    Loader("report-plan-file", "state/plan.json",
           (TESTS / "fixtures" / "journal" / "plan.json").read_bytes(),
           lambda root, path: _read_plan_file(path), "json", strict=True),
    Loader("cell-lock", f"checkout/locks/{CELL}.txt", (REPO / "locks" / f"{CELL}.txt")
           .read_bytes(), lambda root, path: read_lock_text(path, CELL), "text", strict=True),
    Loader("images.lock", "checkout/images.lock", (REPO / "images.lock").read_bytes(),
           lambda root, path: read_images_lock(path), "yaml", strict=True),
]


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += _paths(value, (*prefix, i))
    return found


def _replace(data: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    data[path[0]] = _replace(data[path[0]], path[1:], value)
    return data


@st.composite
def mutated(draw: st.DrawFn, loader: Loader) -> bytes:
    if loader.format in ("json", "yaml") and draw(st.booleans()):  # a value of another type
        text = loader.seed.decode()
        data = json.loads(text) if loader.format == "json" else yaml.safe_load(text)
        for _ in range(draw(st.integers(1, 3))):
            where = draw(st.sampled_from(_paths(data)))
            value = copy.deepcopy(draw(st.sampled_from(NASTY_VALUES + [DEEP])))
            data = _replace(data, where, value)
        if loader.format == "json":
            out = json.dumps(data, indent=2)
        else:
            header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
            out = header + yaml.safe_dump(data, width=10**6)
        # nesting deeper than a recursive reader can go, put in as text
        return re.sub(rf"['\"]?{DEEP}['\"]?", "[" * 3000 + "]" * 3000, out).encode()
    lines = loader.seed.decode().splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "double", "swap", "indent", "char", "insert",
                                   "value", "truncate", "deep"]))
        line = lines[i]
        if op == "drop":
            del lines[i]
        elif op == "double":
            lines.insert(i, line)
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "indent":
            lines[i] = "  " + line
        elif op == "char" and line:
            k = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:k] + draw(st.sampled_from(NASTY_TEXT)) + line[k + 1:]
        elif op == "insert":
            lines.insert(i, draw(st.sampled_from(NASTY_TEXT)) + draw(st.text(max_size=8)) + "\n")
        elif op == "value":
            value = json.dumps(draw(st.sampled_from(NASTY_TEXT)))
            lines[i] = re.sub(r":\s.*", lambda _: ": " + value, line, count=1)
        elif op == "truncate":
            lines = lines[:i]
        elif op == "deep":
            lines.insert(i, "[" * 5000 + "\n")
    data = "".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()) and data:  # and sometimes cut in the middle of a UTF-8 sequence
        data = data[: draw(st.integers(0, len(data)))]
    return data


def _snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every file and folder under `root` but the state directory: its bytes' hash, its mode
    and its modification time."""
    found = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if relative.parts[0] == "state":
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        info = path.stat()
        found[relative.as_posix()] = (digest, info.st_mode, info.st_mtime_ns)
    return found


def _layout(root: Path, loader: Loader, data: bytes) -> Path:
    """A checkout (matrix.yaml, locks/, images.lock), its state directory, a folder outside
    both; the mutated file in its place, the seeds of the others in theirs."""
    (root / "outside").mkdir()
    (root / "outside" / "sentinel").write_text("not yours\n")
    (root / "checkout").mkdir()
    (root / "checkout" / "matrix.yaml").write_text("# a checkout's matrix\n")
    for other in LOADERS:
        target = root / other.where
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data if other is loader else other.seed)
    entry = (root / LOADERS[3].where).parent  # the kernel entry's wheel
    (entry / "fixture_kernel-1.0-cp312-linux.whl").write_bytes(WHEEL_BYTES)
    return root / loader.where


@pytest.mark.parametrize("loader", LOADERS, ids=[loader.name for loader in LOADERS])
def test_each_seed_loads(loader: Loader) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _layout(Path(tmp), loader, loader.seed)
        assert loader.load(Path(tmp), path) is not None


@pytest.mark.parametrize("loader", LOADERS, ids=[loader.name for loader in LOADERS])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_mutation_loads_or_is_a_named_error_and_nothing_outside_the_state_changes(
        loader: Loader, data: st.DataObject) -> None:
    content = data.draw(mutated(loader))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = _layout(root, loader, content)
        before = _snapshot(root)
        try:
            loader.load(root, path)
        except InfermatrixError as exc:
            assert loader.strict, f"{loader.name} raised {exc!r}; a damaged cache or journal " \
                "record is said and left out, never an error"
            assert isinstance(exc, ConfigError) and exc.exit_code == 2, repr(exc)
            assert exc.path is not None and Path(exc.path) == path, str(exc)
            assert exc.message and "Traceback" not in str(exc)
        assert _snapshot(root) == before  # the checkout and everything else: untouched
        assert (root / "outside" / "sentinel").read_text() == "not yours\n"


@pytest.mark.parametrize("wheels", [[CLIMB], ["/etc/hostname"], ["x.whl", CLIMB], ["..", "x.whl"]])
def test_a_kernel_cache_entry_never_names_a_wheel_outside_itself(wheels: list[str]) -> None:
    """What the fuzz looks for, each time: an entry.json whose wheels climb out of the entry
    (or name an absolute path) is left out, not staged into a build context."""
    loader = LOADERS[3]
    seed = json.loads(loader.seed)
    seed["wheels"] = wheels
    with tempfile.TemporaryDirectory() as tmp:
        path = _layout(Path(tmp), loader, json.dumps(seed).encode())
        (path.parent / "x.whl").write_bytes(b"PK")
        assert (path.parent / CLIMB).resolve() == (Path(tmp) / "outside" / "sentinel").resolve()
        assert loader.load(Path(tmp), path) is None
