"""The load generator's prompts, against a stand-in /v1/completions in a thread (no processes).

vLLM's prefix cache serves a prompt's first KV-cache block (16 tokens) from cache when an
earlier prompt opened the same way; its log then counts fewer prompt tokens than /metrics, and
the live test comparing the two failed (0.89 in a recorded `mixed` window). No two prompts may
open alike: not within a run, nor across runs with the same seed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools.loadgen import run_load

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
        result = run_load(url, workload, 5.0, concurrency=4, seed=0, max_requests=60)
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
        result = run_load(url, "streaming", 5.0, concurrency=2, seed=0, max_requests=6)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
    assert result.requests_ok == 6 and result.requests_failed == 0, result
    assert result.completion_tokens == 6 * 128 and result.prompt_tokens == 60
    assert all(
        b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in bodies
    )
