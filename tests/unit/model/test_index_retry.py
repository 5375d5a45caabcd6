"""The index reader tries a transient failure again (issue 47's CI run lost to one "Temporary
failure in name resolution"), and fails at once on a name that does not resolve or a 404.
A real local HTTP server shows the 503 and the 404; the resolver's EAI_AGAIN cannot be made to
happen on demand, so a fake urlopen (FakeFlakyResolver) raises it once."""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from infermatrix.model import index

REAL_URLOPEN = urllib.request.urlopen


class OnceBusyHandler(http.server.BaseHTTPRequestHandler):
    """/busy answers 503 the first time, then 200; /gone is a 404."""

    seen: dict[str, int] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        count = self.seen[self.path] = self.seen.get(self.path, 0) + 1
        status = 404 if self.path == "/gone" else 503 if count == 1 else 200
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b"metadata" if status == 200 else b"no")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server(monkeypatch) -> Iterator[str]:
    monkeypatch.setattr(index, "RETRY_DELAYS_S", (0.0, 0.0))
    OnceBusyHandler.seen = {}
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OnceBusyHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_busy_server_is_asked_again(server):
    assert index._http_get(f"{server}/busy") == b"metadata"
    assert OnceBusyHandler.seen["/busy"] == 2


def test_a_404_is_not_on_the_index_at_once(server):
    with pytest.raises(index.NotOnIndex):
        index._http_get(f"{server}/gone")
    assert OnceBusyHandler.seen["/gone"] == 1


class FakeFlakyResolver:
    """urlopen whose name lookups fail with `errno` the first `failures` times."""

    def __init__(self, errno: int, failures: int) -> None:
        self.errno, self.failures, self.calls = errno, failures, 0

    def __call__(self, request, timeout=None, context=None):
        self.calls += 1
        if self.calls <= self.failures:
            raise urllib.error.URLError(socket.gaierror(self.errno, "resolver"))
        return REAL_URLOPEN("data:,answer")


def test_the_resolvers_try_again_is_tried_again(monkeypatch):
    monkeypatch.setattr(index, "RETRY_DELAYS_S", (0.0, 0.0))
    fake = FakeFlakyResolver(socket.EAI_AGAIN, failures=2)
    monkeypatch.setattr(index.urllib.request, "urlopen", fake)
    assert index._http_get("https://files.example/x.whl") == b"answer"
    assert fake.calls == 3


def test_a_name_that_does_not_resolve_fails_at_once(monkeypatch):
    monkeypatch.setattr(index, "RETRY_DELAYS_S", (0.0, 0.0))
    fake = FakeFlakyResolver(socket.EAI_NONAME, failures=5)
    monkeypatch.setattr(index.urllib.request, "urlopen", fake)
    with pytest.raises(index.IndexUnavailable, match="resolver"):
        index._http_get("https://download.example/whl/cu129")
    assert fake.calls == 1


def test_three_transient_failures_give_up_as_unavailable(monkeypatch):
    monkeypatch.setattr(index, "RETRY_DELAYS_S", (0.0, 0.0))
    fake = FakeFlakyResolver(socket.EAI_AGAIN, failures=5)
    monkeypatch.setattr(index.urllib.request, "urlopen", fake)
    with pytest.raises(index.IndexUnavailable):
        index._http_get("https://files.example/x.whl")
    assert fake.calls == 3
