"""The `infermatrix` command line. Each command lives in cli/<command>.py with a
`register(subparsers)` function that adds its parser and sets `func=handler(args) -> int`."""

from __future__ import annotations

import sys

import _signal  # the C module: `signal` imports enum first, a window for Ctrl-C


def _interrupted_at_start(signum: int, frame: object) -> None:
    print("infermatrix: interrupted", file=sys.stderr)
    raise SystemExit(130)


# Started as the command (not imported by a library user): Ctrl-C while the modules load is a
# clean exit 130, not a KeyboardInterrupt traceback. main() puts Python's handler back.
if sys.argv[:1] == ["-m"] or sys.argv[0].endswith(("infermatrix", "infermatrix/__main__.py")):
    _signal.signal(_signal.SIGINT, _interrupted_at_start)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import traceback  # noqa: E402
from typing import TYPE_CHECKING, NoReturn  # noqa: E402

from .. import proc  # noqa: E402
from ..errors import InfermatrixError, Interrupted  # noqa: E402

if TYPE_CHECKING:  # imported where they run: the command line starts without them
    from ..context import Context
    from ..stages.steps import Run

# Modules under infermatrix.cli, in the order `--help` lists them.
COMMAND_MODULES = ["plan", "lock", "render", "base", "build", "train", "audit", "smoke", "publish",
                   "report", "pipeline", "export", "deploy", "generate", "doctor",
                   "compile_plan", "sbom", "verify", "capacity", "watch"]


def common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", default="matrix.yaml", metavar="PATH",
                        help="the matrix file (default: ./matrix.yaml)")
    parser.add_argument("--state-dir", default=None, metavar="DIR",
                        help="journal, logs and caches (default: .state/ beside the matrix)")
    parser.add_argument("--offline", action="store_true",
                        help="never reach a package index: use cached metadata only")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every command run")
    # main() reads --debug from argv itself; SUPPRESS keeps this from resetting the top level's
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the Python traceback of an error")


def selection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--select", action="append", default=[], metavar="PATTERN",
                        help="only cells whose id matches (fnmatch, {a,b} braces); repeatable")
    parser.add_argument("--skip", action="append", default=[], metavar="PATTERN",
                        help="leave out cells whose id matches; repeatable")


def wait_option(parser: argparse.ArgumentParser) -> None:
    run_options(parser, "wait")


def run_options(parser: argparse.ArgumentParser, *names: str) -> None:
    """Run options (options.OPTIONS: one declaration each, the same in every command)."""
    from ..options import add

    add(parser, *names)


def load_context(args: argparse.Namespace, log: bool = True) -> Context:
    """The context of a command (matrix, state directory, offline); with `log`, its
    external commands are logged from here on (which creates the state directory)."""
    from ..context import Context, setup_command_log

    ctx = Context.load(args.matrix, args.state_dir, args.offline)
    if log:
        setup_command_log(ctx.state, getattr(args, "verbose", False))
    return ctx


def load_run(args: argparse.Namespace, *, extra_select: list[str] | None = None,
             quiet: bool = False, lock_verdicts: bool = True) -> Run:
    """What every command starts from: the context, the plan (the lock's verdicts included,
    so no command works on a cell `plan` shows as pruned) and the resolved run options; prints
    a one-line preamble of them on stderr. Only `lock` itself plans without the verdicts of
    the last lock run (`lock_verdicts=False`): it is the step that decides them again."""
    from ..options import resolve
    from ..stages import Run, plan_cells

    from ..context import setup_command_log

    ctx = load_context(args, log=False)
    options = resolve(args, ctx.matrix.data)  # a bad option: exit 2, nothing written
    setup_command_log(ctx.state, getattr(args, "verbose", False))
    select = [*(extra_select or []), *getattr(args, "select", [])]
    skip = list(getattr(args, "skip", []))
    if lock_verdicts:
        plans = plan_cells(ctx, select, skip)
    else:
        from ..stages.plan import plan_matrix
        plans = plan_matrix(ctx, select, skip)
    run = Run(ctx, plans, options, select, skip)
    if not quiet:
        counts = {s: sum(p.status == s for p in run.plans) for s in ("planned", "pruned",
                                                                     "unresolved")}
        print(f"infermatrix {getattr(args, 'command', '')}: {ctx.matrix.path}, state "
              f"{ctx.state.root}; " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
              + f"; {options.preamble()}", file=sys.stderr)
    return run


def compile_options(parser: argparse.ArgumentParser) -> None:
    """--max-jobs / --nvcc-threads, the same in every command that compiles or plans."""
    run_options(parser, "max_jobs", "nvcc_threads")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors exit 2 with the usage line
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="infermatrix",
                     description="Build, verify and publish a matrix of LLM-inference images.")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (also after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Whatever the input, the user sees one `infermatrix: error:` line (and
    a fix) and an exit code, never a traceback, unless --debug asks for one."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    try:
        with contextlib.suppress(ValueError):  # ValueError: called outside the main thread
            for handled in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(handled, _interrupt)
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except InfermatrixError as exc:
        _show_traceback(debug)
        print(f"infermatrix: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        _show_traceback(debug)
        proc.reap_children()
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"infermatrix: interrupted ({signal.Signals(signum).name}); finished cells are "
              "kept, rerun to resume", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:  # `infermatrix plan | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return 1
    except OSError as exc:  # a disk that filled up, a path that vanished: name it plainly
        _show_traceback(debug)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"infermatrix: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug: say so in one line, the trace on request
        _show_traceback(debug)
        print(f"infermatrix: internal error: {type(exc).__name__}: {exc}"
              + ("" if debug else " (rerun with --debug for the traceback)"), file=sys.stderr)
        return 1


def _interrupt(signum: int, frame: object) -> None:
    """One path for SIGINT, SIGTERM and SIGHUP (CI cancelling, `timeout`, systemd, `docker
    stop`, a closed terminal): every running command's process group gets SIGTERM at once (so
    worker threads waiting on them return), then the main thread unwinds as for Ctrl-C."""
    proc.signal_children(signal.SIGTERM)
    raise Interrupted(signum)


def _show_traceback(debug: bool) -> None:
    if debug:
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
