"""`infermatrix generate`: a balanced, resumable batch client over a deployment's replicas.

The seeds' job (hundreds of thousands of completions over one server per GPU) needs:
  - requests spread by least outstanding work: each replica has a bound on requests in flight,
    and the next prompt goes to the healthy replica with the fewest tokens still owed
    (max_tokens of its in-flight requests), so a slow replica is not handed a queue;
  - a replica that fails its health check (or whose connection breaks) is taken out, and its
    in-flight prompts are asked again elsewhere; a background check puts it back once its
    health route answers 200 again;
  - results appended as JSONL keyed by prompt id and flushed per answer, so an interrupted run
    resumes: ids already in the output are not asked again, a torn last line is dropped, and
    an answer that comes back twice (the original and its retry) is written once.
Replies are streamed (`stream_options.include_usage`), so the same client measures time to
first token and inter-token latency for the throughput level (stages/throughput.py).
HTTP over the standard library only (urllib, threads); no Docker here.
"""

from __future__ import annotations

import ipaddress
import json
import queue
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from ..errors import StageFailure, UsageError

DEFAULT_CONCURRENCY = 4  # requests in flight per replica
DEFAULT_MAX_TOKENS = 1024
DEFAULT_HEALTH = "/health"
HEALTH_INTERVAL_S = 2.0
HEALTH_TIMEOUT_S = 5.0
MAX_ATTEMPTS = 5  # per prompt; a replica going down does not count against its prompts
HEALTH_URL = re.compile(r"https?://[^/'\"\s]+(/[^'\"\s]*)")


class RequestError(Exception):
    """A chat request failed. `replica_fault`: the replica, not the prompt, is to blame
    (connection refused or reset, timeout, 5xx): the prompt is asked again elsewhere."""

    def __init__(self, message: str, replica_fault: bool = True) -> None:
        super().__init__(message)
        self.replica_fault = replica_fault


# --- inputs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, Any]]
    thinking: bool | None = None  # None: the chat template's default
    max_tokens: int | None = None


def prompt_from_record(record: Any, where: str) -> Prompt:
    """{"id", "prompt"} or {"id", "messages"}, optional "thinking" and "max_tokens"."""
    if not isinstance(record, dict):
        raise UsageError(f"{where}: a prompt is a JSON object with `id` and `prompt`")
    if record.get("id") in (None, ""):
        raise UsageError(f"{where}: the prompt has no `id` (results are keyed by it)")
    if isinstance(record.get("messages"), list) and record["messages"]:
        messages = record["messages"]
    elif isinstance(record.get("prompt"), str):
        messages = [{"role": "user", "content": record["prompt"]}]
    else:
        raise UsageError(f"{where}: give `prompt` (a string) or `messages` (a list)")
    thinking = record.get("thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise UsageError(f"{where}: `thinking` is true or false, not {thinking!r}")
    max_tokens = record.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise UsageError(f"{where}: `max_tokens` is a positive integer, not {max_tokens!r}")
    return Prompt(str(record["id"]), messages, thinking, max_tokens)


def read_prompts(path: Path) -> list[Prompt]:
    """The prompts of a JSONL file; a bad line is a usage error naming file and line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"--prompts {path}: {exc.strerror or exc}") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{where}: not JSON ({exc})") from None
        prompt = prompt_from_record(record, where)
        if prompt.id in seen:
            raise UsageError(f"{where}: prompt id {prompt.id!r} repeats line {seen[prompt.id]}; "
                             "ids key the results, so each must be unique")
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise UsageError(f"--prompts {path}: no prompts in the file")
    return prompts


@dataclass(frozen=True)
class ServerEndpoint:
    name: str
    url: str  # http://host:port
    health: str = DEFAULT_HEALTH


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def deployment_endpoints(directory: Path) -> list[ServerEndpoint]:
    """The replicas of an `infermatrix deploy` directory, from its compose.yaml: each service's
    published port (0.0.0.0 is reached over 127.0.0.1) and the health route its check asks."""
    compose = directory / "compose.yaml"
    try:
        document = yaml.safe_load(compose.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise UsageError(f"--deployment {directory}: no compose.yaml ({exc.strerror}); write "
                         "one with `infermatrix deploy`") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{compose}: not YAML ({exc})") from None
    endpoints = []
    for name, service in (document.get("services") or {}).items():
        ports = service.get("ports") or []
        if not ports:
            raise UsageError(f"{compose}: service {name} publishes no port")
        host, port, _ = str(ports[0]).rsplit(":", 2) if str(ports[0]).count(":") == 2 \
            else ("127.0.0.1", *str(ports[0]).split(":", 1))
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        test = " ".join(map(str, (service.get("healthcheck") or {}).get("test") or []))
        route = HEALTH_URL.search(test)
        endpoints.append(ServerEndpoint(name, f"http://{host}:{port}",
                                        route.group(1) if route else DEFAULT_HEALTH))
    if not endpoints:
        raise UsageError(f"{compose}: no services")
    return endpoints


def explicit_endpoints(urls: Iterable[str]) -> list[ServerEndpoint]:
    endpoints = []
    for index, url in enumerate(urls):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UsageError(f"--endpoint {url!r}: give http://HOST:PORT")
        endpoints.append(ServerEndpoint(f"endpoint{index}", f"{parsed.scheme}://{parsed.netloc}"))
    return endpoints


# --- one request ----------------------------------------------------------------------------

@dataclass
class Completion:
    content: str
    reasoning: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    elapsed_s: float
    ttft_s: float | None  # time to the first generated text (content or reasoning)
    itl_s: list[float] = field(default_factory=list)  # gaps between later text chunks
    started_at: float = 0.0  # time.monotonic() when the request was sent


def chat_payload(model: str, prompt: Prompt, max_tokens: int, temperature: float,
                 thinking: bool | None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model, "messages": prompt.messages,
        "max_tokens": prompt.max_tokens or max_tokens, "temperature": temperature,
        "stream": True, "stream_options": {"include_usage": True}}
    wanted = prompt.thinking if prompt.thinking is not None else thinking
    if wanted is not None:
        payload["chat_template_kwargs"] = {"enable_thinking": wanted}
    return payload


def read_stream(lines: Iterable[bytes], started: float,
                clock: Callable[[], float] = time.monotonic) -> Completion:
    """Assemble a streamed chat completion (server-sent `data:` lines, `[DONE]` last).
    vLLM >= 0.3x streams the thinking as `delta.reasoning`, older vLLM and SGLang as
    `delta.reasoning_content`; usage comes in a last chunk with no choices."""
    content: list[str] = []
    reasoning: list[str] = []
    finish, usage = None, {}
    first, last, gaps = None, None, []
    ended = False
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            ended = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RequestError(f"a malformed stream chunk: {data[:200]!r}") from None
        if "error" in chunk:
            raise RequestError(f"the server reported: {json.dumps(chunk['error'])[:300]}")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            thought = delta.get("reasoning") or delta.get("reasoning_content") or ""
            if text or thought:
                now = clock()
                if first is None:
                    first = now
                elif last is not None:
                    gaps.append(now - last)
                last = now
            content.append(text)
            reasoning.append(thought)
            finish = choice.get("finish_reason") or finish
    if not ended:  # the connection closed mid-answer (a replica killed): not an answer
        raise RequestError("the stream ended before [DONE]")
    finished = clock()
    return Completion("".join(content), "".join(reasoning), finish,
                      int(usage.get("prompt_tokens") or 0),
                      int(usage.get("completion_tokens") or 0), finished - started,
                      None if first is None else first - started, gaps, started)


def post_chat(url: str, payload: dict[str, Any], timeout_s: float) -> Completion:
    request = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions",
                                     data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Accept": "text/event-stream"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return read_stream(response, started)
    except urllib.error.HTTPError as exc:
        body = exc.read()[:500].decode("utf-8", "replace")
        # 4xx (but timeouts and rate limits) is the prompt's fault: asking elsewhere won't help
        prompt_fault = 400 <= exc.code < 500 and exc.code not in (408, 429)
        raise RequestError(f"HTTP {exc.code}: {body}", replica_fault=not prompt_fault) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise RequestError(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None


def healthy(endpoint: ServerEndpoint, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    try:
        with urllib.request.urlopen(endpoint.url + endpoint.health, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def served_model(endpoint: ServerEndpoint, timeout_s: float = 30.0) -> str:
    try:
        with urllib.request.urlopen(endpoint.url + "/v1/models", timeout=timeout_s) as r:
            return json.loads(r.read())["data"][0]["id"]
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        raise StageFailure(f"{endpoint.url}/v1/models lists no model ({exc}); pass --model")


# --- the balancer ---------------------------------------------------------------------------

@dataclass
class Replica:
    endpoint: ServerEndpoint
    concurrency: int
    healthy: bool = False
    outstanding: int = 0  # tokens owed: max_tokens of the requests in flight
    in_flight: set[int] = field(default_factory=set)
    sent: int = 0
    answered: int = 0
    taken_out: int = 0

    @property
    def name(self) -> str:
        return self.endpoint.name


def pick_replica(replicas: list[Replica]) -> Replica | None:
    """The healthy replica with a free slot and the least outstanding work (then the fewest
    in flight, then the one that was sent least, so equal replicas alternate)."""
    free = [r for r in replicas if r.healthy and len(r.in_flight) < r.concurrency]
    if not free:
        return None
    return min(free, key=lambda r: (r.outstanding, len(r.in_flight), r.sent))


# --- the output file ------------------------------------------------------------------------

def answered_ids(out: Path) -> set[str]:
    """Ids already answered in `out`. A torn last line (a run killed mid-write) is cut off, so
    the next append starts on a line of its own."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    keep = data if data.endswith(b"\n") or not data else data[:data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        with open(out, "r+b") as handle:
            handle.truncate(len(keep))
    ids = set()
    for number, line in enumerate(keep.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"{out}:{number}: not a result line of `infermatrix generate`; "
                             "give another --out") from None
    return ids


class AnswerLog:
    """Append-only JSONL, one line per prompt id, flushed per answer."""

    def __init__(self, path: Path | None, done: set[str]) -> None:
        self.done = set(done)
        self.handle: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> bool:
        """False when the id was answered already (a retried prompt's original came back)."""
        if record["id"] in self.done:
            return False
        self.done.add(record["id"])
        if self.handle is not None:
            self.handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.handle.flush()
        return True

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def result_record(prompt: Prompt, replica: str, reply: Completion) -> dict[str, Any]:
    return {"id": prompt.id, "replica": replica, "content": reply.content,
            "reasoning": reply.reasoning or None, "finish_reason": reply.finish_reason,
            "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "elapsed_s": round(reply.elapsed_s, 4),
            "ttft_s": None if reply.ttft_s is None else round(reply.ttft_s, 4)}


# --- the batch ------------------------------------------------------------------------------

@dataclass
class BatchSettings:
    model: str | None = None  # None: the first model /v1/models lists
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    thinking: bool | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    request_timeout_s: float = 600.0
    wait_healthy_s: float = 900.0  # how long to wait while no replica is healthy
    health_interval_s: float = HEALTH_INTERVAL_S
    max_attempts: int = MAX_ATTEMPTS
    stop_after_s: float | None = None  # ask nothing new after this (a bounded load)


@dataclass
class BatchResult:
    asked: int  # prompts this run had to ask (those not in the output already)
    skipped: int  # already answered in the output
    answered: int
    failed: dict[str, str]
    replicas: list[Replica]
    wall_s: float
    completions: list[tuple[str, Completion]]  # (replica, reply) of every answer written
    retried: int
    unasked: int = 0  # left when stop_after_s ran out

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for _, c in self.completions)

    def summary(self) -> str:
        per = ", ".join(f"{r.name} {r.answered}" + (f" (taken out {r.taken_out}x)"
                                                    if r.taken_out else "")
                        for r in self.replicas)
        return (f"generate: {self.answered} answered, {self.skipped} already in the output, "
                f"{len(self.failed)} failed, {self.retried} retried; answers per replica: "
                f"{per}; {self.completion_tokens} tokens in {self.wall_s:.1f} s")


@dataclass
class _Task:
    number: int
    prompt: Prompt
    replica: Replica
    cost: int
    abandoned: bool = False


GenerateProgress = Callable[[int, int, list[Replica]], None]  # (done, total, replicas)


class Batch:
    """The dispatch loop: the main thread owns all state; request threads and the health
    checker only post events to one queue."""

    def __init__(self, endpoints: list[ServerEndpoint], prompts: list[Prompt],
                 settings: BatchSettings, log: AnswerLog,
                 progress: GenerateProgress | None = None) -> None:
        self.settings = settings
        self.replicas = [Replica(e, settings.concurrency) for e in endpoints]
        self.log = log
        self.todo = [p for p in prompts if p.id not in log.done]
        self.skipped = len(prompts) - len(self.todo)
        self.pending: deque[Prompt] = deque(self.todo)
        self.tasks: dict[int, _Task] = {}
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.attempts: Counter[str] = Counter()
        self.failed: dict[str, str] = {}
        self.completions: list[tuple[str, Completion]] = []
        self.answered = 0
        self.retried = 0
        self.numbers = 0
        self.progress = progress
        self.stop = threading.Event()
        self.model = settings.model
        self.unasked = 0

    # events come from these threads ------------------------------------------------------
    def _ask(self, task: _Task, payload: dict[str, Any]) -> None:
        try:
            reply = post_chat(task.replica.endpoint.url, payload, self.settings.request_timeout_s)
            self.events.put(("answer", task, reply))
        except RequestError as exc:
            self.events.put(("error", task, exc))

    def _watch_health(self) -> None:
        while not self.stop.is_set():
            for replica in self.replicas:
                self.events.put(("health", replica, healthy(replica.endpoint)))
            self.stop.wait(self.settings.health_interval_s)

    # state changes, main thread only ------------------------------------------------------
    def _open_tasks(self) -> int:
        return sum(1 for t in self.tasks.values() if not t.abandoned)

    def _dispatch(self) -> None:
        while self.pending:
            prompt = self.pending[0]
            if prompt.id in self.log.done or prompt.id in self.failed:
                self.pending.popleft()
                continue
            replica = pick_replica(self.replicas)
            if replica is None:
                return
            if self.model is None:
                try:
                    self.model = served_model(replica.endpoint)
                except StageFailure:
                    self._take_out(replica)  # went down since its health check
                    continue
            self.pending.popleft()
            self.numbers += 1
            cost = prompt.max_tokens or self.settings.max_tokens
            task = _Task(self.numbers, prompt, replica, cost)
            self.tasks[task.number] = task
            replica.in_flight.add(task.number)
            replica.outstanding += cost
            replica.sent += 1
            payload = chat_payload(self.model, prompt, self.settings.max_tokens,
                                   self.settings.temperature, self.settings.thinking)
            threading.Thread(target=self._ask, args=(task, payload), daemon=True,
                             name=f"generate-{replica.name}-{task.number}").start()

    def _release(self, task: _Task) -> None:
        self.tasks.pop(task.number, None)
        if not task.abandoned:
            task.replica.in_flight.discard(task.number)
            task.replica.outstanding -= task.cost

    def _take_out(self, replica: Replica) -> None:
        """Out of rotation; its in-flight prompts go back to the front of the queue."""
        if not replica.healthy:
            return
        replica.healthy = False
        replica.taken_out += 1
        for number in sorted(replica.in_flight, reverse=True):
            task = self.tasks[number]
            task.abandoned = True
            self.pending.appendleft(task.prompt)
            self.retried += 1
        replica.in_flight.clear()
        replica.outstanding = 0

    def _on_answer(self, task: _Task, reply: Completion) -> None:
        self._release(task)
        if self.log.write(result_record(task.prompt, task.replica.name, reply)):
            task.replica.answered += 1
            self.answered += 1
            self.completions.append((task.replica.name, reply))

    def _on_error(self, task: _Task, error: RequestError) -> None:
        was_open = not task.abandoned
        self._release(task)
        if not was_open or task.prompt.id in self.log.done:
            return  # its retry is (or was) elsewhere already
        self.attempts[task.prompt.id] += 1
        # A 4xx is the prompt's own (asking again won't help); a replica fault is asked
        # again elsewhere, up to max_attempts (a prompt that brings every replica down stops)
        if error.replica_fault:
            self._take_out(task.replica)  # the health check puts it back
        if not error.replica_fault or self.attempts[task.prompt.id] >= self.settings.max_attempts:
            self.failed[task.prompt.id] = f"{task.replica.name}: {error}"
            return
        self.pending.appendleft(task.prompt)
        self.retried += 1

    def _on_health(self, replica: Replica, ok: bool) -> None:
        if ok:
            replica.healthy = True
        else:
            self._take_out(replica)

    def _handle(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "answer":
            self._on_answer(event[1], event[2])
        elif kind == "error":
            self._on_error(event[1], event[2])
        else:
            self._on_health(event[1], event[2])

    def _guard_against_no_replica(self, since: float | None) -> float | None:
        """When no replica has been healthy for wait_healthy_s, fail."""
        if any(r.healthy for r in self.replicas):
            return None
        now = time.monotonic()
        since = since or now
        if now - since > self.settings.wait_healthy_s:
            names = ", ".join(f"{r.name} ({r.endpoint.url}{r.endpoint.health})"
                              for r in self.replicas)
            raise StageFailure(f"no replica answered its health check for "
                               f"{self.settings.wait_healthy_s:.0f} s: {names}")
        return since

    def _out_of_time(self, started: float) -> bool:
        limit = self.settings.stop_after_s
        return limit is not None and time.monotonic() - started > limit

    def _first_health_pass(self) -> None:
        """Every replica checked at once before the first request, so the load starts spread
        over all the healthy ones (not on whichever answered its check first)."""
        results: dict[str, bool] = {}
        checks = [threading.Thread(target=lambda r=r: results.__setitem__(r.name,
                                                                          healthy(r.endpoint)),
                                   daemon=True) for r in self.replicas]
        for check in checks:
            check.start()
        for check in checks:
            check.join(HEALTH_TIMEOUT_S + 1)
        for replica in self.replicas:
            replica.healthy = results.get(replica.name, False)

    def run(self) -> BatchResult:
        started = time.monotonic()
        self._first_health_pass()
        checker = threading.Thread(target=self._watch_health, daemon=True, name="health")
        checker.start()
        unhealthy_since: float | None = None
        last_report = 0.0
        try:
            while self.pending or self._open_tasks():
                if self._out_of_time(started):
                    self.unasked = len(self.pending)
                    self.pending.clear()
                self._dispatch()
                try:
                    self._handle(self.events.get(timeout=0.5))
                    while True:  # drain what else arrived
                        self._handle(self.events.get_nowait())
                except queue.Empty:
                    pass
                unhealthy_since = self._guard_against_no_replica(unhealthy_since)
                if self.progress and time.monotonic() - last_report > 0.2:
                    self.progress(self.answered + len(self.failed), len(self.todo),
                                  self.replicas)
                    last_report = time.monotonic()
        finally:
            self.stop.set()
        if self.progress:
            self.progress(self.answered + len(self.failed), len(self.todo), self.replicas)
        return BatchResult(len(self.todo), self.skipped, self.answered, self.failed,
                           self.replicas, time.monotonic() - started, self.completions,
                           self.retried, self.unasked)


def run_batch(endpoints: list[ServerEndpoint], prompts: list[Prompt], settings: BatchSettings,
              out: Path | None = None, progress: GenerateProgress | None = None) -> BatchResult:
    """Ask every prompt not yet answered in `out` (None: keep the answers in memory only)."""
    if settings.concurrency < 1:
        raise UsageError(f"--concurrency {settings.concurrency}: at least 1 per replica")
    log = AnswerLog(out, answered_ids(out) if out is not None else set())
    try:
        return Batch(endpoints, prompts, settings, log, progress).run()
    finally:
        log.close()

