"""`infermatrix generate`: answer a JSONL of prompts over a deployment's replicas, resumably."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..errors import Interrupted, UsageError
from ..job import generate


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "generate", help="answer a JSONL of prompts over the replicas of a deployment",
        description="Send every prompt of --prompts (JSONL: {\"id\", \"prompt\"} or {\"id\", "
        "\"messages\"}, optional \"thinking\", \"max_tokens\", \"temperature\", \"top_p\", "
        "\"top_k\", \"min_p\", \"presence_penalty\") to the OpenAI-compatible replicas of an "
        "`infermatrix deploy` directory, least outstanding work first, and append each answer "
        "(its `content` and its `reasoning` apart, with the sampling it was asked with) to "
        "--out as one JSON line keyed by id. Before the first request it prints what it will "
        "ask with and where each default came from: max tokens (the context left after each "
        "prompt, from the server's /v1/models and /tokenize, capped by the model card's output "
        "length for thinking), sampling per thinking mode (the model directory's "
        "generation_config.json, else the model card; never greedy by default), and requests "
        "in flight per replica (the sequence limit the deployment set, else what the server "
        "reports). A prompt longer than the context is refused before the run. An answer cut "
        "at max_tokens (finish_reason length) is never counted as answered silently "
        "(--on-truncate), nor is an answer with nothing after its thinking. A replica that "
        "fails its health check is taken out and its requests are asked elsewhere; a rerun "
        "skips the ids already in --out. Exit 0 when every prompt is answered, 1 when some "
        "failed (truncated or empty included), 2 for bad input, 128+N on signal N (130 "
        "Ctrl-C, 143 SIGTERM, 129 a closed terminal: rerun to resume; `setsid nohup` keeps a "
        "long run going when the terminal closes).")
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
    parser.add_argument("--model-dir", type=Path, default=None, metavar="DIR",
                        help="the model's directory, for its generation_config.json and "
                        "card (default: the one the deployment mounts)")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help="most tokens per answer, thinking included (default: the context "
                        "left after each prompt, at most the model card's output length, "
                        "e.g. 32768 for Qwen3 thinking)")
    parser.add_argument("--on-truncate", choices=generate.TRUNCATE_POLICIES,
                        default=generate.DEFAULT_ON_TRUNCATE,
                        help="an answer cut at max_tokens: ask again with twice the room, up "
                        "to the context (retry-longer, the default; still cut: failed), write "
                        "it marked `truncated: true` (keep), or fail it (fail)")
    for flag, kind in (("--temperature", float), ("--top-p", float), ("--top-k", int),
                       ("--min-p", float), ("--presence-penalty", float)):
        parser.add_argument(flag, type=kind, default=None,
                            help="overrides the model's default for every prompt (default: "
                            "generation_config.json, else the model card, per thinking mode)")
    parser.add_argument("--thinking", choices=("on", "off"), default=None,
                        help="chat_template_kwargs.enable_thinking for prompts that do not "
                        "set `thinking` (default: the chat template's)")
    parser.add_argument("--concurrency", type=int, default=None, metavar="N",
                        help="requests in flight per replica (default: the sequence limit the "
                        "deployment set, --max-num-seqs, else what the server reports it holds)")
    parser.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                        help="seconds without a byte from the server before a request is "
                        "asked elsewhere (default 600)")
    parser.add_argument("--request-deadline", type=float, default=None, metavar="S",
                        help="seconds for a whole answer before it is asked elsewhere "
                        "(default: none; a server that streams past max_tokens is cut off)")
    parser.add_argument("--wait-healthy", type=float, default=900.0, metavar="S",
                        help="give up when no replica is healthy for this long (default 900)")
    parser.set_defaults(func=run_generate)


def endpoints_of(args: argparse.Namespace) -> list[generate.ServerEndpoint]:
    if args.deployment is not None:
        check_deployment(args.deployment)
        return generate.deployment_endpoints(args.deployment)
    return generate.explicit_endpoints(args.endpoint)


def sampling_of(args: argparse.Namespace) -> dict[str, float | int]:
    given = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
             "min_p": args.min_p, "presence_penalty": args.presence_penalty}
    return {k: v for k, v in given.items() if v is not None}


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
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UsageError(f"--max-tokens {args.max_tokens}: at least 1")
    if args.concurrency is not None and args.concurrency < 1:
        raise UsageError(f"--concurrency {args.concurrency}: at least 1 per replica")
    return generate.BatchSettings(
        model=args.model, max_tokens=args.max_tokens, sampling=sampling_of(args),
        thinking=None if args.thinking is None else args.thinking == "on",
        concurrency=args.concurrency, on_truncate=args.on_truncate,
        request_timeout_s=args.request_timeout, request_deadline_s=args.request_deadline,
        wait_healthy_s=args.wait_healthy)


def check_paths(prompts: Path, out: Path) -> None:
    """The prompt file is never the output (an append would feed answers back as prompts)."""
    if prompts.resolve() == out.resolve() or (out.exists() and prompts.exists()
                                              and os.path.samefile(prompts, out)):
        raise UsageError(f"--out {out} is the --prompts file; give another --out")


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def progress_line(state: generate.Progress, now: float) -> str:
    rates = state.tokens_per_s(now)
    per = ", ".join(f"{r.name} {'up' if r.healthy else 'OUT'} {r.answered} "
                    f"{rates[r.name]:.0f} tok/s" for r in state.replicas)
    return (f"{state.done}/{state.total}, {sum(rates.values()):.0f} tok/s, ETA "
            f"{eta_text(state.eta_s(now))}; truncated {state.truncated}, empty {state.empty}, "
            f"failed {state.failed}; {per}")


class PlainProgress:
    """A line every few seconds when stderr is not a terminal (CI logs, pipes)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s, self.last = every_s, 0.0
        self.shown: tuple[int, int] | None = None

    def __call__(self, state: generate.Progress) -> None:
        now = time.monotonic()
        if (now - self.last < self.every_s and state.done < state.total) or \
                self.shown == (state.done, state.total):
            return
        self.last, self.shown = now, (state.done, state.total)
        print(f"generate: {progress_line(state, now)}", file=sys.stderr, flush=True)


def run_generate(args: argparse.Namespace) -> int:
    from ..stages.smoke import sigterm_as_interrupt

    check_paths(args.prompts, args.out)
    endpoints = endpoints_of(args)
    prompts = generate.read_prompts(args.prompts)
    settings = settings_of(args)
    lock = generate.lock_output(args.out)
    try:
        with sigterm_as_interrupt():
            done = generate.answered_ids(args.out)
            todo = [p for p in prompts if p.id not in done]
            print(f"generate: {len(prompts)} prompts ({len(done)} already in {args.out}) over "
                  f"{len(endpoints)} replica(s): "
                  + ", ".join(f"{e.name} {e.url}" for e in endpoints), file=sys.stderr)
            record = generate.deployment_record(args.deployment)
            print(f"generate: {generate.run_forecast(record, len(todo), len(endpoints))}",
                  file=sys.stderr)
            run = generate.resolve_defaults(endpoints, todo, settings, args.model_dir)
            for line in run.describe(settings):
                print(f"generate: {line}", file=sys.stderr)
            with progress_display() as progress:
                result = generate.run_batch(endpoints, prompts, settings, args.out, progress,
                                            run=run)
    except KeyboardInterrupt as exc:
        done_now = len(generate.answered_ids(args.out))
        print(f"infermatrix generate: interrupted; {done_now} answers are in {args.out}, rerun "
              "the same command to ask the rest", file=sys.stderr)
        return exc.exit_code if isinstance(exc, Interrupted) else 130
    finally:
        lock.close()
    print(result.summary())
    predicted = record.get("predicted_tokens_per_s_per_replica")
    if isinstance(predicted, (int, float)) and result.wall_s > 0 and endpoints:
        measured = result.completion_tokens / result.wall_s / len(endpoints)
        print(f"generate: measured {measured:.1f} output tokens/s per replica against the "
              f"predicted {predicted:.1f} (ratio {measured / predicted:.2f})", file=sys.stderr)
    for prompt_id, reason in list(result.failed.items())[:10]:
        print(f"failed: {prompt_id}: {reason}", file=sys.stderr)
    return 1 if result.failed else 0


class progress_display:
    """A rich progress bar with tokens/s and ETA on a terminal, plain lines otherwise."""

    def __enter__(self) -> generate.GenerateProgress:
        if not sys.stderr.isatty():
            return PlainProgress()
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.bar = Progress(TextColumn("generate"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[line]}"), console=Console(stderr=True))
        self.bar.start()
        self.task = self.bar.add_task("generate", total=None, line="")

        def update(state: generate.Progress) -> None:
            self.bar.update(self.task, completed=state.done, total=state.total,
                            line=progress_line(state, time.monotonic()))
        return update

    def __exit__(self, *exc: object) -> None:
        if hasattr(self, "bar"):
            self.bar.stop()
