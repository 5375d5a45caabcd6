"""`infermatrix capacity`: for a GPU class, a model and a workload, how many sequences fit, the
bandwidth-bound decode ceiling in output tokens/s per GPU, the hours for N prompts over R
replicas and which serve profile reaches a target, with the arithmetic shown (model/capacity.py,
data/capacity.yaml)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..options import positive_int

if TYPE_CHECKING:
    from ..model.capacity import Estimate, Step


def _tokens(text: str) -> int:
    """`8192`, `8k`, `32K`: a token count."""
    raw = text.strip().lower()
    scale = 1024 if raw.endswith("k") else 1
    try:
        value = int(raw[:-1] if scale != 1 else raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count (e.g. 8192 or 8k)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a token count is not negative")
    return value


def _number(accepts: Callable[[float], bool], hint: str) -> Callable[[str], float]:
    """An argparse type: a number that `accepts` takes, else an error ending in `hint`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number")
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"{text!r}: {hint}")
        return value
    return parse


_fraction = _number(lambda value: 0 < value <= 1, "give a fraction in (0, 1]")
_rate = _number(lambda value: value > 0, "give a positive tokens/s")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "capacity", help="sequences, tokens/s and hours a GPU gives a model, per profile",
        description="Answer before any GPU-hour: on one GPU of a class, at this context and "
        "output length, how many sequences fit (memory left after the weights and the engine's "
        "reserve, over the KV cache and Gated DeltaNet state of one sequence), the "
        "bandwidth-bound decode ceiling in output tokens/s per GPU at that batch, the hours for "
        "N prompts over R replicas, and which serve profile reaches a target. Figures and "
        "their sources: data/capacity.yaml; the arithmetic: docs/capacity.md.")
    parser.add_argument("--gpu", required=True, metavar="CLASS",
                        help="GPU class: rtx-pro-6000, gb10, h100, h200")
    parser.add_argument("--model", default="qwen3.6-27b", metavar="NAME",
                        help="model shape (default: qwen3.6-27b)")
    parser.add_argument("--context", type=_tokens, required=True, metavar="TOKENS",
                        help="prompt tokens per sequence (8192 or 8k)")
    parser.add_argument("--output-tokens", type=_tokens, required=True, metavar="TOKENS",
                        help="output tokens per sequence, thinking included; a sequence holds "
                             "context + output tokens, a decode step sees on average context "
                             "+ half the output")
    parser.add_argument("--profile", default="all", metavar="NAME",
                        help="serve profile: bf16, fp8, bf16-kv-fp8 or all (default: all)")
    parser.add_argument("--prompts", type=positive_int, default=None, metavar="N",
                        help="prompts of the job: prints the hours it takes")
    parser.add_argument("--replicas", type=positive_int, default=1, metavar="N",
                        help="servers, one per GPU (default: 1)")
    parser.add_argument("--target", type=_rate, default=None, metavar="TOKS",
                        help="output tokens/s per GPU wanted: names the profiles that reach it")
    parser.add_argument("--batch", type=positive_int, default=None, metavar="N",
                        help="decode batch for the ceiling (default: the most that fit)")
    parser.add_argument("--efficiency", type=_fraction, default=None, metavar="FRACTION",
                        help="share of peak bandwidth reached (default: learned from measured "
                             "runs in the state directory, else data/capacity.yaml's)")
    parser.add_argument("--state-dir", type=Path, default=Path(".state"), metavar="DIR",
                        help="where learned efficiencies are read (default: ./.state)")
    parser.add_argument("--explain", action="store_true",
                        help="print every step of the arithmetic")
    parser.add_argument("--json", action="store_true", help="print the estimates as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..model import capacity

    # unknown names: exit 2 naming the choices, before any arithmetic
    capacity.gpu_class(args.gpu)
    capacity.model_shape(args.model)
    names = capacity.profile_names() if args.profile == "all" else [args.profile]
    for name in names:
        capacity.profile(name)
    if args.context + args.output_tokens < 1:
        raise UsageError("--context and --output-tokens add up to 0 tokens")
    ratios = capacity.ratios_path(args.state_dir)
    estimates = [capacity.estimate(args.gpu, name, args.context, args.output_tokens,
                                   model_key=args.model, efficiency=args.efficiency,
                                   ratios_path=ratios, batch=args.batch, prompts=args.prompts,
                                   replicas=args.replicas) for name in names]
    best = capacity.best_profile(estimates, args.target) if args.target else None
    if args.json:
        print(json.dumps({
            "estimates": [e.as_dict() for e in estimates], "target": args.target,
            "reaching_target": [e.profile.key for e in estimates
                                if args.target and e.reaches(args.target)],
            "recommended": best.profile.key if best else None}, indent=2))
        return 0
    print(render(estimates, args.target, best, args.explain))
    return 0


def render(estimates: list[Estimate], target: float | None, best: Estimate | None,
           explain: bool) -> str:
    """The table, a short arithmetic per profile (every step with `explain`), the forecast and
    the target's verdict."""
    first = estimates[0]
    lines = [f"capacity: {first.model.name} on one {first.gpu.name} ({first.gpu.arch}), "
             f"{first.context_tokens:,} prompt + {first.output_tokens:,} output tokens per "
             f"sequence",
             f"efficiency {first.ceiling.efficiency:.2f}: "
             f"{_source(first.efficiency_source, explain)}",
             ""]
    header = f"{'profile':<13}{'max seqs':>9}{'batch':>7}{'tok/s/GPU':>11}"
    if first.forecast:
        header += f"{'hours':>10}{'days':>7}"
    lines.append(header)
    for e in estimates:
        row = (f"{e.profile.key:<13}{e.sizing.max_sequences:>9,}{e.ceiling.batch:>7,}"
               f"{e.ceiling.tokens_per_s:>11,.0f}")
        if not e.sizing.max_sequences:
            row += "  not one sequence fits"
        elif e.forecast:
            row += f"{e.forecast.hours:>10,.1f}{e.forecast.days:>7,.1f}"
        lines.append(row)
    for e in estimates:
        lines += ["", f"{e.profile.key}: {e.profile.description} ({e.profile.checkpoint}"
                  + (f"; vLLM {' '.join(e.profile.vllm_flags)}" if e.profile.vllm_flags else "")
                  + ")"]
        shown = e.steps if explain else _brief(e)
        lines += [f"  {step.text()}" for step in shown]
        if e.forecast:
            lines.append(f"  {e.forecast.describe()}")
    if target:
        lines.append("")
        reaching = [e.profile.key for e in estimates if e.reaches(target)]
        if best:
            lines.append(f"target {target:,.0f} tok/s per GPU: reached by "
                         f"{', '.join(reaching)}; use {best.profile.key} "
                         f"({best.ceiling.tokens_per_s:,.0f} tok/s at batch "
                         f"{best.ceiling.batch})")
        else:
            top = max(estimates, key=lambda e: e.ceiling.tokens_per_s)
            lines.append(f"target {target:,.0f} tok/s per GPU: no profile reaches it (best: "
                         f"{top.profile.key}, {top.ceiling.tokens_per_s:,.0f} tok/s)")
    lines += ["", "a bandwidth-bound ceiling for decode only: prefill, scheduling gaps and "
              "stragglers come on top (--explain shows every step)"]
    return "\n".join(lines)


def _source(text: str, explain: bool) -> str:
    """The efficiency's source: whole with --explain, else its first clause."""
    if explain or not text.startswith("default:"):
        return text
    return "default of data/capacity.yaml, an estimate until a measured run (--explain: source)"


def _brief(e: Estimate) -> list[Step]:
    """The lines that carry the result: weights, what is left, per sequence, the count, the
    bytes of a step and the tokens/s."""
    wanted = ("weights =", "left for KV", "per sequence at", "max sequences",
              "bytes per step", "step time", "tokens/s")
    return [s for s in e.steps if s.label.startswith(wanted)]
