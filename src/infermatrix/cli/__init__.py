"""The `infermatrix` command line. Each command lives in cli/<command>.py with a
`register(subparsers)` function that adds its parser and sets `func=handler(args) -> int`."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import InfermatrixError

# Modules under infermatrix.cli, in the order `--help` lists them.
COMMAND_MODULES = ["plan", "lock", "render", "base", "build", "audit", "smoke", "publish",
                   "report", "pipeline", "doctor", "compile_plan"]


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


def positive_int(text: str) -> int:
    """An argparse type: a whole number of 1 or more (exit 2 with the usage otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 1 or more")
    return value


def compile_options(parser: argparse.ArgumentParser) -> None:
    """--max-jobs / --nvcc-threads, the same in every command that compiles or plans."""
    parser.add_argument("--max-jobs", type=positive_int, default=None, metavar="N",
                        help="override the planned MAX_JOBS (a plan over the memory budget "
                             "is accepted with a warning giving the expected peak)")
    parser.add_argument("--nvcc-threads", type=positive_int, default=None, metavar="N",
                        help="override the planned NVCC_THREADS (default: the number of "
                             "gencode targets, 1 for a cell)")


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
