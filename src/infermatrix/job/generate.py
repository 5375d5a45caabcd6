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
first token and inter-token latency for the throughput level (job/throughput.py).
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

from ..errors import (InputFileError, MissingPrerequisite, ModelNotServed, ServerNotReady,
                      StageFailure, UsageError)
from ..model.modelcard import SAMPLING_KEYS, ModelDefaults, Sampling, model_defaults

FALLBACK_CONCURRENCY = 4  # per replica, only when neither the deployment nor the server says
TRUNCATE_POLICIES = ("retry-longer", "keep", "fail")
DEFAULT_ON_TRUNCATE = "retry-longer"
EMPTY_ANSWER = "empty answer: no content after the thinking"
FSYNC_EVERY_S = 2.0  # the output is fsynced at most this long after an answer is written
TOKENIZE_WORKERS = 16
KV_FALLBACK_CAP = 256  # requests in flight per replica at most, when only the KV figure is known
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
    sampling: dict[str, float | int] | None = None  # per-prompt overrides (temperature, ...)


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def prompt_sampling(record: dict[str, Any], where: str) -> dict[str, float | int] | None:
    """A prompt's own sampling keys (`temperature`, `top_p`, ...), each a number."""
    found = {k: record[k] for k in SAMPLING_KEYS if k in record}
    for key, value in found.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InputFileError(f"{where}: `{key}` is a number, not {value!r}")
    return found or None


def prompt_from_record(record: Any, where: str) -> Prompt:
    """{"id", "prompt"} or {"id", "messages"}, optional "thinking", "max_tokens" and sampling
    keys ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "repetition_penalty")."""
    if not isinstance(record, dict):
        raise InputFileError(f"{where}: a prompt is a JSON object with `id` and `prompt`")
    if record.get("id") in (None, ""):
        raise InputFileError(f"{where}: the prompt has no `id` (results are keyed by it)")
    if isinstance(record.get("messages"), list) and record["messages"]:
        messages = record["messages"]
    elif isinstance(record.get("prompt"), str):
        messages = [{"role": "user", "content": record["prompt"]}]
    else:
        raise InputFileError(f"{where}: give `prompt` (a string) or `messages` (a list)")
    thinking = record.get("thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise InputFileError(f"{where}: `thinking` is true or false, not {thinking!r}")
    max_tokens = record.get("max_tokens")
    if max_tokens is not None and not positive_int(max_tokens):
        raise InputFileError(f"{where}: `max_tokens` is a positive integer, not {max_tokens!r}")
    return Prompt(str(record["id"]), messages, thinking, max_tokens,
                  prompt_sampling(record, where))


def read_prompts(path: Path) -> list[Prompt]:
    """The prompts of a JSONL file; a bad line is a usage error naming file and line."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise UsageError(f"--prompts {path}: {exc.strerror or exc}") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputFileError(f"{where}: not UTF-8 (byte {exc.start + 1} of the line)") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InputFileError(f"{where}: not JSON ({exc})") from None
        prompt = prompt_from_record(record, where)
        if prompt.id in seen:
            raise InputFileError(f"{where}: prompt id {prompt.id!r} repeats line "
                                 f"{seen[prompt.id]}; ids key the results, so each must be "
                                 "unique")
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
    max_seqs: int | None = None  # the engine's concurrent-sequence limit the deployment set
    model_dir: Path | None = None  # the host directory the weights were mounted from


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# the engines' flags for the most sequences one server runs at once (vLLM, SGLang)
MAX_SEQS_FLAGS = ("--max-num-seqs", "--max-running-requests")


def flag_value(command: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the first of `flags` in an argv (`--flag V` or `--flag=V`)."""
    for index, word in enumerate(command):
        for flag in flags:
            if word == flag and index + 1 < len(command):
                return command[index + 1]
            if word.startswith(flag + "="):
                return word.split("=", 1)[1]
    return None


def service_max_seqs(command: Any) -> int | None:
    words = [str(w) for w in command] if isinstance(command, list) else str(command or "").split()
    value = flag_value(words, MAX_SEQS_FLAGS)
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def service_model_dir(service: dict[str, Any]) -> Path | None:
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict) and volume.get("source"):
            return Path(volume["source"])
        if isinstance(volume, str) and ":" in volume:
            return Path(volume.split(":", 1)[0])
    return None


def deployment_endpoints(directory: Path) -> list[ServerEndpoint]:
    """The replicas of an `infermatrix deploy` directory, from its compose.yaml: each service's
    published port (0.0.0.0 is reached over 127.0.0.1), the health route its check asks, the
    sequence limit its command sets and the model directory it mounts."""
    compose = directory / "compose.yaml"
    try:
        document = yaml.safe_load(compose.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise MissingPrerequisite(f"--deployment {directory}: no compose.yaml ({exc.strerror})",
                                  fix="write one with `infermatrix deploy`") from None
    except yaml.YAMLError as exc:
        raise InputFileError(f"{compose}: not YAML ({exc})") from None
    endpoints = []
    for name, service in (document.get("services") or {}).items():
        ports = service.get("ports") or []
        if not ports:
            raise InputFileError(f"{compose}: service {name} publishes no port")
        host, port, _ = str(ports[0]).rsplit(":", 2) if str(ports[0]).count(":") == 2 \
            else ("127.0.0.1", *str(ports[0]).split(":", 1))
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        test = " ".join(map(str, (service.get("healthcheck") or {}).get("test") or []))
        route = HEALTH_URL.search(test)
        endpoints.append(ServerEndpoint(name, f"http://{host}:{port}",
                                        route.group(1) if route else DEFAULT_HEALTH,
                                        service_max_seqs(service.get("command")),
                                        service_model_dir(service)))
    if not endpoints:
        raise InputFileError(f"{compose}: no services")
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


def chat_payload(model: str, prompt: Prompt, max_tokens: int | None,
                 sampling: dict[str, float | int], thinking: bool | None) -> dict[str, Any]:
    """The request body. `max_tokens` None: the server's own limit (the context left).
    Sampling keys go as they are: vLLM and SGLang both take top_k and min_p beside the
    OpenAI fields."""
    payload: dict[str, Any] = {
        "model": model, "messages": prompt.messages, **sampling,
        "stream": True, "stream_options": {"include_usage": True}}
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    if thinking is not None:
        payload["chat_template_kwargs"] = {"enable_thinking": thinking}
    return payload


def read_stream(lines: Iterable[bytes], started: float,
                clock: Callable[[], float] = time.monotonic, max_chunks: int | None = None,
                deadline_s: float | None = None) -> Completion:
    """Assemble a streamed chat completion (server-sent `data:` lines, `[DONE]` last).
    vLLM >= 0.3x streams the thinking as `delta.reasoning`, older vLLM and SGLang as
    `delta.reasoning_content`; usage comes in a last chunk with no choices. A server that
    streams more text chunks than it may generate tokens (`max_chunks`), or past
    `deadline_s` seconds, is cut off: a replica fault, never a hung batch."""
    content: list[str] = []
    reasoning: list[str] = []
    finish: str | None = None
    usage: dict[str, Any] = {}
    times: list[float] = []  # when each text chunk came
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
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
                if max_chunks is not None and len(times) > max_chunks:
                    raise RequestError(f"the server streamed more than {max_chunks} chunks for "
                                       "a request that allows fewer tokens")
                if deadline_s is not None and now - started > deadline_s:
                    raise RequestError(f"no end of the answer after {deadline_s:.0f} s "
                                       "(--request-deadline)")
                times.append(now)
            content.append(text)
            reasoning.append(thought)
            finish = choice.get("finish_reason") or finish
    else:  # the connection closed mid-answer (a replica killed): not an answer
        raise RequestError("the stream ended before [DONE]")
    finished = clock()
    return Completion("".join(content), "".join(reasoning), finish,
                      int(usage.get("prompt_tokens") or 0),
                      int(usage.get("completion_tokens") or 0), finished - started,
                      times[0] - started if times else None,
                      [later - earlier for earlier, later in zip(times, times[1:])], started)


def post_chat(url: str, payload: dict[str, Any], timeout_s: float,
              max_chunks: int | None = None, deadline_s: float | None = None) -> Completion:
    request = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions",
                                     data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Accept": "text/event-stream"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return read_stream(response, started, max_chunks=max_chunks,
                               deadline_s=deadline_s)
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
        raise ModelNotServed(f"{endpoint.url}/v1/models lists no model ({exc})") from None


def get_json(url: str, timeout_s: float = 30.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def get_text(url: str, timeout_s: float = 30.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return None


@dataclass(frozen=True)
class ServerFacts:
    """What a running server says about itself over HTTP (each None when it does not)."""

    model: str
    max_model_len: int | None = None  # /v1/models
    kv_tokens: int | None = None  # tokens the KV cache holds (vLLM: blocks x block size)
    max_running: int | None = None  # SGLang's /get_server_info max_running_requests

    @property
    def full_length_seqs(self) -> int | None:
        """How many sequences of the full context the KV cache holds at once: the engine's
        own "maximum concurrency" figure (vLLM logs it at start)."""
        if self.kv_tokens and self.max_model_len:
            return max(1, self.kv_tokens // self.max_model_len)
        return None


CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def cache_info(metrics: str | None) -> dict[str, str]:
    """vLLM's /metrics `vllm:cache_config_info{...}` labels ({} when there is none)."""
    found = CACHE_INFO.search(metrics or "")
    return dict(LABEL.findall(found.group("labels"))) if found else {}


def kv_tokens_of(metrics: str | None) -> int | None:
    """Tokens the KV cache holds: `kv_cache_size_tokens` (vLLM >= 0.2x), else blocks x
    block size."""
    labels = cache_info(metrics)
    try:
        if labels.get("kv_cache_size_tokens", "None") != "None":
            return int(labels["kv_cache_size_tokens"])
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None


def read_server_facts(endpoint: ServerEndpoint, model: str | None = None) -> ServerFacts:
    models = get_json(endpoint.url + "/v1/models")
    entries = (models or {}).get("data") or [] if isinstance(models, dict) else []
    entry = next((m for m in entries if model is None or m.get("id") == model), None)
    if entry is None:
        raise ModelNotServed(f"{endpoint.url}/v1/models lists "
                             f"{'no model' if model is None else f'no model {model!r}'}")
    length = entry.get("max_model_len")
    info = get_json(endpoint.url + "/get_server_info")
    running = info.get("max_running_requests") if isinstance(info, dict) else None
    return ServerFacts(entry["id"], length if positive_int(length) else None,
                       kv_tokens_of(get_text(endpoint.url + "/metrics")),
                       running if positive_int(running) else None)


def count_prompt_tokens(endpoint: ServerEndpoint, model: str, prompt: Prompt,
                        thinking: bool | None, timeout_s: float = 60.0) -> int | None:
    """The prompt's tokens after the chat template, from the server's own /tokenize (vLLM;
    None where the server has no such route)."""
    body: dict[str, Any] = {"model": model, "messages": prompt.messages,
                            "add_generation_prompt": True}
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    request = urllib.request.Request(endpoint.url + "/tokenize", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            count = json.loads(response.read()).get("count")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None
    return count if isinstance(count, int) else None


# --- the deployment's sizing and prediction (written by `infermatrix deploy`) --------------

DEPLOYMENT_RECORD = "deployment.json"


def deployment_record(directory: Path | None) -> dict[str, Any]:
    """What deploy recorded of its sizing: GPU class, profile, context and output lengths,
    the engine's sequence limit, the capacity model's predicted tokens/s per replica ({}:
    none, e.g. --endpoint or a hand-made compose file)."""
    if directory is None:
        return {}
    path = directory / DEPLOYMENT_RECORD
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InputFileError(f"{path}: not a deployment record ({exc})",
                             fix="write it again with `infermatrix deploy`") from None
    return data if isinstance(data, dict) else {}


def run_forecast(record: dict[str, Any], prompts: int, replicas: int) -> str:
    """The forecast line printed before the first request: prompts x expected output tokens
    / (predicted tokens/s x replicas), from the deployment's recorded prediction."""
    from ..model.capacity import forecast

    rate = record.get("predicted_tokens_per_s_per_replica")
    output = record.get("output_tokens")
    if not isinstance(rate, (int, float)) or not isinstance(output, int) or rate <= 0:
        return ("forecast: none before the first answers (the deployment records no "
                "prediction: `infermatrix deploy --gpu-class` writes one); the ETA follows the "
                "measured rate")
    line = forecast(prompts, output, float(rate), replicas).describe()
    return f"{line}; prediction: {record.get('prediction_source', 'the deployment record')}"


# --- the run's defaults, resolved once before the first request ---------------------------

@dataclass(frozen=True)
class PromptPlan:
    """One prompt's settings for this run, and their sources."""

    thinking: bool | None
    max_tokens: int | None  # None: the server's limit (the context left)
    ceiling: int | None  # the most it may ever ask: the context left after the prompt
    sampling: dict[str, float | int]
    prompt_tokens: int | None


@dataclass
class RunDefaults:
    """The defaults of one generate run, each with where it came from (printed first)."""

    model: str
    facts: ServerFacts
    defaults: ModelDefaults
    concurrency: dict[str, int]  # per replica
    concurrency_source: str
    max_tokens_source: str
    plans: dict[str, PromptPlan] = field(default_factory=dict)

    def describe(self, settings: "BatchSettings") -> list[str]:
        lines = [f"model {self.model}; context {self.facts.max_model_len or '?'} tokens "
                 f"(/v1/models)"]
        lines.append(f"max tokens: {self.max_tokens_source}")
        for mode, thinking in (("thinking on", True), ("thinking off", False)):
            sampling = self.sampling_for(settings, thinking, None)
            lines.append(f"sampling, {mode}: {sampling.describe()}")
        per = ", ".join(f"{name} {n}" for name, n in self.concurrency.items())
        lines.append(f"concurrency per replica: {per} ({self.concurrency_source})")
        lines.append(f"truncated answers: {settings.on_truncate} (--on-truncate)")
        return lines

    def sampling_for(self, settings: "BatchSettings", thinking: bool | None,
                     prompt: Prompt | None) -> Sampling:
        """Per prompt > the run's flags > generation_config.json > the card."""
        base = self.defaults.sampling_for(thinking)
        params, source = dict(base.params), base.source
        if settings.sampling:
            params.update(settings.sampling)
            source = "command line" if not base.params else f"command line over {source}"
        if prompt is not None and prompt.sampling:
            params.update(prompt.sampling)
            source = f"prompt over {source}"
        return Sampling(params, source)


def thinking_of(prompt: Prompt, settings: "BatchSettings") -> bool | None:
    return prompt.thinking if prompt.thinking is not None else settings.thinking


def plan_prompt(prompt: Prompt, settings: "BatchSettings", run: RunDefaults,
                prompt_tokens: int | None) -> PromptPlan:
    thinking = thinking_of(prompt, settings)
    length = run.facts.max_model_len
    ceiling = length - prompt_tokens if length and prompt_tokens is not None else None
    wanted = prompt.max_tokens or settings.max_tokens
    if wanted is None:
        cap = run.defaults.output_cap(thinking)
        wanted = min(x for x in (cap, ceiling) if x is not None) if (cap or ceiling) else None
    elif ceiling is not None:
        wanted = min(wanted, ceiling)
    sampling = run.sampling_for(settings, thinking, prompt).params
    return PromptPlan(thinking, wanted, ceiling, sampling, prompt_tokens)


def count_all(endpoint: ServerEndpoint, model: str, prompts: list[Prompt],
              settings: "BatchSettings") -> dict[str, int | None]:
    """Every prompt's token count, asked of the server in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(TOKENIZE_WORKERS) as pool:
        counts = pool.map(lambda p: count_prompt_tokens(endpoint, model, p,
                                                        thinking_of(p, settings)), prompts)
        return {p.id: c for p, c in zip(prompts, counts)}


def too_long(counts: dict[str, int | None], max_model_len: int | None) -> list[str]:
    if not max_model_len:
        return []
    return [pid for pid, n in counts.items() if n is not None and n >= max_model_len]


def choose_concurrency(endpoints: list[ServerEndpoint], facts: ServerFacts,
                       asked: int | None) -> tuple[dict[str, int], str]:
    """Requests in flight per replica: what the user asked, else what the deployment set
    the engine to run at once (its --max-num-seqs), else what the server reports."""
    if asked is not None:
        return {e.name: asked for e in endpoints}, "--concurrency"
    if all(e.max_seqs for e in endpoints):
        return ({e.name: int(e.max_seqs or 0) for e in endpoints},
                "the sequence limit each replica's command sets in compose.yaml")
    if facts.max_running:
        return ({e.name: facts.max_running for e in endpoints},
                "the server's max_running_requests (/get_server_info)")
    if facts.full_length_seqs:
        seqs = min(facts.full_length_seqs, KV_FALLBACK_CAP)
        return ({e.name: seqs for e in endpoints},
                f"sequences of the full context the KV cache holds ({facts.kv_tokens} tokens "
                f"/ {facts.max_model_len}, /metrics), at most {KV_FALLBACK_CAP}; the engine's "
                "own --max-num-seqs is not reported over HTTP: `infermatrix deploy` sets it")
    return ({e.name: FALLBACK_CONCURRENCY for e in endpoints},
            f"{FALLBACK_CONCURRENCY}: neither the deployment nor the server says what it holds")


def wait_until_any_healthy(endpoints: list[ServerEndpoint], timeout_s: float
                           ) -> ServerEndpoint:
    started = time.monotonic()
    while True:
        for endpoint in endpoints:
            if healthy(endpoint):
                return endpoint
        if time.monotonic() - started > timeout_s:
            names = ", ".join(f"{e.name} ({e.url}{e.health})" for e in endpoints)
            raise ServerNotReady(f"no replica answered its health check for {timeout_s:.0f} s: "
                                 f"{names}")
        time.sleep(1.0)


def resolve_defaults(endpoints: list[ServerEndpoint], prompts: list[Prompt],
                     settings: "BatchSettings", model_dir: Path | None = None) -> RunDefaults:
    """Ask a server once what it serves and holds, count the prompts' tokens, and settle
    every prompt's max_tokens, sampling and thinking. Prompts longer than the context are
    refused here, before anything is asked, with their ids."""
    first = wait_until_any_healthy(endpoints, settings.wait_healthy_s)
    facts = read_server_facts(first, settings.model)
    model_dir = model_dir or next((e.model_dir for e in endpoints if e.model_dir), None)
    defaults = model_defaults(model_dir if model_dir and model_dir.is_dir() else None)
    concurrency, why = choose_concurrency(endpoints, facts, settings.concurrency)
    counts = count_all(first, facts.model, prompts, settings) if prompts else {}
    over = too_long(counts, facts.max_model_len)
    if over:
        shown = ", ".join(over[:20]) + (f" and {len(over) - 20} more" if len(over) > 20 else "")
        raise UsageError(f"{len(over)} prompt(s) do not fit the served context of "
                         f"{facts.max_model_len} tokens: {shown}")
    counted = all(c is not None for c in counts.values())
    if settings.max_tokens is not None:
        source = f"{settings.max_tokens} (--max-tokens), at most the context left"
    else:
        cap = defaults.output_cap(True)
        parts = [f"the context left after each prompt ({facts.max_model_len} - prompt)"
                 if facts.max_model_len and counted else None,
                 f"the card's {cap} for thinking ({defaults.card})" if cap else None]
        source = "the smaller of " + " and ".join(p for p in parts if p) \
            if any(parts) else "the server's own limit (nothing known here)"
    run = RunDefaults(facts.model, facts, defaults, concurrency, why, source)
    run.plans = {p.id: plan_prompt(p, settings, run, counts.get(p.id)) for p in prompts}
    return run


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
    tokens: int = 0  # completion tokens of the answers it gave
    recent: deque[tuple[float, int]] = field(default_factory=deque)  # (when, tokens)

    @property
    def name(self) -> str:
        return self.endpoint.name

    def add_tokens(self, count: int, now: float, window_s: float = 30.0) -> None:
        self.tokens += count
        self.recent.append((now, count))
        while self.recent and now - self.recent[0][0] > window_s:
            self.recent.popleft()

    def tokens_per_s(self, now: float, since: float, window_s: float = 30.0) -> float:
        """Completion tokens per second over the last `window_s` seconds (or since the run
        started, when that is shorter)."""
        kept = [n for t, n in self.recent if now - t <= window_s]
        span = min(window_s, now - since)
        return sum(kept) / span if kept and span > 0 else 0.0


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
    for number, line in enumerate(keep.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            raise InputFileError(f"{out}:{number}: not a result line of `infermatrix generate`",
                                 fix="give another --out") from None
    return ids


def lock_output(out: Path) -> TextIO:
    """An exclusive lock on `out`'s lock file for the whole run: two runs on one --out would
    write answers twice. Exit 2 (nothing written) when another run holds it."""
    import fcntl
    import os

    out.parent.mkdir(parents=True, exist_ok=True)
    handle = open(out.with_name(out.name + ".lock"), "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UsageError(f"--out {out}: another `infermatrix generate` ({holder}) is writing "
                         "to it; wait for it or give another --out") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


class AnswerLog:
    """Append-only JSONL, one line per prompt id: flushed per answer, fsynced at most
    FSYNC_EVERY_S after it (a host crash loses the last seconds, a killed run nothing)."""

    def __init__(self, path: Path | None, done: set[str], fsync_every_s: float = FSYNC_EVERY_S
                 ) -> None:
        self.done = set(done)
        self.handle: TextIO | None = None
        self.fsync_every_s = fsync_every_s
        self.synced_at = time.monotonic()
        self.unsynced = 0
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
            self.unsynced += 1
            self.sync_if_due()
        return True

    def sync_if_due(self, force: bool = False) -> None:
        import os

        if self.handle is None or not self.unsynced:
            return
        if force or time.monotonic() - self.synced_at >= self.fsync_every_s:
            os.fsync(self.handle.fileno())
            self.synced_at, self.unsynced = time.monotonic(), 0

    def close(self) -> None:
        if self.handle is not None:
            self.sync_if_due(force=True)
            self.handle.close()


def result_record(prompt: Prompt, replica: str, reply: Completion, plan: PromptPlan | None,
                  max_tokens: int | None, truncated: bool = False) -> dict[str, Any]:
    """One answer line: the answer and the reasoning apart, with what it was asked with."""
    record: dict[str, Any] = {
        "id": prompt.id, "replica": replica, "content": reply.content,
        "reasoning": reply.reasoning or None, "finish_reason": reply.finish_reason,
        "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
        "elapsed_s": round(reply.elapsed_s, 4),
        "ttft_s": None if reply.ttft_s is None else round(reply.ttft_s, 4),
        "max_tokens": max_tokens}
    if plan is not None:
        record["thinking"] = plan.thinking
        record["sampling"] = plan.sampling
    if truncated:
        record["truncated"] = True
    return record


def is_truncated(reply: Completion) -> bool:
    return reply.finish_reason == "length"


def is_empty_answer(reply: Completion) -> bool:
    """Ended by the model, yet nothing after the thinking: the failure that made the old
    dataset useless."""
    return not is_truncated(reply) and not reply.content.strip()


# --- the batch ------------------------------------------------------------------------------

@dataclass
class BatchSettings:
    model: str | None = None  # None: the first model /v1/models lists
    max_tokens: int | None = None  # None: per prompt, the context left, capped by the card
    sampling: dict[str, float | int] = field(default_factory=dict)  # the run's overrides
    thinking: bool | None = None
    concurrency: int | None = None  # per replica; None: what the deployment/server holds
    on_truncate: str = DEFAULT_ON_TRUNCATE
    request_timeout_s: float = 600.0  # seconds without a byte
    request_deadline_s: float | None = None  # seconds for a whole answer (None: no limit)
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
    truncated_kept: int = 0  # written with truncated: true (--on-truncate keep)
    truncated_retried: int = 0  # asked again with more room
    truncated_failed: int = 0  # still truncated at the context's limit, or --on-truncate fail
    empty: int = 0  # answers with nothing after the thinking (each asked again, or failed)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for _, c in self.completions)

    def summary(self) -> str:
        per = ", ".join(f"{r.name} {r.answered}" + (f" (taken out {r.taken_out}x)"
                                                    if r.taken_out else "")
                        for r in self.replicas)
        rate = self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0
        return (f"generate: {self.answered} answered, {self.skipped} already in the output, "
                f"{len(self.failed)} failed, {self.retried} retried; truncated: "
                f"{self.truncated_retried} asked again longer, {self.truncated_kept} kept, "
                f"{self.truncated_failed} failed; empty answers: {self.empty}; answers per "
                f"replica: {per}; {self.completion_tokens} tokens in {self.wall_s:.1f} s "
                f"({rate:.1f} tokens/s)")


@dataclass
class _Task:
    number: int
    prompt: Prompt
    replica: Replica
    cost: int
    max_tokens: int | None
    abandoned: bool = False


@dataclass
class Progress:
    """What a progress display shows: counts, and tokens/s per replica and in total."""

    done: int
    total: int
    replicas: list[Replica]
    truncated: int
    empty: int
    failed: int
    started: float

    def tokens_per_s(self, now: float) -> dict[str, float]:
        return {r.name: r.tokens_per_s(now, self.started) for r in self.replicas}

    def eta_s(self, now: float) -> float | None:
        rate = self.done / (now - self.started) if now > self.started else 0.0
        return (self.total - self.done) / rate if rate > 0 else None


GenerateProgress = Callable[[Progress], None]


class Batch:
    """The dispatch loop: the main thread owns all state; request threads and the health
    checker only post events to one queue."""

    def __init__(self, endpoints: list[ServerEndpoint], prompts: list[Prompt],
                 settings: BatchSettings, log: AnswerLog, run: RunDefaults | None = None,
                 progress: GenerateProgress | None = None) -> None:
        self.settings = settings
        self.run_defaults = run
        per = run.concurrency if run else {}
        self.replicas = [Replica(e, per.get(e.name) or settings.concurrency
                                 or FALLBACK_CONCURRENCY) for e in endpoints]
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
        self.model = settings.model or (run.model if run else None)
        self.unasked = 0
        self.longer: dict[str, int] = {}  # prompt id -> max_tokens of its next ask
        self.truncated_kept = self.truncated_retried = self.truncated_failed = 0
        self.empty = 0
        self.started = time.monotonic()

    def plan_of(self, prompt: Prompt) -> PromptPlan | None:
        return self.run_defaults.plans.get(prompt.id) if self.run_defaults else None

    def max_tokens_of(self, prompt: Prompt) -> int | None:
        if prompt.id in self.longer:
            return self.longer[prompt.id]
        plan = self.plan_of(prompt)
        if plan is not None:
            return plan.max_tokens
        return prompt.max_tokens or self.settings.max_tokens

    # events come from these threads ------------------------------------------------------
    def _ask(self, task: _Task, payload: dict[str, Any]) -> None:
        limit = task.max_tokens
        try:
            reply = post_chat(task.replica.endpoint.url, payload, self.settings.request_timeout_s,
                              max_chunks=None if limit is None else limit + 16,
                              deadline_s=self.settings.request_deadline_s)
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

    def _payload(self, prompt: Prompt, max_tokens: int | None) -> dict[str, Any]:
        plan = self.plan_of(prompt)
        thinking = plan.thinking if plan else thinking_of(prompt, self.settings)
        sampling = plan.sampling if plan else {**self.settings.sampling,
                                               **(prompt.sampling or {})}
        return chat_payload(self.model or "", prompt, max_tokens, sampling, thinking)

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
            max_tokens = self.max_tokens_of(prompt)
            cost = max_tokens or 1
            task = _Task(self.numbers, prompt, replica, cost, max_tokens)
            self.tasks[task.number] = task
            replica.in_flight.add(task.number)
            replica.outstanding += cost
            replica.sent += 1
            threading.Thread(target=self._ask, args=(task, self._payload(prompt, max_tokens)),
                             daemon=True,
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

    def _longer_room(self, task: _Task) -> int | None:
        """The next max_tokens for a truncated answer: double, up to the context left; None
        when it already had all the room there is."""
        plan = self.plan_of(task.prompt)
        ceiling = plan.ceiling if plan else None
        current = task.max_tokens
        if current is None or (ceiling is not None and current >= ceiling):
            return None
        return current * 2 if ceiling is None else min(current * 2, ceiling)

    def _on_truncated(self, task: _Task, reply: Completion) -> None:
        policy = self.settings.on_truncate
        if policy == "keep":
            self._write(task, reply, truncated=True)
            self.truncated_kept += 1
            return
        room = self._longer_room(task) if policy == "retry-longer" else None
        if room is not None:
            self.longer[task.prompt.id] = room
            self.truncated_retried += 1
            self.pending.appendleft(task.prompt)
            return
        self.truncated_failed += 1
        why = "--on-truncate fail" if policy == "fail" else "no more room in the context"
        self.failed[task.prompt.id] = (f"{task.replica.name}: truncated at {task.max_tokens} "
                                       f"tokens (finish_reason length; {why})")

    def _retry_or_fail(self, task: _Task, why: str, retry: bool = True) -> None:
        """Ask the prompt again, up to max_attempts; past them (or without `retry`) it fails."""
        self.attempts[task.prompt.id] += 1
        if not retry or self.attempts[task.prompt.id] >= self.settings.max_attempts:
            self.failed[task.prompt.id] = f"{task.replica.name}: {why}"
            return
        self.pending.appendleft(task.prompt)
        self.retried += 1

    def _on_empty(self, task: _Task) -> None:
        self.empty += 1
        self._retry_or_fail(task, EMPTY_ANSWER)  # sampled: another draw may answer

    def _write(self, task: _Task, reply: Completion, truncated: bool = False) -> None:
        record = result_record(task.prompt, task.replica.name, reply, self.plan_of(task.prompt),
                               task.max_tokens, truncated)
        if self.log.write(record):
            task.replica.answered += 1
            task.replica.add_tokens(reply.completion_tokens, time.monotonic())
            self.answered += 1
            self.completions.append((task.replica.name, reply))

    def _on_answer(self, task: _Task, reply: Completion) -> None:
        was_open = not task.abandoned
        self._release(task)
        if task.prompt.id in self.log.done or task.prompt.id in self.failed:
            return
        if not was_open and task.prompt in self.pending:
            self.pending.remove(task.prompt)  # its retry is not needed any more
        if is_truncated(reply):
            self._on_truncated(task, reply)
        elif is_empty_answer(reply):
            self._on_empty(task)
        else:
            self._write(task, reply)

    def _on_error(self, task: _Task, error: RequestError) -> None:
        was_open = not task.abandoned
        self._release(task)
        if not was_open or task.prompt.id in self.log.done:
            return  # its retry is (or was) elsewhere already
        # A 4xx is the prompt's own (asking again won't help); a replica fault is asked
        # again elsewhere, up to max_attempts (a prompt that brings every replica down stops)
        if error.replica_fault:
            self._take_out(task.replica)  # the health check puts it back
        self._retry_or_fail(task, str(error), retry=error.replica_fault)

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
            raise ServerNotReady(f"no replica answered its health check for "
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

    def _report(self) -> None:
        if self.progress:
            self.progress(Progress(self.answered + len(self.failed), len(self.todo),
                                   self.replicas, self.truncated_retried + self.truncated_kept
                                   + self.truncated_failed, self.empty, len(self.failed),
                                   self.started))

    def run(self) -> BatchResult:
        started = self.started = time.monotonic()
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
                self.log.sync_if_due()
                unhealthy_since = self._guard_against_no_replica(unhealthy_since)
                if time.monotonic() - last_report > 0.2:
                    self._report()
                    last_report = time.monotonic()
        finally:
            self.stop.set()
        self._report()
        return BatchResult(len(self.todo), self.skipped, self.answered, self.failed,
                           self.replicas, time.monotonic() - started, self.completions,
                           self.retried, self.unasked, self.truncated_kept,
                           self.truncated_retried, self.truncated_failed, self.empty)


def run_batch(endpoints: list[ServerEndpoint], prompts: list[Prompt], settings: BatchSettings,
              out: Path | None = None, progress: GenerateProgress | None = None,
              run: RunDefaults | None = None, resolve: bool = True) -> BatchResult:
    """Ask every prompt not yet answered in `out` (None: keep the answers in memory only).
    `run`: defaults resolved already (resolve_defaults); else, with `resolve`, resolved
    here from the servers before the first request."""
    if settings.concurrency is not None and settings.concurrency < 1:
        raise UsageError(f"--concurrency {settings.concurrency}: at least 1 per replica")
    if settings.on_truncate not in TRUNCATE_POLICIES:
        raise UsageError(f"--on-truncate {settings.on_truncate}: one of "
                         f"{', '.join(TRUNCATE_POLICIES)}")
    done = answered_ids(out) if out is not None else set()
    if run is None and resolve:
        run = resolve_defaults(endpoints, [p for p in prompts if p.id not in done], settings)
    log = AnswerLog(out, done)
    try:
        return Batch(endpoints, prompts, settings, log, run, progress).run()
    finally:
        log.close()
