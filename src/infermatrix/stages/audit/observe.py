"""Observation: the objects a running server maps (the `model` smoke level calls this) and
their judgement against the loaded set."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import journal, proc
from ...engine.docker import Engine
from ...errors import StageFailure
from ...model import loadedset
from ...model.cell import Cell
from .checks import loaded_set_context
from .probe import MARKER, ImageFacts, parse_probe_output
from .result import default_targets

if TYPE_CHECKING:
    from ...context import Context

MAPS_PROBE = r"""
import importlib.metadata as md, json, os, sys
me, procs = os.getpid(), []
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    if int(pid) == me:
        continue
    try:
        with open(f"/proc/{pid}/maps") as handle:
            maps = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmd = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        continue
    paths = set()
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
            paths.add(parts[5].replace(" (deleted)", ""))
    procs.append({"pid": int(pid), "cmd": cmd[:300], "paths": sorted(paths)})
dists = {d.metadata["Name"]: d.version for d in md.distributions()}
print(sys.argv[1] + json.dumps({"processes": procs, "distributions": dists}))
"""


def server_mapped_objects(docker: Engine, container_id: str) -> dict[str, Any]:
    """/proc/<pid>/maps of every process in the server's container (the server and its
    workers), read by the image's python3 through `docker exec`."""
    from packaging.utils import canonicalize_name

    code, output = docker.exec_in_container(container_id, ["python3", "-c", MAPS_PROBE, MARKER])
    if code != 0:
        raise StageFailure(f"reading the server's /proc/<pid>/maps failed (exit {code}): "
                           + proc.tail(output, 10))
    data = parse_probe_output(output)
    objects: set[str] = set()
    outside: set[str] = set()
    processes = []
    for process in data["processes"]:
        rel = [loadedset.site_relative(p) for p in process["paths"]]
        objects.update(r for r in rel if r)
        outside.update(p for p, r in zip(process["paths"], rel) if not r)
        processes.append({"pid": process["pid"], "cmd": process["cmd"],
                          "site_objects": sum(1 for r in rel if r),
                          "other_objects": sum(1 for r in rel if not r)})
    return {"objects": sorted(objects), "other": len(outside), "processes": processes,
            "distributions": {canonicalize_name(k): v for k, v in data["distributions"].items()}}


def judge_server_maps(ctx: "Context", cell: Cell, mapped: dict[str, Any]) -> dict[str, Any]:
    """The observation against loaded.yaml and the audit recorded for the cell (its coverage
    rows): status, detail, problems, notes."""
    facts = ImageFacts("", [], mapped.get("distributions", {}), [], None, {})
    load_ctx = loaded_set_context(ctx.matrix.data, facts, cell.cuda if cell.is_gpu else None,
                                  (ctx.matrix.model or {}).get("name"))
    rows = journal.cell_record(ctx.state, cell.id).audit.coverage
    judged = loadedset.judge_mapped(mapped.get("objects", []), default_targets(cell), load_ctx,
                                    rows)
    return judged.as_dict()
