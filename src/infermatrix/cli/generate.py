"""`infermatrix generate`: answer a JSONL of prompts over a deployment's replicas, resumably."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..errors import UsageError
from ..stages import generate


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "generate", help="answer a JSONL of prompts over the replicas of a deployment",
        description="Send every prompt of --prompts (JSONL: {\"id\", \"prompt\"} or {\"id\", "
        "\"messages\"}, optional \"thinking\", \"max_tokens\") to the OpenAI-compatible "
        "replicas of an `infermatrix deploy` directory, least outstanding work first, and "
        "append each answer to --out as one JSON line keyed by id. A replica that fails its "
        "health check is taken out and its requests are asked elsewhere; a rerun skips the ids "
        "already in --out. Exit 0 when every prompt is answered, 1 when some failed, 130 on "
        "an interrupt (rerun to resume).")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--deployment", type=Path, metavar="DIR",
                       help="a directory written by `infermatrix deploy` (its compose.yaml)")
    where.add_argument("--endpoint", action="append", metavar="URL",
                       help="a replica's base URL, e.g. http://127.0.0.1:8000; repeatable")
    parser.add_argument("--prompts", type=Path, required=True, metavar="FILE")
    parser.add_argument("--out", type=Path, required=True, metavar="FILE",
                        help="answers, JSONL; appended to, so a rerun resumes")
    parser.add_argument("--model", default=None,
                        help="the served model name (default: what /v1/models lists)")
    parser.add_argument("--max-tokens", type=int, default=generate.DEFAULT_MAX_TOKENS)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--thinking", choices=("on", "off"), default=None,
                        help="chat_template_kwargs.enable_thinking for prompts that do not "
                        "set `thinking` (default: the chat template's)")
    parser.add_argument("--concurrency", type=int, default=generate.DEFAULT_CONCURRENCY,
                        metavar="N", help="requests in flight per replica "
                        f"(default {generate.DEFAULT_CONCURRENCY})")
    parser.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                        help="seconds without a byte from the server before a request is "
                        "asked elsewhere (default 600)")
    parser.add_argument("--wait-healthy", type=float, default=900.0, metavar="S",
                        help="give up when no replica is healthy for this long (default 900)")
    parser.set_defaults(func=run_generate)


def endpoints_of(args: argparse.Namespace) -> list[generate.ServerEndpoint]:
    if args.deployment is not None:
        check_deployment(args.deployment)
        return generate.deployment_endpoints(args.deployment)
    return generate.explicit_endpoints(args.endpoint)


def check_deployment(directory: Path) -> None:
    """What `deploy` recorded in the directory (cli/deploy.py RECORD_NAME): a compose.yaml
    written from a verified statement and changed since is refused (exit 1: generate acts only
    on what the statement says); an unverified or hand-made deployment is said on stderr."""
    from ..errors import StageFailure
    from .deploy import RECORD_NAME, file_digest, written_record

    record = written_record(directory)
    compose = directory / "compose.yaml"
    if not record:
        print(f"warning: {directory} has no {RECORD_NAME}: not written by `infermatrix deploy`, "
              "so nothing says its servers run a verified image", file=sys.stderr)
        return
    where = f"{record.get('cell')} ({record.get('reference')})"
    if not record.get("verified_by"):
        print(f"warning: the deployment of {where} in {directory} is NOT VERIFIED (deploy "
              "--skip-verify)", file=sys.stderr)
        return
    wrote = (record.get("files") or {}).get("compose.yaml")
    if compose.is_file() and wrote != file_digest(compose.read_bytes()):
        raise StageFailure(f"{compose} changed since `infermatrix deploy` wrote it from the "
                           f"signed statement of {where}: generate acts only on what that "
                           "statement says", fix="write it again with `infermatrix deploy "
                           f"{record.get('cell')} --out {directory}` (move the edited file away)")


def settings_of(args: argparse.Namespace) -> generate.BatchSettings:
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens {args.max_tokens}: at least 1")
    return generate.BatchSettings(
        model=args.model, max_tokens=args.max_tokens, temperature=args.temperature,
        thinking=None if args.thinking is None else args.thinking == "on",
        concurrency=args.concurrency, request_timeout_s=args.request_timeout,
        wait_healthy_s=args.wait_healthy)


class PlainProgress:
    """A line every few seconds when stderr is not a terminal (CI logs, pipes)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s, self.started, self.last = every_s, time.monotonic(), 0.0
        self.shown: tuple[int, int] | None = None

    def __call__(self, done: int, total: int, replicas: list[generate.Replica]) -> None:
        now = time.monotonic()
        if (now - self.last < self.every_s and done < total) or self.shown == (done, total):
            return
        self.last, self.shown = now, (done, total)
        rate = done / (now - self.started) if now > self.started else 0.0
        eta = f"{(total - done) / rate:.0f} s" if rate > 0 else "?"
        up = ", ".join(f"{r.name} {'up' if r.healthy else 'OUT'} {r.answered}"
                       for r in replicas)
        print(f"generate: {done}/{total} ({rate:.1f}/s, ETA {eta}); {up}", file=sys.stderr,
              flush=True)


def run_generate(args: argparse.Namespace) -> int:
    from ..stages.smoke import sigterm_as_interrupt

    endpoints = endpoints_of(args)
    prompts = generate.read_prompts(args.prompts)
    settings = settings_of(args)
    print(f"generate: {len(prompts)} prompts over {len(endpoints)} replica(s): "
          + ", ".join(f"{e.name} {e.url}" for e in endpoints), file=sys.stderr)
    try:
        with sigterm_as_interrupt(), progress_display() as progress:
            result = generate.run_batch(endpoints, prompts, settings, args.out, progress)
    except KeyboardInterrupt:
        done = len(generate.answered_ids(args.out))
        print(f"infermatrix generate: interrupted; {done} answers are in {args.out}, rerun "
              "the same command to ask the rest", file=sys.stderr)
        return 130
    print(result.summary())
    for prompt_id, reason in list(result.failed.items())[:10]:
        print(f"failed: {prompt_id}: {reason}", file=sys.stderr)
    return 1 if result.failed else 0


class progress_display:
    """A rich progress bar with ETA on a terminal, plain lines otherwise."""

    def __enter__(self) -> generate.GenerateProgress:
        if not sys.stderr.isatty():
            return PlainProgress()
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.bar = Progress(TextColumn("generate"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                            TextColumn("{task.fields[replicas]}"),
                            console=Console(stderr=True))
        self.bar.start()
        self.task = self.bar.add_task("generate", total=None, replicas="")

        def update(done: int, total: int, replicas: list[generate.Replica]) -> None:
            up = " ".join(f"{r.name}:{r.answered}" + ("" if r.healthy else "(out)")
                          for r in replicas)
            self.bar.update(self.task, completed=done, total=total, replicas=up)
        return update

    def __exit__(self, *exc: object) -> None:
        if hasattr(self, "bar"):
            self.bar.stop()
