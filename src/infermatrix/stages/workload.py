"""The workload level: the job's own shape against one server, before a cell is tagged.

The job is long sampled thinking answers at real batch, for days, one server per GPU. So,
against one running server (the smoke level starts it; `infermatrix verify` too):
  sweep     thinking on, the model's own sampling, long outputs (the context left, capped
            by the card; --max-tokens-like `max_tokens` to bound a point), at each
            concurrency up to the server's capacity: output tokens/s per GPU (one server is
            one GPU), TTFT and inter-token latency p50/p99, truncated and empty answers;
  soak      `soak_s` seconds of sustained concurrent generation over prompts that share a
            long prefix (prefix caching; MTP where the weights carry it): the server stays
            up and every answer stays well-formed (reasoning apart, no think tag in the
            answer, not empty);
  needle    a code hidden mid-way in a prompt of `needle_tokens` tokens (the server's own
            /tokenize measures it), asked back: the answer must carry it (real weights; a
            fixture's retrieval is not verifiable, said so, while the long prefill is served);
  backends  which attention and GDN backends the server ran, read from its start-up log,
            against the plan's choice: a different one fails (smoke.py reads the log);
  target    the best sweep point against the cell's target (smoke.workload.targets, per arch)
            and the last published figure of the same cell (regression margin).
The same code runs on the CPU lane with scaled-down figures (CPU_SCALE): the trained tiny
fixture, a short soak, a needle that fits its context, small concurrency.
HTTP only (job/generate.py's client); no Docker here.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import StageFailure
from ..job import generate
from ..job.throughput import percentile
from ..model import engines

DEFAULTS: dict[str, Any] = {
    "concurrency": [1, 8, 32, 64], "requests_per_slot": 1, "max_tokens": 8192,
    "point_max_s": 900.0, "soak_s": 600.0, "prefix_words": 1500, "needle_tokens": 32768,
    "targets": {}, "regression_margin": 0.10, "regression_fails": False}
# The CPU lane: the same steps, figures a 2-core machine and the tiny fixture can carry
CPU_SCALE: dict[str, Any] = {
    "concurrency": [1, 4, 8], "requests_per_slot": 2, "max_tokens": 512,
    "point_max_s": 180.0, "soak_s": 60.0, "prefix_words": 200, "needle_tokens": 2500}
SOAK_QUESTIONS = ["what is two plus two?", "name a capital city.", "count to five.",
                  "what colour is the sky?", "say hello to the world.", "name a river.",
                  "is paris in france?", "what comes after four?"]
FILLER = ("the quick brown fox jumps over the lazy dog while the river runs past the "
          "mountains and the city sleeps. ")


@dataclass
class WorkloadSettings:
    concurrency: list[int] = field(default_factory=lambda: list(DEFAULTS["concurrency"]))
    requests_per_slot: int = DEFAULTS["requests_per_slot"]  # answers per point = this x c
    max_tokens: int | None = DEFAULTS["max_tokens"]  # per sweep answer; None: the job's own
    point_max_s: float = DEFAULTS["point_max_s"]
    soak_s: float = DEFAULTS["soak_s"]
    prefix_words: int = DEFAULTS["prefix_words"]
    needle_tokens: int = DEFAULTS["needle_tokens"]
    targets: dict[str, float] = field(default_factory=dict)  # arch -> tokens/s per GPU
    regression_margin: float = DEFAULTS["regression_margin"]
    regression_fails: bool = DEFAULTS["regression_fails"]
    model_dir: Path | None = None  # for generation_config.json and the card
    real_model: bool = False  # real weights: the needle's answer is checked

    @classmethod
    def from_matrix(cls, section: dict[str, Any] | None, cpu: bool = False,
                    **overrides: Any) -> WorkloadSettings:
        """matrix.yaml `smoke.workload` (its `cpu` sub-table for the CPU lane), over the
        defaults (scaled for the CPU lane)."""
        section = dict(section or {})
        lane = section.pop("cpu", None) or {}
        values = {**DEFAULTS, **(CPU_SCALE if cpu else {}), **section,
                  **(lane if cpu else {}), **{k: v for k, v in overrides.items()
                                              if v is not None}}
        return cls(sorted({int(c) for c in values["concurrency"]}),
                   int(values["requests_per_slot"]),
                   None if values["max_tokens"] is None else int(values["max_tokens"]),
                   float(values["point_max_s"]), float(values["soak_s"]),
                   int(values["prefix_words"]), int(values["needle_tokens"]),
                   {str(k): float(v) for k, v in (values.get("targets") or {}).items()},
                   float(values["regression_margin"]), bool(values["regression_fails"]),
                   overrides.get("model_dir"), bool(overrides.get("real_model")))


# --- prompts --------------------------------------------------------------------------------

def job_prompts(tag: str, count: int, prefix: str = "") -> list[generate.Prompt]:
    """`count` thinking-on prompts, ids unique per step; `prefix`: a shared system prompt."""
    prompts = []
    for n in range(count):
        messages = ([{"role": "system", "content": prefix}] if prefix else []) + \
            [{"role": "user", "content": SOAK_QUESTIONS[n % len(SOAK_QUESTIONS)]}]
        prompts.append(generate.Prompt(f"{tag}-{n}", messages, True))
    return prompts


def shared_prefix(words: int) -> str:
    base = FILLER.split()
    return "you answer short questions. context: " + " ".join(
        base[i % len(base)] for i in range(words))


def needle_prompt(filler_words: int, code: str) -> generate.Prompt:
    base = FILLER.split()
    half = filler_words // 2
    hay = [base[i % len(base)] for i in range(filler_words)]
    text = " ".join(hay[:half]) + f" the secret code is {code}. " + " ".join(hay[half:])
    question = "what is the secret code? answer with the code only."
    return generate.Prompt("needle", [{"role": "user", "content": f"{text}\n\n{question}"}],
                           False, 64)


# --- one batch, judged ------------------------------------------------------------------------

def well_formed(reply: generate.Completion) -> str | None:
    """Why an answer is malformed, or None: reasoning apart from the answer, no think tag
    in the answer, something after the thinking."""
    if "<think>" in reply.content or "</think>" in reply.content:
        return "a think tag in the answer (the reasoning parser did not split it)"
    if reply.finish_reason != "length" and not reply.content.strip():
        return generate.EMPTY_ANSWER
    return None


def batch_figures(result: generate.BatchResult) -> dict[str, Any]:
    replies = [r for _, r in result.completions]
    if replies:
        wall = max(r.started_at + r.elapsed_s for r in replies) - min(r.started_at
                                                                      for r in replies)
    else:
        wall = result.wall_s
    tokens = sum(r.completion_tokens for r in replies)
    ttft = [r.ttft_s for r in replies if r.ttft_s is not None]
    itl = [g for r in replies for g in r.itl_s]
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 1)

    malformed = [why for why in (well_formed(r) for r in replies) if why]
    return {"requests": len(replies), "errors": len(result.failed),
            "error_examples": list(result.failed.values())[:3],
            "truncated": result.truncated_kept, "empty": result.empty,
            "malformed": len(malformed), "malformed_examples": malformed[:3],
            "completion_tokens": tokens, "wall_s": round(wall, 3),
            "mean_output_tokens": round(tokens / len(replies), 1) if replies else 0.0,
            "mean_prompt_tokens": round(sum(r.prompt_tokens for r in replies) / len(replies), 1)
            if replies else 0.0,
            "tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
            "ttft_ms": {"p50": ms(percentile(ttft, 50)), "p99": ms(percentile(ttft, 99))},
            "itl_ms": {"p50": ms(percentile(itl, 50)), "p99": ms(percentile(itl, 99))}}


def ask(endpoint: generate.ServerEndpoint, prompts: list[generate.Prompt],
        settings: generate.BatchSettings, model_dir: Path | None) -> generate.BatchResult:
    run = generate.resolve_defaults([endpoint], prompts, settings, model_dir)
    return generate.run_batch([endpoint], prompts, settings, run=run)


def job_settings(concurrency: int, max_tokens: int | None, max_s: float,
                 on_truncate: str = "keep") -> generate.BatchSettings:
    """The job's request settings: thinking on, the model's sampling (resolved from the
    model directory), `concurrency` in flight. A sweep point keeps a cut answer as a
    measured one (counted); the soak fails it."""
    return generate.BatchSettings(thinking=True, max_tokens=max_tokens, concurrency=concurrency,
                                  on_truncate=on_truncate, request_timeout_s=max_s,
                                  stop_after_s=max_s, wait_healthy_s=60.0, max_attempts=2)


# --- the steps ------------------------------------------------------------------------------

def capacity_of(endpoint: generate.ServerEndpoint) -> tuple[int | None, str]:
    facts = generate.read_server_facts(endpoint)
    per, why = generate.choose_concurrency([endpoint], facts, None)
    known = not why.startswith(str(generate.FALLBACK_CONCURRENCY) + ":")
    return (per[endpoint.name] if known else None), why


def sweep(endpoint: generate.ServerEndpoint, settings: WorkloadSettings) -> dict[str, Any]:
    capacity, why = capacity_of(endpoint)
    steps = [c for c in settings.concurrency if capacity is None or c <= capacity]
    if capacity is not None and capacity not in steps and capacity < max(settings.concurrency):
        steps.append(capacity)  # the top of the sweep is what the server holds
    points = []
    for concurrency in steps:
        count = concurrency * settings.requests_per_slot
        result = ask(endpoint, job_prompts(f"c{concurrency}", count),
                     job_settings(concurrency, settings.max_tokens, settings.point_max_s),
                     settings.model_dir)
        points.append({"concurrency": concurrency, "unasked": result.unasked,
                       **batch_figures(result)})
    best = max(points, key=lambda p: p["tokens_per_s"]) if points else None
    return {"capacity": capacity, "capacity_source": why, "points": points,
            "tokens_per_s": best["tokens_per_s"] if best else 0.0,
            "best_concurrency": best["concurrency"] if best else None}


def soak(endpoint: generate.ServerEndpoint, settings: WorkloadSettings, concurrency: int,
         alive: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """Sustained load for soak_s seconds: a closed loop of prompts sharing a long prefix,
    asked in rounds until the time is up (each round refills the queue)."""
    prefix = shared_prefix(settings.prefix_words)
    started = time.monotonic()
    merged = generate.BatchResult(0, 0, 0, {}, [], 0.0, [], 0)
    rounds = 0
    while time.monotonic() - started < settings.soak_s:
        left = settings.soak_s - (time.monotonic() - started)
        result = ask(endpoint, job_prompts(f"soak{rounds}", concurrency * 8, prefix),
                     job_settings(concurrency, settings.max_tokens, max(1.0, left)),
                     settings.model_dir)
        rounds += 1
        merged.completions += result.completions
        merged.failed.update(result.failed)
        merged.truncated_kept += result.truncated_kept
        merged.empty += result.empty
        if result.failed or (alive and alive()):
            break
    merged.wall_s = time.monotonic() - started
    figures = batch_figures(merged)
    gone = alive() if alive else None
    return {"seconds": round(time.monotonic() - started, 1), "target_s": settings.soak_s,
            "rounds": rounds, "concurrency": concurrency, "prefix_words": settings.prefix_words,
            "server_up": gone is None and generate.healthy(endpoint),
            "server_gone": gone, **figures}


def needle(endpoint: generate.ServerEndpoint, settings: WorkloadSettings,
           seed: int = 0) -> dict[str, Any]:
    """A code mid-way in a long prompt, sized with the server's /tokenize to needle_tokens
    (at most the context less room for the answer)."""
    facts = generate.read_server_facts(endpoint)
    room = 96
    target = settings.needle_tokens
    if facts.max_model_len:
        target = min(target, facts.max_model_len - room)
    rng = random.Random(seed)
    code = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
    words = max(16, target)  # first guess: a word a token, then scaled by the measured count
    for _ in range(4):
        prompt = needle_prompt(words, code)
        counted = generate.count_prompt_tokens(endpoint, facts.model, prompt, False)
        if counted is None or abs(counted - target) <= max(32, target // 50):
            break
        words = max(16, int(words * target / counted) - 8)
    if counted is not None and facts.max_model_len and counted >= facts.max_model_len - 8:
        words = int(words * 0.9)
        prompt = needle_prompt(words, code)
        counted = generate.count_prompt_tokens(endpoint, facts.model, prompt, False)
    settings_one = generate.BatchSettings(thinking=False, max_tokens=64, concurrency=1,
                                          on_truncate="keep", request_timeout_s=600.0,
                                          wait_healthy_s=60.0, max_attempts=1)
    result = ask(endpoint, [prompt], settings_one, settings.model_dir)
    reply = result.completions[0][1] if result.completions else None
    found = reply is not None and code in reply.content
    details: dict[str, Any] = {
        "target_tokens": target, "prompt_tokens": reply.prompt_tokens if reply else counted,
        "code": code, "answer": reply.content[:200] if reply else None,
        "errors": list(result.failed.values())[:2],
        "prefill_s": round(reply.ttft_s, 3) if reply and reply.ttft_s else None}
    if reply is None:
        return {**details, "status": "fail", "reason": f"no answer to the {target}-token "
                f"prompt: {'; '.join(details['errors']) or 'none'}"}
    if settings.real_model:
        return {**details, "status": "pass" if found else "fail",
                "reason": None if found else f"the answer does not carry the code {code}"}
    return {**details, "status": "pass", "retrieval": "not verified: fixture weights cannot "
            "retrieve; the long prefill was served and answered"}


# --- backends the server really ran ---------------------------------------------------------

# each engine's lines naming a backend (data/engines.yaml log_backends), on any server's log
BACKEND_PATTERNS = [(kind, re.compile(pattern)) for row in engines.rows().values()
                    for kind, patterns in (row.get("log_backends") or {}).items()
                    for pattern in patterns]


def backends_in_log(log: str) -> dict[str, list[str]]:
    """Backends the server's own log names, per kind, in order of first mention."""
    found: dict[str, list[str]] = {}
    for kind, pattern in BACKEND_PATTERNS:
        for match in pattern.finditer(log):
            name = match.group(1).strip().lower().replace(" ", "_")
            if name not in found.setdefault(kind, []):
                found[kind].append(name)
    return found


def normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower()).replace("attn", "").replace("attention", "")


def judge_one(kind: str, seen: list[str], planned: str | None, whose: str
              ) -> tuple[str, str | None]:
    """(status, reason) of one kind of backend: the first the log names against the plan."""
    if planned is None:
        return "skip", f"{kind}: nothing chosen to compare with"
    if not seen:
        return "skip", f"{kind}: not verified: the server's log names none ({whose} {planned})"
    if all(normal(name) == normal(planned) for name in seen):
        return "pass", None
    return "fail", (f"the server ran {kind} backend {', '.join(seen)}; {whose} {planned}")


def judge_backends(log: str, planned_attention: str | None,
                   planned_gdn: str | None = None) -> dict[str, Any]:
    """The attention backend the server ran against the plan's choice, and the GDN prefill
    backend against the audit's reading of the engine's own choice (when it made one): a
    mismatch fails; a kind with nothing to compare is said, not passed."""
    seen = backends_in_log(log)
    verdicts = {"attention": judge_one("attention", seen.get("attention") or [],
                                       planned_attention, "the plan chose"),
                "gdn": judge_one("GDN prefill", seen.get("gdn") or [], planned_gdn,
                                 "the audit read the engine choosing")}
    statuses = [status for status, _ in verdicts.values()]
    status = "fail" if "fail" in statuses else "pass" if "pass" in statuses else "skip"
    reasons = [why for st, why in verdicts.values() if why and (st == "fail" or status != "fail")]
    return {"seen": seen, "planned_attention": planned_attention, "planned_gdn": planned_gdn,
            "kinds": {k: v[0] for k, v in verdicts.items()}, "status": status,
            "reason": "; ".join(r for r in reasons if status != "pass" or "not verified" in r)
            or None}


# --- predicted against measured (the capacity model, issue 46) ------------------------------

def prediction(arch: str, sweep_figures: dict[str, Any], fixture: bool,
               ratios: Path | None) -> dict[str, Any]:
    """The capacity model's ceiling for the best sweep point (its batch, its mean prompt and
    output lengths) beside the measured figure; the ratio is kept per device class (`ratios`)
    so the model's efficiency is learned from real runs."""
    from ..model import capacity

    gpu = capacity.gpu_for_arch(arch)
    points = sweep_figures.get("points") or []
    if gpu is None or not points:
        return {"status": "none", "reason": f"no device class for {arch} in "
                "data/capacity.yaml" if gpu is None else "no sweep point"}
    best = max(points, key=lambda p: p["tokens_per_s"])
    model = "fixture-tiny" if fixture else capacity.DEFAULT_MODEL
    estimate = capacity.estimate(gpu, "bf16", max(1, int(best["mean_prompt_tokens"])),
                                 max(1, int(best["mean_output_tokens"])), model_key=model,
                                 batch=best["concurrency"], ratios_path=ratios)
    predicted = estimate.ceiling.tokens_per_s
    measured = float(best["tokens_per_s"])
    if ratios is not None and predicted > 0 and measured > 0:
        capacity.record_ratio(ratios, gpu, measured, predicted, estimate.ceiling.efficiency,
                              model=model, batch=best["concurrency"])
    return {"status": "done", "device_class": gpu, "model": model, "profile": "bf16",
            "batch": best["concurrency"], "predicted_tokens_per_s": round(predicted, 1),
            "measured_tokens_per_s": measured,
            "ratio": round(measured / predicted, 3) if predicted else None,
            "efficiency": estimate.ceiling.efficiency,
            "efficiency_source": estimate.efficiency_source}


# --- the verdict ----------------------------------------------------------------------------

def target_verdict(tokens_per_s: float, arch: str, settings: WorkloadSettings,
                   previous: float | None) -> dict[str, Any]:
    """The best sweep figure against the cell's target and the last published figure."""
    target = settings.targets.get(arch)
    out: dict[str, Any] = {"target_tokens_per_s": target, "previous_tokens_per_s": previous}
    out["below_target"] = target is not None and tokens_per_s < target
    slower = previous is not None and previous > 0 and \
        tokens_per_s < previous * (1 - settings.regression_margin)
    out["regression"] = (f"{tokens_per_s:g} tokens/s is more than "
                         f"{settings.regression_margin:.0%} under the last published "
                         f"{previous:g}") if slower else None
    return out


def verdict(figures: dict[str, Any], regression_fails: bool) -> tuple[str, str | None]:
    """pass, or fail with the first reason (sweep, soak, needle, backends, target)."""
    points = figures.get("sweep", {}).get("points") or []
    if not points or any(p["requests"] == 0 for p in points):
        empty = next((p for p in points if p["requests"] == 0), None)
        return "fail", ("sweep: no answer at concurrency "
                        f"{empty['concurrency']}: {'; '.join(empty['error_examples'])}"
                        if empty else "sweep: no point ran")
    for point in points:
        if point["errors"] or point["empty"] or point["malformed"]:
            return "fail", (f"sweep at concurrency {point['concurrency']}: {point['errors']} "
                            f"errors, {point['empty']} empty, {point['malformed']} malformed "
                            f"({'; '.join(point['error_examples'] + point['malformed_examples'])})")
    soaked = figures.get("soak") or {}
    if not soaked.get("server_up"):
        return "fail", f"soak: the server did not stay up ({soaked.get('server_gone')})"
    if soaked.get("errors") or soaked.get("empty") or soaked.get("malformed") or \
            soaked.get("truncated"):
        return "fail", (f"soak: {soaked['errors']} errors, {soaked['empty']} empty, "
                        f"{soaked['malformed']} malformed, {soaked['truncated']} truncated "
                        "answers")
    if soaked.get("requests", 0) == 0:
        return "fail", "soak: no answer"
    needled = figures.get("needle") or {}
    if needled.get("status") == "fail":
        return "fail", f"needle: {needled.get('reason')}"
    backends = figures.get("backends") or {}
    if backends.get("status") == "fail":
        return "fail", f"backend used: {backends.get('reason')}"
    target = figures.get("target") or {}
    if target.get("below_target"):
        return "fail", (f"{figures['tokens_per_s']:g} output tokens/s per GPU is under the "
                        f"target {target['target_tokens_per_s']:g}")
    if target.get("regression") and regression_fails:
        return "fail", f"regression: {target['regression']}"
    return "pass", None


def measure(endpoint: generate.ServerEndpoint, settings: WorkloadSettings,
            alive: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """Sweep, soak and needle against one running server (the backends and the target are
    judged by the caller, which has the server's log and the cell)."""
    generate.wait_until_any_healthy([endpoint], 60.0)
    figures: dict[str, Any] = {"sweep": sweep(endpoint, settings)}
    top = figures["sweep"]["best_concurrency"] or max(settings.concurrency)
    if alive and alive():
        raise StageFailure(f"the server ended during the sweep: {alive()}")
    figures["soak"] = soak(endpoint, settings, top, alive)
    figures["needle"] = needle(endpoint, settings)
    figures["tokens_per_s"] = figures["sweep"]["tokens_per_s"]
    figures["settings"] = {"concurrency": settings.concurrency, "max_tokens":
                           settings.max_tokens, "soak_s": settings.soak_s,
                           "needle_tokens": settings.needle_tokens}
    return figures


def summary(level: dict[str, Any]) -> dict[str, Any] | None:
    """The headline figures (journal, report, images.lock, the signed test result)."""
    if level.get("status") not in ("pass", "fail") or "sweep" not in level:
        return None
    points = level["sweep"].get("points") or []
    return {"status": level["status"], "tokens_per_s_per_gpu": level.get("tokens_per_s"),
            "best_concurrency": level["sweep"].get("best_concurrency"),
            "sweep": [{"concurrency": p["concurrency"], "tokens_per_s": p["tokens_per_s"],
                       "ttft_ms_p50": p["ttft_ms"]["p50"], "itl_ms_p99": p["itl_ms"]["p99"]}
                      for p in points],
            "soak_s": (level.get("soak") or {}).get("seconds"),
            "needle_tokens": (level.get("needle") or {}).get("prompt_tokens"),
            "backends": ((level.get("backends") or {}).get("seen")),
            "target": level.get("target"),
            "predicted_tokens_per_s": (level.get("prediction") or {}).get(
                "predicted_tokens_per_s")}

