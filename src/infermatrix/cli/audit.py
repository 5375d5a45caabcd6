"""`infermatrix audit`: prove without a GPU that an image's kernels cover its arch and that the
stack inside is exactly what was pinned."""

from __future__ import annotations

import argparse
import json
import sys

from . import common_options, load_run, selection_options


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "audit", help="check a built image: kernel coverage per arch, CUDA major, pins",
        description="Inspect built images without a GPU: list the cubins and PTX of every "
        "shared object with GPU code (cuobjdump on the host), decide per target arch whether "
        "it runs (NVIDIA's compatibility rules), check that one CUDA major is linked, that "
        "torch.version.cuda and the installed versions match the cell, that pip check is "
        "clean and that the engine meets the model card's floor. Exit 1 when any check fails.")
    parser.add_argument("refs", nargs="*", metavar="CELL|IMAGE",
                        help="cell ids (their image from the journal) or image references "
                        "(labelled io.infermatrix.cell); default: every built cell selected")
    common_options(parser)
    selection_options(parser)
    parser.add_argument("--target", action="append", default=[], metavar="ARCH",
                        help="GPU arch to check (sm_120, sm_121, 9.0...); repeatable; "
                        "default: the cell's arch")
    parser.add_argument("--json", action="store_true",
                        help="print the results as a JSON list instead of tables")
    parser.add_argument("--all", action="store_true", dest="all_objects",
                        help="the full tables, listing every object with GPU code")
    parser.add_argument("--no-record", action="store_true",
                        help="do not write the result to the journal")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..engine.docker import host_platform
    from ..model.tritontwin import natives_first, twin_archs_for
    from ..stages.audit import audit_cell, images_to_audit, parse_targets, render
    from .views import audit_lines, print_lines

    targets = parse_targets(args.target)  # bad arch names: exit 2 before any work
    audit_run = load_run(args, quiet=args.json)
    ctx = audit_run.ctx
    host = host_platform()
    pairs = images_to_audit(ctx, audit_run.plans, args.refs, args.select, audit_run.docker)
    order = {p.id: i for i, p in enumerate(natives_first([p for p, _ in pairs], host))}
    results = [audit_cell(ctx, plan, image, targets, record=not args.no_record,
                          twin_archs=twin_archs_for(plan, audit_run.plans, host),
                          docker=audit_run.docker)
               for plan, image in sorted(pairs, key=lambda pair: order[pair[0].id])]
    if args.json:
        json.dump([r.as_dict() for r in results], sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        console = Console()
        for result in results:  # short by default; every reason with --verbose / --all
            if args.verbose or args.all_objects:
                render(result, console, all_objects=args.all_objects)
            else:
                print_lines(audit_lines(result.as_dict()), console)
        failed = [r.cell_id for r in results if not r.passed]
        console.print(f"audit: {len(results) - len(failed)} passed, {len(failed)} failed"
                      + (f": {', '.join(failed)}" if failed else ""))
    return 1 if any(not r.passed for r in results) else 0
