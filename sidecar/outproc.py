"""Writing Parquet without keeping pandas and pyarrow in the daemon: one forked child per
snapshot write.

pyarrow resident costs the long-lived daemon about 40 MiB and pandas 40 more (measured here:
32 MiB with the daemon's own modules, 76 with pyarrow, 114 with pandas). The daemon writes a
snapshot every few minutes; a child forked for the write imports them, writes the folder and
the trend table's row, and exits, so the daemon stays near its own size. The child's CPU (the
import, about 0.4 s) is counted in the sidecar's budget (`child_cpu_s`).

Only the daemon turns it on (`enable()`); a one-shot command writes in its own process. A child
that fails to fork, dies or hangs past its timeout is said, and the write is done in-process
(pyarrow then stays resident: better than a lost snapshot).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from sidecar.errors import OutputError

log = logging.getLogger("vllm_sidecar")
T = TypeVar("T")
TIMEOUT_S = 120.0
_state = {"enabled": False, "child_cpu_s": 0.0, "fallbacks": 0}


def enable(on: bool = True) -> None:
    _state["enabled"] = on


def child_cpu_s() -> float:
    """CPU seconds of every write child reaped so far."""
    return float(_state["child_cpu_s"])


def call(fn: Callable[[], T], timeout_s: float = TIMEOUT_S) -> T:
    """`fn()` in a forked child when enabled (its JSON-able result handed back; OSError and
    OutputError raised again here with their text and errno), else in this process."""
    if not _state["enabled"]:
        return fn()
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        return _fallback(fn, f"fork failed: {exc}")
    if pid == 0:  # the child: no logging, no threads of its own; out by os._exit only
        os.close(read_fd)
        code = 0
        try:
            message: dict[str, Any] = {"ok": fn()}
        except BaseException as exc:
            code = 1
            message = {"error": str(exc), "type": type(exc).__name__,
                       "errno": getattr(exc, "errno", None),
                       "trace": traceback.format_exc(limit=5)}  # fmt: skip
        try:
            os.write(write_fd, json.dumps(message).encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    return _wait(pid, read_fd, fn, timeout_s)


def _wait(pid: int, read_fd: int, fn: Callable[[], T], timeout_s: float) -> T:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    os.set_blocking(read_fd, False)
    try:
        while True:
            try:
                while chunk := os.read(read_fd, 65536):
                    chunks.append(chunk)
            except BlockingIOError:
                pass
            reaped, status, usage = os.wait4(pid, os.WNOHANG)
            if reaped == pid:
                _state["child_cpu_s"] = child_cpu_s() + usage.ru_utime + usage.ru_stime
                try:
                    while chunk := os.read(read_fd, 65536):
                        chunks.append(chunk)
                except BlockingIOError:
                    pass
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return _fallback(fn, f"the write child took over {timeout_s:g} s and was killed")
            time.sleep(0.02)
    finally:
        os.close(read_fd)
    try:
        message = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        message = {}
    if "ok" in message:
        return message["ok"]  # type: ignore[no-any-return]
    if "error" not in message:
        return _fallback(fn, f"the write child died ({os.waitstatus_to_exitcode(status)})")
    if message["type"] in ("OSError", "FileNotFoundError", "PermissionError") or message["errno"]:
        raise OSError(message["errno"] or 0, message["error"])
    if message["type"] == "OutputError":
        raise OutputError(message["error"])
    raise RuntimeError(f"the write child failed: {message['type']}: {message['error']}\n"
                       f"{message.get('trace', '')}")  # fmt: skip


def _fallback(fn: Callable[[], T], why: str) -> T:
    _state["fallbacks"] = int(_state["fallbacks"]) + 1
    log.warning("%s; writing in the daemon's own process instead (pandas and pyarrow then stay "
                "loaded in it)", why)  # fmt: skip
    return fn()
