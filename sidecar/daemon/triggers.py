"""Snapshots on a trigger: SIGUSR1, `vllm-sidecar trigger` over a local socket, and a latency
or queue threshold read from vLLM's /metrics.

Each becomes a `TriggerRequest` with its `Cause`; the daemon takes one snapshot per request (a
short window of its own, beside continuous sampling) and records the cause in its summary.
The socket is a Unix socket (mode 0600, in the output folder by default): never a network
port. Its protocol is one JSON line each way, twice from the daemon: `{"accepted": true}` at
once, then `{"path": ...}` or `{"error": ...}` when the snapshot is written or not (a fleet
daemon's `path` holds every deployment's folder, one a line).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.config.settings import TriggerConfig
from sidecar.errors import TriggerError
from sidecar.records.summary import Cause, CauseKind
from sidecar.vllm_metrics import MetricsScrape, serving_figures
from sidecar.vllm_metrics.figures import WAITING

log = logging.getLogger("vllm_sidecar")
MAX_LINE = 4096
# The folders a triggered snapshot was written to (a fleet: one per deployment up; none when
# it was not taken) and why not.
Reply = Callable[[tuple[str, ...], str | None], None]


def cause_now(kind: CauseKind, detail: str, wall: float | None = None) -> Cause:
    at = datetime.fromtimestamp(time.time() if wall is None else wall, tz=UTC)
    return Cause(kind, detail, at.isoformat(timespec="seconds"))


@dataclass(frozen=True, slots=True)
class TriggerRequest:
    cause: Cause
    # Told the outcome: the snapshot's folders, or why there is none.
    reply: Reply = lambda folders, error: None


class TriggerQueue:
    """Requests from signal handlers, the socket and the watch; the trigger thread takes them.
    Bounded: a burst of triggers beyond a few takes no more snapshots than a few."""

    def __init__(self, size: int = 4) -> None:
        self._q: queue.Queue[TriggerRequest] = queue.Queue(maxsize=size)

    def put(self, request: TriggerRequest) -> bool:
        try:
            self._q.put_nowait(request)
        except queue.Full:
            request.reply((), "the daemon is already taking several triggered snapshots")
            return False
        return True

    def get(self, timeout_s: float) -> TriggerRequest | None:
        try:
            return self._q.get(timeout=timeout_s)
        except queue.Empty:
            return None


@dataclass
class LatencyTrigger:
    """p95 time to first token over the last `over_s`, or the queue's length, above the
    configured thresholds: a cause, at most once in `min_interval_s`."""

    config: TriggerConfig
    clock: Callable[[], float] = time.monotonic
    _history: collections.deque[MetricsScrape] = field(default_factory=collections.deque)
    _fired_at: float | None = None

    @property
    def enabled(self) -> bool:
        return self.config.ttft_p95_s is not None or self.config.queue_length is not None

    def check(self, scrape: MetricsScrape) -> Cause | None:
        if not self.enabled or not scrape.ok:
            return None
        c = self.config
        self._history.append(scrape)
        while len(self._history) > 1 and scrape.taken_at - self._history[1].taken_at >= c.over_s:
            self._history.popleft()  # keep the newest scrape at least over_s old
        if self._fired_at is not None and self.clock() - self._fired_at < c.min_interval_s:
            return None
        cause = self._queue(scrape) or self._ttft(scrape)
        if cause is not None:
            self._fired_at = self.clock()
        return cause

    def _queue(self, scrape: MetricsScrape) -> Cause | None:
        limit = self.config.queue_length
        name = scrape.first_present(WAITING)
        if limit is None or name is None:
            return None
        waiting = sum(v for _, v in scrape.samples[name])
        if waiting < limit:
            return None
        detail = f"{waiting:.0f} requests waiting (trigger.queue_length: {limit})"
        return cause_now(CauseKind.QUEUE, detail, scrape.wall)

    def _ttft(self, scrape: MetricsScrape) -> Cause | None:
        limit, oldest = self.config.ttft_p95_s, self._history[0]
        span = scrape.taken_at - oldest.taken_at
        if limit is None or span < 0.9 * self.config.over_s:
            return None  # not yet a whole span to judge
        p95 = serving_figures(oldest, scrape).ttft_p95_s
        if p95 is None or p95 <= limit:
            return None
        detail = (f"p95 time to first token {p95:.2f} s over the last {span:.0f} s "
                  f"(trigger.ttft_p95_s: {limit:g} s)")  # fmt: skip
        return cause_now(CauseKind.LATENCY, detail, scrape.wall)


# ------------------------------------------------------------------------------ the socket


def socket_path(config_socket: Path | None, output_dir: Path) -> Path:
    return config_socket if config_socket is not None else output_dir / "control.sock"


class ControlSocket:
    """The daemon's end: accepts `{"command": "snapshot", "reason": ...}` lines."""

    def __init__(self, path: Path, requests: TriggerQueue, wait_s: float) -> None:
        self.path, self._requests, self._wait_s = path, requests, wait_s
        self._sock: socket.socket | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Bind (a stale socket file of a killed daemon is replaced) and serve in a thread;
        a path that cannot be bound is said and the daemon carries on without it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if self.path.is_socket():
                    self.path.unlink()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # created 0600: the daemon's user (and root) only
            try:
                sock.bind(str(self.path))
            finally:
                os.umask(old)
            sock.listen(4)
            sock.settimeout(1.0)
        except OSError as exc:
            log.error("control socket %s not opened (%s): `vllm-sidecar trigger` cannot reach "
                      "this daemon; SIGUSR1 still works. Set trigger.socket to a writable path",
                      self.path, exc)  # fmt: skip
            return
        self._sock = sock
        threading.Thread(target=self._serve, name="control-socket", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5.0)
            try:
                message = json.loads(_read_line(conn))
                if not isinstance(message, dict) or message.get("command") != "snapshot":
                    raise ValueError('expected {"command": "snapshot"}')
                reason = str(message.get("reason") or "vllm-sidecar trigger")[:500]
            except (ValueError, OSError) as exc:
                _send(conn, {"error": f"bad request: {exc}"})
                return
            except RecursionError:  # a line of JSON nested thousands deep (issue 26, item 16)
                _send(conn, {"error": "bad request: nested too deep"})
                return
            done = threading.Event()
            outcome: dict[str, Any] = {}

            def reply(folders: tuple[str, ...], error: str | None) -> None:
                # One line of JSON: a fleet's folders, one a line inside its `path`.
                outcome.update(path="\n".join(folders) or None, error=error)
                done.set()

            if not self._requests.put(TriggerRequest(cause_now(CauseKind.SOCKET, reason), reply)):
                _send(conn, {"error": outcome.get("error") or "not accepted"})
                return
            _send(conn, {"accepted": True})
            if done.wait(self._wait_s):
                _send(conn, outcome)
            else:
                _send(conn, {"error": f"no snapshot within {self._wait_s:.0f} s"})


def _read_line(conn: socket.socket) -> str:
    data = b""
    while b"\n" not in data and len(data) < MAX_LINE:
        chunk = conn.recv(1024)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode()


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall((json.dumps(message) + "\n").encode())


def _connect(sock: socket.socket, path: Path) -> None:
    try:
        sock.connect(str(path))
    except FileNotFoundError:
        raise TriggerError(
            f"no control socket at {path}: is `vllm-sidecar run` running with "
            "this config? (trigger.socket, or OUTPUT_DIR/control.sock)"
        ) from None
    except PermissionError:
        raise TriggerError(f"{path}: permission denied; run as the daemon's user or root") from None
    except OSError as exc:
        raise TriggerError(
            f"{path}: {exc}; is the daemon running? (a stale socket file stays "
            "after a killed daemon until it starts again)"
        ) from None


def request_snapshot(path: Path, reason: str, timeout_s: float) -> str:
    """The client's end (`vllm-sidecar trigger`): the folder of the snapshot taken."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        _connect(sock, path)
        _send(sock, {"command": "snapshot", "reason": reason})
        try:
            with sock.makefile("r") as reader:
                lines = [json.loads(line) for line in reader]
        except (TimeoutError, ValueError) as exc:
            why = f"no answer from the daemon within {timeout_s:g} s ({exc})"
            raise TriggerError(why) from None
    last = lines[-1] if lines else {"error": "the daemon closed the connection"}
    if last.get("path"):
        return str(last["path"])
    raise TriggerError(f"the daemon took no snapshot: {last.get('error') or last}")
