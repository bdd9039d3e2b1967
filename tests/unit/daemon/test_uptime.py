"""The target's comings and goings as both daemons keep them (sidecar/daemon/uptime.py): the
rediscovery's backoff, on a fake clock."""

from __future__ import annotations

import pytest

from sidecar.daemon.uptime import backoff
from tests.unit.daemon.test_daemon_loop import T0, FakeTime


def test_backoff_doubles_to_thirty_seconds_and_returns_what_it_found() -> None:
    time = FakeTime()
    tries: list[float] = []

    def find() -> str | None:
        tries.append(time.now - T0)
        return "found" if time.now - T0 >= 150 else None

    def sleep(seconds: float) -> bool:
        time.advance(seconds)
        return False

    assert backoff(find, sleep) == "found"
    assert tries == [0, 1, 3, 7, 15, 31, 61, 91, 121, 151]


def test_backoff_ends_with_none_when_a_sleep_is_stopped() -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return len(slept) == 3  # asked to stop during the third wait

    assert backoff(lambda: None, sleep) is None
    assert slept == [1, 2, 4]


def test_a_deadline_is_the_finders_error() -> None:
    def find() -> None:
        raise TimeoutError("waited 120 s")

    with pytest.raises(TimeoutError, match="waited 120 s"):
        backoff(find, lambda seconds: False)
