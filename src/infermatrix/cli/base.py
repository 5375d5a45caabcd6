"""`infermatrix base build [NAME...]`: make the debootstrap base images of matrix.yaml."""

from __future__ import annotations

import argparse

from . import common_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("base", help="make the base images (debootstrap, docker import)")
    sub = parser.add_subparsers(dest="base_command", metavar="ACTION")
    sub.required = True
    build = sub.add_parser("build", help="build debootstrap bases missing from the engine")
    common_options(build)
    build.add_argument("names", nargs="*", metavar="NAME",
                       help="bases.definitions keys (default: every debootstrap base)")
    build.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    build.add_argument("--timeout-min", type=float, default=30, metavar="N",
                       help="per-base time limit in minutes (default 30)")
    build.add_argument("--platform", action="append", metavar="OS/ARCH", dest="platforms",
                       help="build for this platform (repeatable; e.g. linux/arm64 for the "
                            "GB10 cells, emulated on another host); default: the engine's")
    build.set_defaults(func=run_build)
    ref = sub.add_parser("ref", help="print the exact image reference of a base")
    common_options(ref)
    ref.add_argument("name", metavar="NAME")
    ref.set_defaults(func=run_ref)


def run_build(args: argparse.Namespace) -> int:
    from ..stages import base
    from ..context import Context, setup_command_log
    from ..engine.docker import Engine
    from ..errors import UsageError

    ctx = Context.load(args.matrix, args.state_dir, args.offline)
    setup_command_log(ctx.state, args.verbose)
    names = args.names or base.debootstrap_bases(ctx.matrix)
    docker = Engine()  # this machine's: DOCKER_HOST / the current context
    for name in names:
        base.recipe_for(ctx.matrix, name)  # validate every name before building any
    for platform in args.platforms or []:
        if platform not in base.DEBIAN_ARCHITECTURES:
            raise UsageError(f"--platform {platform}: not one of "
                             f"{', '.join(sorted(base.DEBIAN_ARCHITECTURES))}")
    for name in names:
        for platform in args.platforms or [None]:
            result = base.build_base(ctx.matrix, name, ctx.state, force=args.force,
                                     timeout=args.timeout_min * 60, platform=platform,
                                     echo=lambda line: print(line, flush=True), docker=docker)
            what = "built" if result.built else "present"
            print(f"{name}{f' ({platform})' if platform else ''}: {result.ref} {what} "
                  f"({result.image_id[:19]}, {result.duration_s:.1f} s)")
    return 0


def run_ref(args: argparse.Namespace) -> int:
    from ..stages import base
    from ..context import Context

    ctx = Context.load(args.matrix, args.state_dir, args.offline)
    print(base.image_ref(ctx.matrix, args.name))
    return 0
