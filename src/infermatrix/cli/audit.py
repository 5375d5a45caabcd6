"""`infermatrix audit`: prove without a GPU that an image's kernels cover its arch and that the
stack inside is exactly what was pinned."""

from __future__ import annotations

import argparse
import json

from . import common_options, load_run, run_options, selection_options


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
    run_options(parser, "audit_targets", "record_audit", "wait")
    parser.add_argument("--json", action="store_true",
                        help="print the results as a JSON list instead of tables")
    parser.add_argument("--all", action="store_true", dest="all_objects",
                        help="the full tables, listing every object with GPU code")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The main job's own audit step, over the cells (or images of cells) named."""
    import dataclasses
    from collections import Counter

    from rich.console import Console

    from ..errors import UsageError
    from ..stages import run_steps, steps_named
    from ..stages.audit import images_to_audit, render
    from ..state import state_lock
    from .views import audit_lines, print_lines

    audit_run = load_run(args, quiet=args.json)
    pairs = images_to_audit(audit_run.ctx, audit_run.plans, args.refs, args.select,
                            audit_run.docker)
    twice = sorted(cell_id for cell_id, n in Counter(p.id for p, _ in pairs).items() if n > 1)
    if twice:
        raise UsageError(f"more than one image of {', '.join(twice)}: name one image per cell")
    audit_run = dataclasses.replace(audit_run, images={p.id: image for p, image in pairs})
    # read-only on the run's state (its own records under their lock): beside a run (issue 47)
    with state_lock(audit_run.ctx.state, shared=True):
        [record] = run_steps(audit_run, steps_named("audit"), ids=[p.id for p, _ in pairs])
    results = list(record.results.values())
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2, sort_keys=True))
    else:
        console = Console()
        for result in results:  # short by default; every reason with --verbose / --all
            if args.verbose or args.all_objects:
                render(result, console, all_objects=args.all_objects)
            else:
                print_lines(audit_lines(result.as_dict()), console)
    return 1 if record.failed else 0
