"""A small, standard-library load generator for the dev vLLM server's `/v1/completions`.

Each named workload pushes the server into one serving phase, so a profile taken under it has a
known expected shape: `prefill-heavy` (long prompts, 1-2 new tokens), `decode-heavy` (short
prompts, 128 tokens with `ignore_eos` so lengths do not depend on the random weights) and
`mixed`; `streaming` is decode-heavy streamed as server-sent events, a chunk per token, as chat
front ends ask for it. Load is bounded in time, sent only to loopback, and counted from each
response's `usage`.

    python -m devtools.loadgen --url http://127.0.0.1:8000 --workload mixed --duration 10
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import os
import random
import re
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from devtools.vllm_env import sentences

MODEL = "tiny"
# Prompt material comes from the tiny tokenizer's own training distribution, so token counts are
# predictable: about 25 tokens per sentence with the 512-entry vocabulary (measured on this pool).
_SENTENCE_POOL = sentences(2000, seed=7)
_REQUEST_TIMEOUT_S = 60.0
_FAILURE_BACKOFF_S = 0.1


@dataclass(frozen=True, slots=True)
class Request:
    """One `/v1/completions` body, before JSON encoding."""

    prompt: str
    max_tokens: int
    ignore_eos: bool
    stream: bool = False  # server-sent events; the last chunk carries `usage`

    def body(self) -> bytes:
        fields: dict[str, object] = {
            "model": MODEL,
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "ignore_eos": self.ignore_eos,
        }
        if self.stream:
            fields.update(stream=True, stream_options={"include_usage": True})
        return json.dumps(fields).encode()


def _prompt(rng: random.Random, sentence_count: int) -> str:
    # A fresh draw per prompt, not a slice of the pool (and `run_load` opens each prompt with a
    # tag of its own): no two prompts share a prefix, so vLLM's prefix cache (on by default)
    # cannot turn part of a load into cache hits.
    return " ".join(rng.sample(_SENTENCE_POOL, sentence_count))


def _tagged(request: Request, tag: str) -> Request:
    """REQUEST with TAG before its prompt. The pool has 2,000 sentences, so over a few hundred
    requests many prompts open with the same sentence, and a repeated seed repeats whole
    prompts: vLLM then serves the first KV-cache block (16 tokens) from its prefix cache, and
    its log's prompt throughput, which counts computed tokens only, fell 11 % short of the
    prompt tokens /metrics counted in a recorded `mixed` window. About 13 tokens (one per
    character with the tiny tokenizer), inside the first block."""
    return replace(request, prompt=f"{tag} {request.prompt}")


def _prefill_heavy(rng: random.Random) -> Request:
    # 13-14 sentences: 270-425 tokens (mean ~345) and ~12 of the tag (`_tagged`), inside
    # --max-model-len 512 with the output.
    return Request(_prompt(rng, rng.randint(13, 14)), rng.randint(1, 2), ignore_eos=True)


def _decode_heavy(rng: random.Random) -> Request:
    # 1-2 sentences: 10-70 prompt tokens, then 128 decode steps each.
    return Request(_prompt(rng, rng.randint(1, 2)), 128, ignore_eos=True)


def _mixed(rng: random.Random) -> Request:
    roll = rng.random()
    if roll < 0.35:
        return _prefill_heavy(rng)
    if roll < 0.7:
        return _decode_heavy(rng)
    return Request(_prompt(rng, rng.randint(3, 6)), rng.randint(16, 64), ignore_eos=True)


def _streaming(rng: random.Random) -> Request:
    # decode-heavy, streamed: the API server sends a chunk per generated token
    return replace(_decode_heavy(rng), stream=True)


WORKLOADS: dict[str, Callable[[random.Random], Request]] = {
    "prefill-heavy": _prefill_heavy,
    "decode-heavy": _decode_heavy,
    "mixed": _mixed,
    "streaming": _streaming,
}


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one load run achieved; token counts are the server's own (`usage`)."""

    workload: str
    requests_ok: int
    requests_failed: int
    prompt_tokens: int
    completion_tokens: int
    elapsed_s: float
    last_error: str = ""

    @property
    def requests_per_s(self) -> float:
        return self.requests_ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated (completion) tokens per second."""
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["requests_per_s"] = round(self.requests_per_s, 3)
        out["tokens_per_s"] = round(self.tokens_per_s, 1)
        out["prompt_tokens_per_s"] = round(self.prompt_tokens_per_s, 1)
        return out


class _Tally:
    """Counters shared by the client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = self.failed = self.prompt_tokens = self.completion_tokens = 0
        self.last_error = ""

    def add(self, usage: dict[str, int] | None, error: str = "") -> None:
        with self.lock:
            if usage is None:
                self.failed += 1
                self.last_error = error
                return
            self.ok += 1
            self.prompt_tokens += int(usage.get("prompt_tokens", 0))
            self.completion_tokens += int(usage.get("completion_tokens", 0))


def run_load(
    base_url: str,
    workload: str,
    duration_s: float,
    concurrency: int = 8,
    seed: int = 0,
    max_requests: int | None = None,
) -> LoadResult:
    """Keep `concurrency` requests in flight for `duration_s` (no new request starts after it),
    then wait for those in flight. Raises ValueError for an unknown workload or a non-loopback
    URL."""
    make_request = _workload(workload)
    host, port = _loopback(base_url)
    if duration_s <= 0 or concurrency < 1:
        raise ValueError("duration_s must be > 0 and concurrency >= 1")
    tally = _Tally()
    started = time.monotonic()
    deadline = started + duration_s
    budget = threading.Semaphore(max_requests) if max_requests is not None else None

    run_tag = secrets.token_hex(4)  # differs between runs, even with the same seed

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        conn = http.client.HTTPConnection(host, port, timeout=_REQUEST_TIMEOUT_S)
        try:
            for n in itertools.count():
                if time.monotonic() >= deadline:
                    return
                if budget is not None and not budget.acquire(blocking=False):
                    return
                request = _tagged(make_request(rng), f"{run_tag}-{index:x}-{n:x}")
                conn = _send(conn, host, port, request, tally)
        finally:
            conn.close()

    threads = [
        threading.Thread(target=client, args=(i,), name=f"loadgen-{i}", daemon=True)
        for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration_s + _REQUEST_TIMEOUT_S + 5)
    elapsed = time.monotonic() - started
    return LoadResult(
        workload,
        tally.ok,
        tally.failed,
        tally.prompt_tokens,
        tally.completion_tokens,
        elapsed,
        tally.last_error,
    )


class BackgroundLoad:
    """The outcome of `background_load`, filled in when its thread has finished."""

    def __init__(self) -> None:
        self.result: LoadResult | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None  # the load generator, once started
        self.stopped = False  # ended early (`stop_on_exit`): no result to read

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        if self.stopped:  # the block ended before the generator started
            self.stop()

    def stop(self) -> None:
        """End the load generator now (its session: it and nothing else)."""
        self.stopped = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)


@contextlib.contextmanager
def background_load(
    base_url: str,
    workload: str = "mixed",
    duration_s: float = 10.0,
    concurrency: int = 8,
    seed: int = 0,
    stop_on_exit: bool = False,
) -> Iterator[BackgroundLoad]:
    """The load generator as a process of its own (`run_load_process`) while the body profiles
    the server; a thread here only waits for its result. On exit the thread is joined (the load
    is bounded by `duration_s`), so no client outlives the block. `stop_on_exit`: the load
    ends with the block (a body that needs load while it runs, not the load's result: its
    `duration_s` is then only an upper bound).

    Not `run_load` in a thread of the caller: the caller (a test, a sidecar under test) may sit
    in a starved scheduling group, as CI's runner session is (devtools/sidecar_proc.py), and its
    client threads then sent nothing for a whole window (CI-like: 0 tokens in 6.6 s)."""
    _workload(workload)  # fail here, in the caller's thread, on a bad name
    handle = BackgroundLoad()

    def target() -> None:
        try:
            handle.result = run_load_process(base_url, workload, duration_s, concurrency, seed,
                                             started=handle.started)  # fmt: skip
        except BaseException as error:  # handed to the caller, not lost in the thread
            if not handle.stopped:
                handle.error = error
        finally:
            handle.done.set()

    thread = threading.Thread(target=target, name=f"background-load-{workload}", daemon=True)
    thread.start()
    try:
        yield handle
    finally:
        if stop_on_exit:
            handle.stop()
        thread.join(duration_s + _REQUEST_TIMEOUT_S + 10)


def run_load_process(
    base_url: str,
    workload: str,
    duration_s: float,
    concurrency: int = 8,
    seed: int = 0,
    started: Callable[[subprocess.Popen[bytes]], object] = lambda proc: None,
) -> LoadResult:
    """`run_load` in a process of its own, in a session of its own, as real clients are: a load
    generator inside the profiler's process would compete with it for CPU (on a kernel with
    autogroup scheduling, inside the same scheduling group) and skew what is measured."""
    _workload(workload)
    argv = [sys.executable, "-m", "devtools.loadgen", "--url", base_url, "--workload", workload,
            "--duration", str(duration_s), "--concurrency", str(concurrency),
            "--seed", str(seed)]  # fmt: skip
    paths = [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, start_new_session=True) as proc:
        started(proc)
        try:
            out, _ = proc.communicate(timeout=duration_s + _REQUEST_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    if proc.returncode not in (0, 1):  # 1: it ran, some requests failed (the result says so)
        raise RuntimeError(f"load generator exited with {proc.returncode}")
    fields = json.loads(out)
    return LoadResult(**{k: fields[k] for k in LoadResult.__dataclass_fields__})


# What a keep-alive connection the server closed while it sat idle fails with: on sending
# (BrokenPipe, ConnectionReset) or, when the close crossed the request, before any status line.
_STALE = (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected)


def _send(
    conn: http.client.HTTPConnection, host: str, port: int, request: Request, tally: _Tally
) -> http.client.HTTPConnection:
    """One request on a keep-alive connection. The server closes a connection left idle
    (uvicorn after 5 s), and a client starved of CPU can leave one idle that long: a reused
    connection the server has closed is reopened before sending (urllib3's check), and a reused
    one that fails as stale is sent again once on a fresh connection, as HTTP clients do for a
    request the server never read (RFC 9112, 9.3.1). Any other failure is counted, and the
    connection replaced, not retried."""
    reused = conn.sock is not None
    if reused and _dropped(conn):
        conn.close()  # http.client reopens it on the next request
        reused = False
    try:
        try:
            status, payload = _post(conn, request)
        except _STALE:
            if not reused:
                raise
            conn.close()
            status, payload = _post(conn, request)
        if status != 200:
            tally.add(None, f"HTTP {status}: {payload[:300]!r}")
            return conn
        tally.add(_streamed_usage(payload) if request.stream else json.loads(payload)["usage"])
        return conn
    except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
        tally.add(None, repr(error))
        conn.close()
        time.sleep(_FAILURE_BACKOFF_S)  # a dead server must not turn this into a busy loop
        return http.client.HTTPConnection(host, port, timeout=_REQUEST_TIMEOUT_S)


def _streamed_usage(payload: bytes) -> dict[str, int]:
    """The `usage` of a streamed response: its last `data:` event that has one
    (`stream_options.include_usage`)."""
    for line in reversed(payload.decode().splitlines()):
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[len("data: ") :]).get("usage")
            if usage:
                return dict(usage)
    raise KeyError("usage: no event of the stream carried it")


def _post(conn: http.client.HTTPConnection, request: Request) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    conn.request("POST", "/v1/completions", body=request.body(), headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle keep-alive connection is readable: the server closed it (EOF) or broke
    the protocol; either way it cannot carry another request."""
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


# `mixed+prefill-heavy:20`: the mixed load with 20 % of its requests replaced by prefill-heavy
# ones, the steps of the diff's power curve (benchmarks/diff_power.py).
_MIXTURE = re.compile(r"mixed\+prefill-heavy:(\d{1,3})")


def _workload(name: str) -> Callable[[random.Random], Request]:
    if (m := _MIXTURE.fullmatch(name)) is not None and int(m[1]) <= 100:
        share = int(m[1]) / 100

        def mixture(rng: random.Random) -> Request:
            return _prefill_heavy(rng) if rng.random() < share else _mixed(rng)

        return mixture
    try:
        return WORKLOADS[name]
    except KeyError:
        valid = ", ".join(sorted(WORKLOADS))
        raise ValueError(
            f"unknown workload {name!r}; valid workloads: {valid}, or mixed+prefill-heavy:P "
            "(P % of the mixed load's requests prefill-heavy)"
        ) from None


def _loopback(base_url: str) -> tuple[str, int]:
    """The load generator only ever targets this machine: it is a test tool, not a stressor."""
    parsed = urllib.parse.urlsplit(base_url)
    host = parsed.hostname or ""
    if parsed.scheme != "http" or host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"loadgen only targets loopback http URLs, got {base_url!r}")
    return host, parsed.port or 80


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--workload", default="mixed", help=f"one of: {', '.join(WORKLOADS)}")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-requests", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        result = run_load(
            args.url, args.workload, args.duration, args.concurrency, args.seed, args.max_requests
        )
    except ValueError as error:
        parser.error(str(error))
    print(json.dumps(result.to_dict(), indent=2))
    return 0 if result.requests_failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
