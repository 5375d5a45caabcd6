"""`infermatrix sbom CELL|IMAGE`: the CycloneDX SBOM of a built image, published or not (the
document publish attests: supplychain/sbom.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import common_options, load_context


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "sbom", help="write the CycloneDX SBOM of a built image",
        description="Write the CycloneDX 1.6 JSON document of a built cell image (validated "
        "against the CycloneDX schema): every package of the cell's lock with its hashes, the "
        "Debian packages of the image's dpkg status, the CUDA components and each compiled "
        "kernel wheel with its sdist hash, arches and compile flags. The same document "
        "`infermatrix publish` attests when it signs.")
    parser.add_argument("ref", metavar="CELL|IMAGE",
                        help="a cell id (its image from the journal) or an image reference "
                        "labelled io.infermatrix.cell")
    common_options(parser)
    parser.add_argument("--out", metavar="FILE", default=None,
                        help="where to write it ('-': stdout; default: "
                        "<state>/sbom/<cell>.cdx.json)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import journal
    from ..engine.docker import Engine
    from ..errors import StageFailure, UsageError
    from ..model.cell import Cell
    from ..model.spec import lock_path, read_lock_text
    from ..supplychain import sbom
    from ..stages.publish import cell_from_labels
    from ..supplychain.sign import write_sbom_file

    ctx = load_context(args)
    records = journal.load_records(ctx.state)
    record = records.get(args.ref)
    if record is not None:
        image = record.image_id
        if not image:
            raise UsageError(f"cell {args.ref} has no built image in the journal of "
                             f"{ctx.state.root}", fix=f"`infermatrix build --select {args.ref}`")
    else:
        image = args.ref
    docker = Engine()  # DOCKER_HOST / the current context
    info = docker.inspect_image(image)
    if info is None:
        known = ", ".join(sorted(records)) or "none"
        raise UsageError(f"{args.ref!r} is neither a built cell of {ctx.state.root} (built: "
                         f"{known}) nor an image in Docker", fix="build it or pull it first")
    try:
        cell: Cell = cell_from_labels((info.get("Config") or {}).get("Labels") or {})
    except StageFailure as exc:
        raise UsageError(f"{args.ref}: not an infermatrix image ({exc})") from None
    record = record or records.get(cell.id) or journal.CellRecord(cell.id)
    text = sbom.build_sbom(ctx, cell, info["Id"], record,
                           read_lock_text(lock_path(ctx, cell.id), cell.id), docker)
    if args.out == "-":
        sys.stdout.write(text + "\n")
        return 0
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    else:
        out = ctx.state.root / write_sbom_file(ctx.state.root, cell.id, json.loads(text))
    count = len(json.loads(text).get("components") or [])
    print(f"{out}  (CycloneDX 1.6, {cell.id}, image {info['Id']}, {count} components)")
    return 0
