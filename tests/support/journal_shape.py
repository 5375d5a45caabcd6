"""The shape of journal records (which fields, nested how), to hold the report's fixture
(tests/fixtures/journal/) to what the stages really write.

`unknown_fields(record, template)`: the field paths of `record` that `template` (a record the
real writers wrote) does not have. Maps keyed by names (kernels, versions, env, ...) compare
each value with the union of the template's values; a list, each item with the union of the
template's items (audit checks differ by check); where the template has no value or item to
compare with, nothing is checked below it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from infermatrix.journal import CellRecord


def as_record(data: dict[str, Any]) -> CellRecord:
    """A record written in its stored JSON form, read as the stages read it (typed)."""
    return CellRecord.from_json(str(data.get("cell") or "cell"), data)

# Maps whose keys are names (packages, build args, env vars, labels), not fields.
NAMED_MAPS = frozenset({"kernels", "versions", "build_args", "env", "labels", "source_urls",
                        "distributions", "base_images",
                        "dtypes"})


def union(values: list[Any]) -> Any:
    """One value with every field any of `values` has (dicts merged, lists concatenated)."""
    dicts = [v for v in values if isinstance(v, dict)]
    if dicts:
        keys = dict.fromkeys(k for d in dicts for k in d)
        return {k: union([d[k] for d in dicts if k in d]) for k in keys}
    lists = [v for v in values if isinstance(v, list)]
    if lists:
        items = [item for lst in lists for item in lst]
        return [union(items)] if items else []
    return values[0] if values else None


def unknown_fields(record: Any, template: Any, path: str = "") -> Iterator[str]:
    if isinstance(record, dict) and isinstance(template, dict):
        if path.rsplit(".", 1)[-1] in NAMED_MAPS:
            model = union(list(template.values())) if template else None
            for key, value in record.items():
                if model is not None:
                    yield from unknown_fields(value, model, f"{path}.{key}")
            return
        for key, value in record.items():
            if key not in template:
                yield f"{path}.{key}".lstrip(".")
            else:
                yield from unknown_fields(value, template[key], f"{path}.{key}")
    elif isinstance(record, list) and isinstance(template, list) and template:
        model = union(template)
        for index, item in enumerate(record):
            yield from unknown_fields(item, model, f"{path}[{index}]")


def field_paths(record: Any, path: str = "") -> set[str]:
    """Every field path of a record (named maps and list items collapsed): its shape."""
    paths: set[str] = set()
    if isinstance(record, dict):
        named = path.rsplit(".", 1)[-1] in NAMED_MAPS
        for key, value in record.items():
            child = f"{path}.{'*' if named else key}"
            paths.add(child.lstrip("."))
            paths |= field_paths(value, child)
    elif isinstance(record, list):
        for item in record:
            paths |= field_paths(item, f"{path}[]")
    return paths
