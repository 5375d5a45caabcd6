"""The `infermatrix` command line. Each command lives in cli/<command>.py with a
`register(subparsers)` function that adds its parser and sets `func=handler(args) -> int`."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import InfermatrixError

# Modules under infermatrix.cli, in the order `--help` lists them.
COMMAND_MODULES = ["plan", "lock", "render", "base", "build", "audit", "smoke", "publish",
                   "report", "pipeline", "doctor"]


def common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", default="matrix.yaml", metavar="PATH",
                        help="the matrix file (default: ./matrix.yaml)")
    parser.add_argument("--state-dir", default=None, metavar="DIR",
                        help="journal, logs and caches (default: .state/ beside the matrix)")
    parser.add_argument("--offline", action="store_true",
                        help="never reach a package index: use cached metadata only")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every command run")


def selection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--select", action="append", default=[], metavar="PATTERN",
                        help="only cells whose id matches (fnmatch, {a,b} braces); repeatable")
    parser.add_argument("--skip", action="append", default=[], metavar="PATTERN",
                        help="leave out cells whose id matches; repeatable")


def wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true",
                        help="wait for another run holding the state directory instead of refusing")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 2 with the usage line
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="infermatrix",
                     description="Build, verify and publish a matrix of LLM-inference images.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue  # command not written yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InfermatrixError as exc:
        print(f"infermatrix: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("infermatrix: interrupted; finished cells are kept, rerun to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
