"""Probe an OpenAI-compatible server: liveness is not enough, send real requests.

    python3 -m harness.probe --url http://127.0.0.1:8000 --fixture
    python3 -m harness.probe --url http://127.0.0.1:8000 --expect Paris

Checks, each pass/fail with a reason (stdlib only: urllib and threads):
  health        GET /health answers 200 within the timeout
  thinking_on   the reasoning is separated from the answer: `reasoning` (vLLM >= 0.3x) or
                `reasoning_content` (older vLLM, SGLang) holds text, no <think> tag in `content`
  thinking_off  chat_template_kwargs.enable_thinking=false: the text is in `content`
  greedy        temperature 0, the factual prompt; the answer is checked only for a real model
                (a fixture has random weights: its probe checks structure, not meaning)
  concurrent    N requests at once all answer; tokens/s over the batch
Prints one result line; exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

try:
    from ._result import emit, overall
except ImportError:  # pragma: no cover
    from _result import emit, overall  # type: ignore[no-redef]

THINK_TAGS = ("<think>", "</think>")
DEFAULT_PROMPT = "What is the capital of France? Answer with one word."


class ProbeError(Exception):
    """A request failed: HTTP error, refused or reset connection, malformed answer."""


@dataclass
class Reply:
    """The parts of a chat completion the checks look at."""

    content: str | None
    reasoning: str | None
    reasoning_field: str | None  # which field held the reasoning
    finish_reason: str | None
    completion_tokens: int
    elapsed_s: float

    @property
    def tokens_per_s(self) -> float | None:
        return round(self.completion_tokens / self.elapsed_s, 2) if self.elapsed_s > 0 else None


def parse_reply(body: dict[str, Any], elapsed_s: float = 0.0) -> Reply:
    """Read a /v1/chat/completions answer; accept `reasoning` or `reasoning_content`."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ProbeError(f"malformed chat completion: {json.dumps(body)[:300]}") from None
    reasoning, field = None, None
    for name in ("reasoning", "reasoning_content"):
        value = message.get(name)
        if isinstance(value, str) and value.strip():
            reasoning, field = value, name
            break
    usage = body.get("usage") or {}
    return Reply(content=message.get("content"), reasoning=reasoning, reasoning_field=field,
                 finish_reason=choice.get("finish_reason"),
                 completion_tokens=int(usage.get("completion_tokens") or 0), elapsed_s=elapsed_s)


def has_text(value: str | None) -> bool:
    return isinstance(value, str) and bool(value.strip())


def leaked_tag(text: str | None) -> str | None:
    return next((t for t in THINK_TAGS if text and t in text), None)


def check_thinking_on(reply: Reply, real_model: bool) -> dict[str, Any]:
    if not has_text(reply.reasoning):
        leak = " (it is in `content`: is the reasoning parser set?)" if has_text(reply.content) else ""
        return {"status": "fail", "reason": "thinking on: no `reasoning` or `reasoning_content` "
                                            f"in the answer{leak}"}
    tag = leaked_tag(reply.content)
    if tag:
        return {"status": "fail", "reason": f"thinking on: {tag} leaked into `content`"}
    if real_model and reply.finish_reason == "stop" and not has_text(reply.content):
        return {"status": "fail", "reason": "thinking on: the model stopped without an answer "
                                            "in `content`"}
    return {"status": "pass", "reasoning_field": reply.reasoning_field}


def check_thinking_off(reply: Reply) -> dict[str, Any]:
    if not has_text(reply.content):
        where = f" (the text went to `{reply.reasoning_field}`)" if reply.reasoning else ""
        return {"status": "fail", "reason": f"thinking off: `content` is empty{where}"}
    tag = leaked_tag(reply.content)
    if tag:
        return {"status": "fail", "reason": f"thinking off: {tag} in `content`"}
    if has_text(reply.reasoning):
        return {"status": "fail", "reason": f"thinking off: the answer still has "
                                            f"`{reply.reasoning_field}`"}
    return {"status": "pass"}


def check_greedy(reply: Reply, expect: str | None, real_model: bool) -> dict[str, Any]:
    if not has_text(reply.content):
        return {"status": "fail", "reason": "greedy: `content` is empty"}
    if not real_model or not expect:
        return {"status": "pass", "meaning_checked": False,
                "note": "fixture model (random weights): structure checked, not the answer"}
    if expect.lower() not in (reply.content or "").lower():
        return {"status": "fail", "meaning_checked": True,
                "reason": f"greedy: expected {expect!r} in the answer, "
                          f"got {(reply.content or '')[:200]!r}"}
    return {"status": "pass", "meaning_checked": True}


@dataclass
class Client:
    """A minimal OpenAI-compatible client over urllib."""

    base_url: str
    timeout_s: float = 120.0

    def _request(self, path: str, payload: dict[str, Any] | None = None) -> tuple[int, bytes]:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url.rstrip("/") + path, data=data,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()[:1000].decode("utf-8", "replace")
            raise ProbeError(f"HTTP {exc.code} from {path}: {body}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            raise ProbeError(f"{path}: {exc}") from None

    def health(self, path: str = "/health") -> bool:
        try:
            status, _ = self._request(path)
        except ProbeError:
            return False
        return status == 200

    def model_id(self) -> str:
        _, body = self._request("/v1/models")
        try:
            return json.loads(body)["data"][0]["id"]
        except (ValueError, KeyError, IndexError) as exc:
            raise ProbeError(f"/v1/models: no model listed ({exc})") from None

    def chat(self, model: str, prompt: str, max_tokens: int, temperature: float,
             extra: dict[str, Any] | None = None) -> Reply:
        payload = {"model": model, "messages": [{"role": "user", "content": prompt}],
                   "max_tokens": max_tokens, "temperature": temperature, **(extra or {})}
        started = time.monotonic()
        _, body = self._request("/v1/chat/completions", payload)
        try:
            parsed = json.loads(body)
        except ValueError:
            raise ProbeError(f"/v1/chat/completions: not JSON: {body[:300]!r}") from None
        return parse_reply(parsed, time.monotonic() - started)


def wait_for_health(client: Client, path: str, timeout_s: float,
                    alive: Callable[[], str | None] | None = None, interval_s: float = 1.0) -> float:
    """Poll the health endpoint until 200; seconds waited. `alive` returns why the server is
    gone (then we stop waiting), or None while it runs."""
    started = time.monotonic()
    while True:
        if client.health(path):
            return round(time.monotonic() - started, 2)
        gone = alive() if alive else None
        if gone:
            raise ProbeError(f"server exited before {path} answered: {gone}")
        if time.monotonic() - started > timeout_s:
            raise ProbeError(f"{path} did not answer 200 within {timeout_s:.0f} s")
        time.sleep(interval_s)


def checked(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        result = fn()
    except ProbeError as exc:
        result = {"status": "fail", "reason": f"{name}: {exc}"}
    return {"check": name, **result, "duration_s": round(time.monotonic() - started, 3)}


@dataclass
class ProbeSettings:
    prompt: str = DEFAULT_PROMPT
    expect: str | None = "Paris"
    concurrency: int = 4
    max_tokens: int = 32
    real_model: bool = False
    health_path: str = "/health"
    health_timeout_s: float = 600.0

    def sampling(self, temperature: float = 0.0) -> dict[str, Any]:
        """Extra request fields. A fixture's random weights may pick the end token at once;
        min_tokens keeps every answer non-empty (vLLM and SGLang accept it)."""
        return {} if self.real_model else {"min_tokens": min(4, self.max_tokens)}


THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def run_concurrent(client: Client, model: str, s: ProbeSettings) -> dict[str, Any]:
    extra = {**THINKING_OFF, **s.sampling()}
    if not s.real_model:
        extra["ignore_eos"] = True  # every request makes max_tokens tokens: comparable tokens/s
    prompts = [f"{s.prompt} ({i})" for i in range(s.concurrency)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=s.concurrency) as pool:
        futures = [pool.submit(client.chat, model, p, s.max_tokens, 0.0, extra) for p in prompts]
        replies, errors = [], []
        for future in futures:
            try:
                replies.append(future.result())
            except ProbeError as exc:
                errors.append(str(exc))
    wall = time.monotonic() - started
    tokens = sum(r.completion_tokens for r in replies)
    result = {"requests": s.concurrency, "answered": len(replies), "completion_tokens": tokens,
              "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2) if wall else None}
    empty = [r for r in replies if r.completion_tokens == 0]
    if errors or empty:
        reason = errors[0] if errors else f"{len(empty)} answers had no tokens"
        return {**result, "status": "fail", "reason": f"concurrent: {reason}"}
    return {**result, "status": "pass"}


def run_probe(client: Client, s: ProbeSettings,
              alive: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """Every check in order; stops at the first failing request-level error of health."""
    started = time.monotonic()
    result: dict[str, Any] = {"check": "model", "real_model": s.real_model}
    try:
        result["health_wait_s"] = wait_for_health(client, s.health_path, s.health_timeout_s, alive)
        model = result["model"] = client.model_id()
    except ProbeError as exc:
        result.update(status="fail", reason=f"health: {exc}", checks=[],
                      duration_s=round(time.monotonic() - started, 3))
        return result
    thinking_budget = s.max_tokens if not s.real_model else max(s.max_tokens, 1024)
    checks = [
        checked("thinking_on", lambda: check_thinking_on(
            client.chat(model, s.prompt, thinking_budget, 0.0, s.sampling()), s.real_model)),
        checked("thinking_off", lambda: check_thinking_off(
            client.chat(model, s.prompt, s.max_tokens, 0.0, {**THINKING_OFF, **s.sampling()}))),
    ]
    greedy_reply: list[Reply] = []

    def greedy() -> dict[str, Any]:
        reply = client.chat(model, s.prompt, s.max_tokens, 0.0, {**THINKING_OFF, **s.sampling()})
        greedy_reply.append(reply)
        return {**check_greedy(reply, s.expect, s.real_model),
                "answer": (reply.content or "")[:200], "tokens_per_s": reply.tokens_per_s}

    checks.append(checked("greedy", greedy))
    checks.append(checked("concurrent", lambda: run_concurrent(client, model, s)))
    result["checks"] = checks
    result["status"] = overall(checks)
    failed = [c for c in checks if c["status"] == "fail"]
    if failed:
        result["reason"] = "; ".join(c["reason"] for c in failed)
    concurrent = next(c for c in checks if c["check"] == "concurrent")
    result["tokens_per_s"] = {
        "single": greedy_reply[0].tokens_per_s if greedy_reply else None,
        "concurrent": concurrent.get("tokens_per_s"),
    }
    result["duration_s"] = round(time.monotonic() - started, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--health-path", default="/health")
    parser.add_argument("--health-timeout", type=float, default=600.0, metavar="SECONDS")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--expect", default="Paris")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--fixture", dest="real", action="store_false",
                      help="random-weight fixture: check structure, not meaning (default)")
    kind.add_argument("--real", dest="real", action="store_true",
                      help="a real model: also check the greedy answer")
    args = parser.parse_args(argv)
    settings = ProbeSettings(prompt=args.prompt, expect=args.expect, concurrency=args.concurrency,
                             max_tokens=args.max_tokens, real_model=args.real,
                             health_path=args.health_path, health_timeout_s=args.health_timeout)
    return emit(run_probe(Client(args.url), settings))


if __name__ == "__main__":
    sys.exit(main())
