"""`infermatrix watch`: engine releases newer than the committed plan, or yanked under it, each
with its age against a settle delay (stages/releasewatch.py)."""

from __future__ import annotations

import argparse
import datetime
import json

from ..errors import UsageError
from ..model.index import IndexUnavailable, NotOnIndex
from ..options import package_index
from . import common_options, load_context


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "watch", help="list engine releases newer than the committed plan, or yanked",
        description="Compare each engine's releases on the package index with the committed "
        "plan (locks/plan.json): a newer release at least --settle-days old is 'settled' (a "
        "version bump is due: `infermatrix lock` and `render`, and CI proves it), a younger one "
        "'waiting', a settled one that pins a release the index lacks 'blocked', a planned one the "
        "index yanked 'yanked'. Exit 1 when a settled or yanked "
        "release is listed, 0 when none.")
    common_options(parser)
    parser.add_argument("--settle-days", type=float, default=None, metavar="N",
                        help="how old a release must be before it is due (default 7)")
    parser.add_argument("--json", action="store_true", help="print the lines as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..stages import releasewatch
    from ..stages.plan import FactGatherer, _not_installable, default_sources
    from .plandiff import load_snapshot, plan_path

    ctx = load_context(args, log=False)
    settle = releasewatch.DEFAULT_SETTLE_DAYS if args.settle_days is None else args.settle_days
    if settle < 0:
        raise UsageError(f"--settle-days {settle:g}: a delay is 0 days or more")
    snapshot = load_snapshot(ctx.root)
    if snapshot is None:
        raise UsageError(f"no committed plan at {plan_path(ctx.root)}: run `infermatrix lock` "
                         "first (the watch compares the index with it)")
    planned = releasewatch.planned_versions(snapshot)
    cache = ctx.state.index_cache / "watch"
    releases, unreachable = {}, []
    for engine in planned:
        package = ctx.matrix.engines.get(engine, {}).get("package")
        if not package:
            continue
        try:
            releases[engine] = releasewatch.fetch_releases(cache, package, package_index(),
                                                           offline=ctx.offline)
        except (IndexUnavailable, NotOnIndex) as exc:
            unreachable.append(f"{engine}: {exc}")
    metadata, release_lists = default_sources(ctx)
    gatherer = FactGatherer(metadata)

    def why_not(engine: str, version: str) -> str | None:
        package = ctx.matrix.engines[engine]["package"]
        check = _not_installable(gatherer, release_lists, package)
        return check(version) if check else None

    now = datetime.datetime.now(datetime.timezone.utc)
    lines = releasewatch.watch(planned, releases, now, settle, why_not)
    if args.json:
        print(json.dumps({"settle_days": settle, "lines": releasewatch.as_json(lines),
                          "unreachable": unreachable}, indent=2, sort_keys=True))
    else:
        for line in lines:
            print(line.text())
        for note in unreachable:
            print(f"not checked: {note}")
        if not lines:
            print(f"no release newer than the committed plan, none yanked "
                  f"(settle delay {settle:g} days)")
    return 1 if any(line.kind in ("settled", "yanked") for line in lines) else 0
