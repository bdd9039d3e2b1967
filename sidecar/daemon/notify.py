"""systemd's notify protocol, spoken directly: one datagram per message on `$NOTIFY_SOCKET`.

The protocol is a few `KEY=VALUE` lines sent to an AF_UNIX datagram socket (sd_notify(3)), so
it needs no `systemd` Python package and no libsystemd. Outside systemd (a container, a
terminal) `NOTIFY_SOCKET` is unset and every call does nothing.

A failed send never raises: the unit's watchdog or start timeout is what notices a sidecar that
cannot reach systemd, and a profiler must not stop profiling over it. It is logged once.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("vllm_sidecar")


class SystemdNotifier:
    """`ready()`, `status()`, `reloading()`, `stopping()`, `watchdog()` for a Type=notify unit.

    `environ` is injected (default `os.environ`); `monotonic_ns` must read CLOCK_MONOTONIC,
    which is what `time.monotonic_ns` reads on Linux and what systemd compares against.
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        env = os.environ if environ is None else environ
        self.address = socket_address(env.get("NOTIFY_SOCKET", ""))
        self._monotonic_ns = monotonic_ns
        self._failed = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *_status(status))

    def status(self, text: str) -> bool:
        return self.send(*_status(text))

    def reloading(self) -> bool:
        # Type=notify-reload (systemd >= 253) wants the reload's start time, to tell this
        # reload's READY=1 from an earlier one; older systemd ignores the extra line.
        return self.send("RELOADING=1", f"MONOTONIC_USEC={self._monotonic_ns() // 1000}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def send(self, *lines: str) -> bool:
        """One datagram of `lines`; False when there is no socket or the send failed."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as error:
            if not self._failed:
                self._failed = True
                log.warning("systemd notification to %r failed: %s (not logged again)",
                            self.address, error)  # fmt: skip
            return False
        return True


def socket_address(value: str) -> str | bytes | None:
    """`/run/systemd/notify` as is, `@name` as the abstract `\\0name`; anything else None."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value:  # vsock:CID:PORT (systemd >= 254, for VMs) is not needed by a sidecar
        log.warning("NOTIFY_SOCKET=%r is not a unix socket path; not notifying systemd", value)
    return None


def watchdog_interval(environ: Mapping[str, str], pid: int | None = None) -> float | None:
    """How often to send WATCHDOG=1: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3) advises.

    None when there is no watchdog, when the value is not a positive integer, or when
    `WATCHDOG_PID` names another process (the variables leaked from a parent).
    """
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner is not None:
        try:
            if int(owner) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            return None
    return usec / 2 / 1_000_000


def _status(text: str | None) -> tuple[str, ...]:
    # One line per variable: a newline inside STATUS= would start a new assignment.
    return () if text is None else (f"STATUS={' '.join(text.splitlines())}",)
