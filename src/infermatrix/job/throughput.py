"""The throughput level: a bounded, closed-loop load over N replicas, and its figures.

Each point of the sweep keeps exactly `concurrency` requests in flight per replica (a slot is
refilled when its answer ends: closed loop) through the batch client of job/generate.py
(least outstanding work, health take-out), until `requests` answers or `max_s` seconds. The
sweep: thinking on and off x the concurrencies per replica, on all N replicas; then the same
load on 1..N replicas (scaling). Per point: output tokens/s in total and per replica, time to
first token and inter-token latency p50/p95 (streamed), errors. The load targets loopback only.

`per_replica_tokens_per_s` (the best total over N replicas, divided by N) is the figure per
GPU that cells are compared by and `tag_policy.throughput.min_tokens_per_s_per_gpu` checks.
No Docker here: the smoke level (stages/smoke.py) and bench/throughput.py start the replicas.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ServerNotReady, UsageError
from . import generate

BUNDLED_PROMPTS = "throughput_prompts.jsonl"
DEFAULTS: dict[str, Any] = {"replicas": 2, "concurrency": [1, 4], "thinking": [True, False],
                            "requests": 16, "max_tokens": 64, "max_s": 120.0}


@dataclass
class LoadSettings:
    replicas: int = DEFAULTS["replicas"]  # N: the smoke level starts this many
    concurrency: list[int] = field(default_factory=lambda: list(DEFAULTS["concurrency"]))
    thinking: list[bool] = field(default_factory=lambda: list(DEFAULTS["thinking"]))
    requests: int = DEFAULTS["requests"]  # answers per point, per replica
    max_tokens: int = DEFAULTS["max_tokens"]
    max_s: float = DEFAULTS["max_s"]  # per point: nothing new is asked after this
    prompts: Path | None = None  # a user's JSONL; None: the bundled set
    model: str | None = None

    @classmethod
    def from_matrix(cls, section: dict[str, Any] | None, **overrides: Any) -> LoadSettings:
        """matrix.yaml `smoke.throughput` (schema-checked), then explicit overrides."""
        values = {**DEFAULTS, **(section or {}), **{k: v for k, v in overrides.items()
                                                    if v is not None}}
        prompts = values.get("prompts")
        return cls(int(values["replicas"]), [int(c) for c in values["concurrency"]],
                   [bool(t) for t in values["thinking"]], int(values["requests"]),
                   int(values["max_tokens"]), float(values["max_s"]),
                   Path(prompts) if prompts else None, values.get("model"))


def load_prompts(path: Path | None) -> list[generate.Prompt]:
    """A user's JSONL (generate's format) or the bundled small set."""
    if path is not None:
        return generate.read_prompts(path)
    bundled = resources.files("infermatrix.data").joinpath(BUNDLED_PROMPTS)
    with resources.as_file(bundled) as file:
        return generate.read_prompts(Path(file))


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def point_figures(result: generate.BatchResult, replicas: list[str]) -> dict[str, Any]:
    """Tokens/s, TTFT and ITL of one point, from its streamed replies."""
    replies = result.completions
    if replies:
        wall = max(r.started_at + r.elapsed_s for _, r in replies) - \
            min(r.started_at for _, r in replies)
    else:
        wall = result.wall_s
    tokens = sum(r.completion_tokens for _, r in replies)
    per_replica = {name: sum(r.completion_tokens for n, r in replies if n == name)
                   for name in replicas}
    ttft = [r.ttft_s for _, r in replies if r.ttft_s is not None]
    itl = [gap for _, r in replies for gap in r.itl_s]
    def rate(t: float) -> float:
        return round(t / wall, 2) if wall > 0 else 0.0

    return {"requests": len(replies), "errors": len(result.failed),
            "error_examples": list(result.failed.values())[:3],
            "completion_tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": rate(tokens),
            "tokens_per_s_per_replica": {n: rate(t) for n, t in per_replica.items()},
            "ttft_ms": {"p50": ms(percentile(ttft, 50)), "p95": ms(percentile(ttft, 95))},
            "itl_ms": {"p50": ms(percentile(itl, 50)), "p95": ms(percentile(itl, 95))}}


def prompts_for(pool: list[generate.Prompt], count: int, thinking: bool,
                tag: str) -> list[generate.Prompt]:
    """`count` prompts cycled from the pool, ids unique per point, thinking set."""
    return [generate.Prompt(f"{tag}-{n}-{pool[n % len(pool)].id}", pool[n % len(pool)].messages,
                            thinking, pool[n % len(pool)].max_tokens) for n in range(count)]


def run_point(endpoints: list[generate.ServerEndpoint], pool: list[generate.Prompt],
              settings: LoadSettings, concurrency: int, thinking: bool) -> dict[str, Any]:
    count = settings.requests * len(endpoints)
    tag = f"r{len(endpoints)}c{concurrency}{'t' if thinking else 'n'}"
    # short answers on purpose: a cut answer is a measured one here (on_truncate keep)
    batch = generate.BatchSettings(model=settings.model, max_tokens=settings.max_tokens,
                                   sampling={"temperature": 0.0}, on_truncate="keep",
                                   concurrency=concurrency, request_timeout_s=settings.max_s,
                                   wait_healthy_s=60.0, stop_after_s=settings.max_s,
                                   max_attempts=2)
    result = generate.run_batch(endpoints, prompts_for(pool, count, thinking, tag), batch,
                                resolve=False)
    figures = point_figures(result, [e.name for e in endpoints])
    return {"replicas": len(endpoints), "concurrency": concurrency, "thinking": thinking,
            "unasked": result.unasked, **figures}


def check_loopback(endpoints: list[generate.ServerEndpoint]) -> None:
    import urllib.parse

    for endpoint in endpoints:
        host = urllib.parse.urlparse(endpoint.url).hostname or ""
        if not generate.is_loopback(host):
            raise UsageError(f"the throughput load targets loopback only; {endpoint.name} is "
                             f"{endpoint.url}")


def wait_all_healthy(endpoints: list[generate.ServerEndpoint], timeout_s: float,
                     alive: Any = None) -> float:
    """Seconds until every replica's health route answers 200 (the load needs all N)."""
    started = time.monotonic()
    waiting = list(endpoints)
    while waiting:
        waiting = [e for e in waiting if not generate.healthy(e)]
        if not waiting:
            break
        gone = alive() if alive else None
        if gone:
            raise ServerNotReady(f"a replica exited before it was healthy: {gone}")
        if time.monotonic() - started > timeout_s:
            raise ServerNotReady("not healthy within %.0f s: %s" % (
                timeout_s, ", ".join(f"{e.name} {e.url}{e.health}" for e in waiting)))
        time.sleep(1.0)
    return round(time.monotonic() - started, 2)


def warm_up(endpoints: list[generate.ServerEndpoint], pool: list[generate.Prompt],
            settings: LoadSettings) -> None:
    """Two short requests per replica, not counted: a server's first requests are slow."""
    short = LoadSettings(requests=2, max_tokens=4, max_s=settings.max_s, model=settings.model)
    for endpoint in endpoints:
        run_point([endpoint], pool, short, 1, False)


def measure(endpoints: list[generate.ServerEndpoint], settings: LoadSettings) -> dict[str, Any]:
    """The sweep on all replicas, then scaling 1..N at the top concurrency; the figures."""
    check_loopback(endpoints)
    pool = load_prompts(settings.prompts)
    warm_up(endpoints, pool, settings)
    points = [run_point(endpoints, pool, settings, c, t)
              for t in settings.thinking for c in settings.concurrency]
    top, first_mode = max(settings.concurrency), settings.thinking[0]
    scaling = []
    for n in range(1, len(endpoints) + 1):
        if n == len(endpoints):
            same = next(p for p in points if p["concurrency"] == top and p["thinking"] ==
                        first_mode)
        else:
            same = run_point(endpoints[:n], pool, settings, top, first_mode)
        scaling.append({"replicas": n, "concurrency": top, "thinking": first_mode,
                        "tokens_per_s": same["tokens_per_s"], "errors": same["errors"]})
    return summarize(points, scaling, len(endpoints), settings)


def summarize(points: list[dict[str, Any]], scaling: list[dict[str, Any]], replicas: int,
              settings: LoadSettings) -> dict[str, Any]:
    best = max(points, key=lambda p: p["tokens_per_s"])
    one = scaling[0]["tokens_per_s"] if scaling else 0.0
    errors = sum(p["errors"] for p in points) + sum(s["errors"] for s in scaling[:-1])
    return {"replicas": replicas, "points": points, "scaling": scaling,
            "scaling_ratio": round(scaling[-1]["tokens_per_s"] / one, 3) if one else None,
            "tokens_per_s": best["tokens_per_s"],
            "per_replica_tokens_per_s": round(best["tokens_per_s"] / replicas, 2),
            "errors": errors, "max_tokens": settings.max_tokens,
            "prompts": str(settings.prompts) if settings.prompts else f"bundled "
                                                                      f"({BUNDLED_PROMPTS})"}


def verdict(figures: dict[str, Any]) -> tuple[str, str | None]:
    """pass, or fail with why: every point answered, no errors."""
    empty = [p for p in figures["points"] if p["requests"] == 0]
    if empty:
        p = empty[0]
        return "fail", (f"no answer at {p['replicas']} replica(s), concurrency "
                        f"{p['concurrency']}: {'; '.join(p['error_examples']) or 'no request'}")
    if figures["errors"]:
        examples = [e for p in figures["points"] for e in p["error_examples"]][:2]
        return "fail", f"{figures['errors']} request(s) failed: {'; '.join(examples)}"
    return "pass", None
