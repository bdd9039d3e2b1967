"""The load generator's prompts and connections, against a stand-in /v1/completions in a thread
(no processes).

vLLM's prefix cache serves a prompt's first KV-cache block (16 tokens) from cache when an
earlier prompt opened the same way; its log then counts fewer prompt tokens than /metrics, and
the live test comparing the two failed (0.89 in a recorded `mixed` window). No two prompts may
open alike: not within a run, nor across runs with the same seed.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools.loadgen import Request, _send, _Tally, run_load

BLOCK = 16  # tokens in a KV-cache block; the tag's characters are at most a token each


class _Completions(BaseHTTPRequestHandler):
    prompts: list[str] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.prompts.append(body["prompt"])
        usage = {"prompt_tokens": 10, "completion_tokens": body["max_tokens"]}
        payload = json.dumps({"usage": usage}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    prompts: list[str] = []
    handler = type("Handler", (_Completions,), {"prompts": prompts})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", prompts
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


@pytest.mark.parametrize("workload", ["prefill-heavy", "decode-heavy", "mixed"])
def test_no_two_prompts_open_alike(server: tuple[str, list[str]], workload: str) -> None:
    url, prompts = server
    for _ in range(2):  # the same seed twice, as a retake or a later test would
        # max_requests ends it; the duration only bounds a broken run (5 s sent 54 of the 60
        # on a busy host: a count, not a speed, is what is asserted)
        result = run_load(url, workload, 120.0, concurrency=4, seed=0, max_requests=60)
        assert result.requests_ok == 60 and result.requests_failed == 0, result
    assert len(prompts) == 120
    tags = [p.split(" ", 1)[0] for p in prompts]
    assert len(set(tags)) == len(prompts)
    assert max(len(t) for t in tags) < BLOCK - 1  # inside the first block, after BOS


class _Streamed(BaseHTTPRequestHandler):
    bodies: list[dict[str, object]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        usage = {"prompt_tokens": 10, "completion_tokens": body["max_tokens"]}
        events = [{"choices": [{"text": "a"}], "usage": None}] * 3 + [
            {"choices": [], "usage": usage}
        ]
        payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args: object) -> None:
        pass


def test_streaming_counts_usage_from_the_last_event() -> None:
    bodies: list[dict[str, object]] = []
    handler = type("Handler", (_Streamed,), {"bodies": bodies})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        result = run_load(url, "streaming", 120.0, concurrency=2, seed=0, max_requests=6)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
    assert result.requests_ok == 6 and result.requests_failed == 0, result
    assert result.completion_tokens == 6 * 128 and result.prompt_tokens == 60
    assert all(
        b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in bodies
    )


class _KeepAlive(_Completions):
    """HTTP/1.1: the connection stays open after a response unless the handler closes it."""

    protocol_version = "HTTP/1.1"
    served = 0

    def do_POST(self) -> None:
        type(self).served += 1
        super().do_POST()


class _ClosesWhenIdle(_KeepAlive):
    """Closes the connection after each answer without saying so, as uvicorn does to one left
    idle for 5 s (a client starved of CPU left one so in CI's conditions)."""

    def do_POST(self) -> None:
        super().do_POST()
        self.close_connection = True


class _ClosesOnTheSecond(_KeepAlive):
    """Reads a connection's second request and closes without an answer: the idle close that
    crossed the request on the wire."""

    def handle(self) -> None:
        self.count = 0
        super().handle()

    def do_POST(self) -> None:
        self.count += 1
        if self.count == 2:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.close_connection = True
            return
        super().do_POST()


class _NeverAnswers(_KeepAlive):
    def do_POST(self) -> None:
        type(self).served += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        self.close_connection = True


def _serve(handler: type[_KeepAlive]) -> tuple[ThreadingHTTPServer, threading.Thread]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (handler,), {"served": 0}))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    return httpd, thread


REQUEST = Request("tag hello", 4, True)


@pytest.mark.parametrize("handler", [_ClosesWhenIdle, _ClosesOnTheSecond])
def test_a_keep_alive_connection_the_server_closed_costs_no_request(
    handler: type[_KeepAlive],
) -> None:
    # A CI run counted `BrokenPipeError` as a failed request: the server had closed the
    # connection while the load generator's thread waited for CPU.
    httpd, thread = _serve(handler)
    port = httpd.server_address[1]
    tally = _Tally()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for _ in range(4):
            conn = _send(conn, "127.0.0.1", port, REQUEST, tally)
            time.sleep(0.05)  # the server's close lands while the connection is idle
    finally:
        conn.close()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
    assert (tally.ok, tally.failed, tally.last_error) == (4, 0, "")
    assert tally.completion_tokens == 16


def test_a_fresh_connection_that_fails_is_counted_not_retried() -> None:
    httpd, thread = _serve(_NeverAnswers)
    port = httpd.server_address[1]
    tally = _Tally()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn = _send(conn, "127.0.0.1", port, REQUEST, tally)
    finally:
        conn.close()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
    assert (tally.ok, tally.failed) == (0, 1)
    assert "RemoteDisconnected" in tally.last_error
    assert httpd.RequestHandlerClass.served == 1  # type: ignore[attr-defined]  # sent once
