"""The systemd notifier against real AF_UNIX datagram sockets: a path in tmp_path and an
abstract name, standing in for systemd's `$NOTIFY_SOCKET`."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.daemon.notify import SystemdNotifier, socket_address, watchdog_interval


def _receiver(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5.0)  # the datagram is queued before send returns; this only bounds a bug
    return sock


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound socket and the NOTIFY_SOCKET value that names it."""
    path = tmp_path / "notify"
    assert len(str(path)) < 108, "sun_path is 108 bytes"
    sock = _receiver(str(path))
    try:
        yield sock, str(path)
    finally:
        sock.close()


def test_ready_carries_status(systemd: tuple[socket.socket, str]) -> None:
    sock, path = systemd
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("profiling vLLM pid 42") is True
    assert sock.recv(4096) == b"READY=1\nSTATUS=profiling vLLM pid 42"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda n: n.ready(), b"READY=1"),
        (lambda n: n.status("window 3 of 4"), b"STATUS=window 3 of 4"),
        (lambda n: n.status("two\nlines"), b"STATUS=two lines"),  # one variable per line
        (lambda n: n.stopping(), b"STOPPING=1"),
        (lambda n: n.watchdog(), b"WATCHDOG=1"),
        (lambda n: n.reloading(), b"RELOADING=1\nMONOTONIC_USEC=1234567"),
    ],
)
def test_each_message(
    systemd: tuple[socket.socket, str], call: Callable[[SystemdNotifier], bool], expected: bytes
) -> None:
    sock, path = systemd
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path}, monotonic_ns=lambda: 1_234_567_890)
    assert call(notifier) is True
    assert sock.recv(4096) == expected


def test_reloading_uses_the_monotonic_clock_by_default(
    systemd: tuple[socket.socket, str],
) -> None:
    sock, path = systemd
    before = time.monotonic_ns() // 1000
    SystemdNotifier({"NOTIFY_SOCKET": path}).reloading()
    after = time.monotonic_ns() // 1000
    lines = sock.recv(4096).decode().splitlines()
    assert lines[0] == "RELOADING=1"
    key, _, usec = lines[1].partition("=")
    assert key == "MONOTONIC_USEC" and before <= int(usec) <= after


def test_abstract_socket() -> None:
    name = f"vllm-sidecar-test-{uuid.uuid4().hex}"
    sock = _receiver(b"\0" + name.encode())
    try:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": f"@{name}"})
        assert notifier.address == b"\0" + name.encode()
        assert notifier.watchdog() is True
        assert sock.recv(4096) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_without_notify_socket_every_call_is_a_no_op() -> None:
    notifier = SystemdNotifier({})
    assert not notifier.enabled
    assert [notifier.ready("x"), notifier.status("x"), notifier.reloading(),
            notifier.stopping(), notifier.watchdog()] == [False] * 5  # fmt: skip


def test_reads_os_environ_by_default(
    systemd: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = systemd
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert SystemdNotifier().stopping() is True
    assert sock.recv(4096) == b"STOPPING=1"


def test_a_vanished_socket_is_logged_once_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "notify"
    _receiver(str(path)).close()  # systemd went away: the path exists, nobody listens
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(path)})
    with caplog.at_level(logging.WARNING, logger="vllm_sidecar"):
        results = [notifier.watchdog() for _ in range(3)]
        os.unlink(path)
        results.append(notifier.status("still here"))  # now the path is gone too
    assert results == [False] * 4
    failures = [r for r in caplog.records if "systemd notification" in r.getMessage()]
    assert len(failures) == 1 and str(path) in failures[0].getMessage()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/run/systemd/notify", "/run/systemd/notify"),
        ("@/org/freedesktop/systemd1/notify/123", b"\0/org/freedesktop/systemd1/notify/123"),
        ("", None),
        ("@", None),
        ("vsock:2:1234", None),  # systemd >= 254 in a VM: not for a sidecar
        ("relative/path", None),
    ],
)
def test_socket_address(value: str, expected: str | bytes | None) -> None:
    assert socket_address(value) == expected


OUR_PID = os.getpid()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),  # WatchdogSec=30s: ping every 15 s
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(OUR_PID)}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(OUR_PID + 1)}, None),  # a parent's
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_USEC": "1"}, 0.0000005),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "30s"}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_PID": str(OUR_PID)}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(environ) == (pytest.approx(expected) if expected is not None else None)


def test_watchdog_pid_can_be_injected() -> None:
    environ = {"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "7"}
    assert watchdog_interval(environ, pid=7) == 5.0
    assert watchdog_interval(environ, pid=8) is None
