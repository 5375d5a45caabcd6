"""The typed details of a cell's stage outcome (issue 49): the journal's `StageRecord` holds
status, reason, duration and log; the details others read back are a `Details` each (build,
audit, smoke, tag, publish, train). `from_json` reads any recorded form (a value of another
type is the field's empty value, never an exception), `to_json` writes it back; keys no field
names are kept in `extra`. Readers read fields, not `.get(...) or {}` chains.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass, field, fields
from typing import Any, Self, Union, get_args, get_origin, get_type_hints


def text_of(value: Any) -> str | None:
    """A recorded value as text (JSON for anything that is not a string)."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, default=str)


def number_of(value: Any) -> float | None:
    """A recorded value as a number, or None (a bool is not a number here)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _read(kind: Any, value: Any) -> Any:
    """`value` as the field type `kind`; a value of another type is the type's empty value."""
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, types.UnionType):  # X | None: None for a mapping of another type
        inner = next(a for a in args if a is not type(None))
        wrong = (get_origin(inner) in (dict, list) or _is_details(inner)) and \
            not _fits(inner, value)
        return None if value is None or wrong else _read(inner, value)
    if _is_details(kind):
        return kind.from_json(value)
    if origin is dict:
        pairs = value.items() if isinstance(value, dict) else ()
        return {str(k): _read(args[1], v) for k, v in pairs if _fits(args[1], v)}
    if origin is list:
        items = value if isinstance(value, list) else []
        return [_read(args[0], v) for v in items if _fits(args[0], v)]
    if kind is str:
        return text_of(value)
    if kind is float:
        return number_of(value)
    if kind is bool:
        return value if isinstance(value, bool) else None
    return value  # Any


def _optional(kind: Any) -> bool:
    return kind is Any or type(None) in get_args(kind)


def _is_details(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, Details)


def _fits(kind: Any, value: Any) -> bool:
    """Whether a list item or a mapping's value is of its type (others are left out)."""
    if kind is Any:
        return True
    origin = get_origin(kind)
    wanted = dict if origin is dict or _is_details(kind) else origin or kind
    return isinstance(value, wanted)


def _write(value: Any) -> Any:
    if isinstance(value, Details):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _write(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_write(v) for v in value]
    return value


@dataclass
class Details:
    """What a stage recorded about a cell, typed; `extra`: every key no field names."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)
    # the keys it was read from: `to_json` writes back those (and any field set since), not
    # every field (a record keeps its shape); None: made here, every field is written
    _keys: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> Self:
        data = data if isinstance(data, dict) else {}
        known = _known(cls)
        values = {name: _read(kind, data[name]) for name, kind in known.items() if name in data}
        # a null or a wrong type where the field is never None: the field's default
        values = {k: v for k, v in values.items() if v is not None or _optional(known[k])}
        typed = cls(**values, extra={k: v for k, v in data.items() if k not in known})
        typed._keys = frozenset(data)
        return typed

    def to_json(self) -> dict[str, Any]:
        return {**{name: _write(value) for name in _known(type(self))
                   if not _empty(value := getattr(self, name))
                   or self._keys is None or name in self._keys}, **self.extra}


def _empty(value: Any) -> bool:
    return value in (None, {}, []) or isinstance(value, Details) and value == type(value)()


_KNOWN: dict[type, dict[str, Any]] = {}


def _known(cls: type) -> dict[str, Any]:
    """A details class's fields (but `extra` and `_keys`) and their types."""
    if cls not in _KNOWN:
        hints = get_type_hints(cls)
        _KNOWN[cls] = {f.name: hints[f.name] for f in fields(cls)
                       if f.name not in ("extra", "_keys")}
    return _KNOWN[cls]


@dataclass
class Check(Details):
    """An audit check (kernels, cuda-major, torch-cuda, pins, pip-check, engine-floor, ...)."""

    name: str = ""
    status: str = ""
    detail: str = ""


@dataclass
class BuildDetails(Details):
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    build_args: dict[str, Any] = field(default_factory=dict)
    secret_ids: list[str] = field(default_factory=list)
    base_images: dict[str, Any] | None = None  # None: built before builds recorded them
    log_tail: str | None = None  # a failed build's


@dataclass
class AuditDetails(Details):
    """AuditResult.as_dict(): the checks, a coverage row per object, the objects by target."""

    cell: str | None = None
    image: str | None = None
    status: str | None = None
    checks: list[Check] = field(default_factory=list)
    coverage: list[dict[str, Any]] = field(default_factory=list)  # one row per object
    uncovered: list[str] = field(default_factory=list)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)  # by target
    versions: dict[str, str] = field(default_factory=dict)
    duration_s: float | None = None


@dataclass
class Level(Details):
    """A smoke level's result (static, gpu, model, throughput, workload)."""

    status: str | None = None
    reason: str | None = None
    duration_s: float | None = None
    # the model level's {"single": .., "concurrent": ..} (a plain figure in older records);
    # the throughput and workload levels' total
    tokens_per_s: Any = None
    per_replica_tokens_per_s: float | None = None  # the throughput level's
    applicable: bool | None = None  # False: the level does not apply to the cell
    needs_gpu: bool | None = None
    # the throughput level's load points and replica scaling
    replicas: Any = None
    points: list[dict[str, Any]] = field(default_factory=list)
    scaling: list[dict[str, Any]] = field(default_factory=list)
    scaling_ratio: float | None = None
    errors: Any = None
    # the workload level's sweep (its points), soak, needle, backends seen, target, prediction
    sweep: dict[str, Any] = field(default_factory=dict)
    soak: dict[str, Any] = field(default_factory=dict)
    needle: dict[str, Any] = field(default_factory=dict)
    backends: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)
    prediction: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """What images.lock and the signed test result keep of a level."""
        return {"status": self.status, "reason": self.reason, "duration_s": self.duration_s}

    def figures(self) -> dict[str, float]:
        """The level's tokens/s figures by name ({"single": .., "concurrent": ..})."""
        if isinstance(self.tokens_per_s, dict):
            found = {str(k): number_of(v) for k, v in self.tokens_per_s.items()}
            return {k: v for k, v in found.items() if v is not None}
        number = number_of(self.tokens_per_s)
        return {} if number is None else {"tokens_per_s": number}


@dataclass
class SmokeDetails(Details):
    image_id: str | None = None
    levels: dict[str, Level] = field(default_factory=dict)
    host_gpu: Any = None
    tokens_per_s: Any = None  # the model level's
    workload: dict[str, Any] | None = None  # the workload level's headline figures


@dataclass
class TagDetails(Details):
    ref: str | None = None
    image_id: str | None = None  # the tested image
    tagged_image_id: str | None = None  # it, or a static-only image derived from it
    kind: str | None = None  # tagging.TESTED or tagging.STATIC_ONLY
    policy: dict[str, Any] | None = None


@dataclass
class Signing(Details):
    """images.lock's `signing` of a published cell."""

    signed: bool | None = None
    key: str | None = None
    verdict: str | None = None
    mode: str | None = None
    signature: dict[str, Any] = field(default_factory=dict)
    attestations: dict[str, Any] = field(default_factory=dict)
    sbom_file: str | None = None


@dataclass
class LockEntry(Details):
    """A published cell's images.lock entry, as publish recorded it."""

    cell: str | None = None
    signing: Signing | None = None  # None: published unsigned


@dataclass
class PublishDetails(Details):
    tag: str | None = None
    digest: str | None = None
    reference: str | None = None
    lock_entry: LockEntry | None = None  # what `report --merge` puts in a merged images.lock


@dataclass
class TrainDetails(Details):
    """The training image (the train target, after the serving image)."""

    image_id: str | None = None
    tag: str | None = None  # `<serving tag>-train`, where the serving image was tagged
    local_tag: str | None = None
    input_hash: str | None = None
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    coverage: dict[str, Any] = field(default_factory=dict)

