"""Snapshots on a trigger (sidecar/daemon/triggers.py): the latency and queue triggers on real /metrics
scrapes, and the control socket's round trip (a Unix socket in this process; no daemon)."""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path

import pytest

from sidecar.config.settings import TriggerConfig
from sidecar.daemon.triggers import (
    ControlSocket,
    LatencyTrigger,
    TriggerQueue,
    request_snapshot,
    socket_path,
)
from sidecar.errors import InputError, TriggerError
from sidecar.store.summary_io import read_summary
from sidecar.vllm_metrics import MetricsScrape, parse_scrape

METRICS = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"
BEFORE = (METRICS / "v0.32.0-cpu-before.txt").read_text()
AFTER = (METRICS / "v0.32.0-cpu-after.txt").read_text()


def scrape(text: str, at: float, waiting: float | None = None) -> MetricsScrape:
    if waiting is not None:
        text = re.sub(r"(vllm:num_requests_waiting{[^}]*}) \S+", rf"\g<1> {waiting}", text)
    return parse_scrape(text, url="http://127.0.0.1:8000/metrics", taken_at=at, wall=1.7e9 + at)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_latency_trigger_fires_on_p95_ttft_over_its_span_once_per_min_interval() -> None:
    # The recorded pair: 358 requests in 10 s of mixed load on 2 cores; their p95 TTFT is
    # well above 1 ms and below 60 s.
    clock = Clock()
    low = LatencyTrigger(TriggerConfig(ttft_p95_s=60.0, over_s=10.0), clock)
    assert low.check(scrape(BEFORE, 0.0)) is None
    assert low.check(scrape(AFTER, 10.0)) is None
    trigger = LatencyTrigger(TriggerConfig(ttft_p95_s=0.001, over_s=10.0, min_interval_s=600),
                             clock)  # fmt: skip
    assert trigger.check(scrape(BEFORE, 0.0)) is None  # no span yet
    cause = trigger.check(scrape(AFTER, 10.0))
    assert cause is not None and cause.kind == "latency"
    assert (
        "p95 time to first token" in cause.detail and "trigger.ttft_p95_s: 0.001 s" in cause.detail
    )
    clock.t = 300.0  # rate-limited
    assert trigger.check(scrape(AFTER, 300.0)) is None
    clock.t = 700.0
    assert trigger.check(scrape(BEFORE, 690.0)) is None  # counters went back: a restart, no p95


def test_the_queue_trigger_fires_at_its_length() -> None:
    clock = Clock()
    trigger = LatencyTrigger(TriggerConfig(queue_length=8), clock)
    assert trigger.check(scrape(AFTER, 0.0, waiting=7)) is None
    cause = trigger.check(scrape(AFTER, 5.0, waiting=8))
    assert cause is not None and cause.kind == "queue"
    assert cause.detail == "8 requests waiting (trigger.queue_length: 8)"


def test_triggers_are_off_by_default() -> None:
    trigger = LatencyTrigger(TriggerConfig())
    assert not trigger.enabled and trigger.check(scrape(AFTER, 0.0, waiting=1000)) is None


def test_the_socket_takes_a_request_and_hands_back_the_snapshot_folder(tmp_path: Path) -> None:
    requests = TriggerQueue()
    server = ControlSocket(socket_path(None, tmp_path), requests, wait_s=10)
    server.start()
    assert (tmp_path / "control.sock").stat().st_mode & 0o777 == 0o600

    def daemon() -> None:
        request = requests.get(5.0)
        assert request is not None and request.cause.kind == "socket"
        request.reply((f"/out/{request.cause.detail}",), None)

    t = threading.Thread(target=daemon)
    t.start()
    try:
        assert request_snapshot(tmp_path / "control.sock", "why-not", 10) == "/out/why-not"
    finally:
        t.join()
        server.close()
    assert not (tmp_path / "control.sock").exists()


def test_a_fleets_folders_are_one_a_line_in_the_socket_reply(tmp_path: Path) -> None:
    """The daemon hands back a tuple of folders; only the socket's one JSON line joins them."""
    requests = TriggerQueue()
    server = ControlSocket(socket_path(None, tmp_path), requests, wait_s=10)
    server.start()
    folders = ("/out/h/m@8000/20261202T120000Z", "/out/h/m@8001/20261202T120000Z")

    def daemon() -> None:
        request = requests.get(5.0)
        assert request is not None
        request.reply(folders, None)

    t = threading.Thread(target=daemon)
    t.start()
    try:
        assert request_snapshot(tmp_path / "control.sock", "all", 10) == "\n".join(folders)
    finally:
        t.join()
        server.close()


def test_no_folder_is_the_error_in_the_socket_reply(tmp_path: Path) -> None:
    requests = TriggerQueue()
    server = ControlSocket(socket_path(None, tmp_path), requests, wait_s=10)
    server.start()

    def daemon() -> None:
        request = requests.get(5.0)
        assert request is not None
        request.reply((), "no vLLM target attached now")

    t = threading.Thread(target=daemon)
    t.start()
    try:
        with pytest.raises(TriggerError, match="took no snapshot: no vLLM target attached now"):
            request_snapshot(tmp_path / "control.sock", "x", 10)
    finally:
        t.join()
        server.close()


def test_the_client_names_the_fix_when_no_daemon_listens(tmp_path: Path) -> None:
    with pytest.raises(TriggerError, match="is `vllm-sidecar run` running"):
        request_snapshot(tmp_path / "control.sock", "x", 1)


def test_a_full_queue_refuses_with_a_reason() -> None:
    q = TriggerQueue(size=1)
    from sidecar.daemon.triggers import TriggerRequest, cause_now
    from sidecar.records.summary import CauseKind

    said: list[str | None] = []
    assert q.put(TriggerRequest(cause_now(CauseKind.SIGNAL, "SIGUSR1")))
    assert not q.put(
        TriggerRequest(cause_now(CauseKind.SIGNAL, "SIGUSR1"), lambda p, e: said.append(e))
    )
    assert said and "already taking" in str(said[0])


def test_a_request_nested_thousands_deep_is_a_bad_request(tmp_path: Path) -> None:
    # Issue 26, item 16: the handler thread died on RecursionError, answering nothing.
    server = ControlSocket(socket_path(None, tmp_path), TriggerQueue(), wait_s=10)
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(str(tmp_path / "control.sock"))
            conn.sendall(b"[" * 5000 + b"]" * 5000 + b"\n")
            reply = json.loads(conn.makefile().readline())
        assert reply == {"error": "bad request: nested too deep"}
    finally:
        server.close()


def test_a_summary_nested_thousands_deep_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nested too deep"):
        read_summary(tmp_path)
