"""The target's comings and goings as both daemons keep them (sidecar/daemon/uptime.py): the
rediscovery's backoff and one deployment's outages, on a fake clock and a fake store."""

from __future__ import annotations

import pytest

from sidecar.daemon.uptime import Uptime, backoff
from sidecar.exporter import ExporterState
from tests.unit.daemon.test_daemon_loop import T0, FakeStore, FakeTime, deployment, iso


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


def uptime() -> tuple[Uptime, FakeStore, ExporterState, FakeTime]:
    store, time = FakeStore(), FakeTime()
    state = ExporterState(clock=time.wall)
    return Uptime(lambda: store, state, time.clock, time.wall), store, state, time


def test_an_outage_is_one_gap_open_until_found_and_a_restart() -> None:
    up, store, state, time = uptime()
    assert up.found() is False  # the first attach: no restart
    first = deployment(100)
    time.advance(50)
    assert up.went(first, "the target exited") is True
    assert up.went(None, "the target is gone") is False  # the same outage: one gap
    assert store.gaps == [{"from": iso(T0 + 50), "to": None, "reason": "the target exited"}]
    assert state.view.target is not None and not state.view.target.up
    assert up.down and up.since_clock == T0 + 50 and up.lost is first
    time.advance(30)
    assert up.found() is True
    assert store.gaps == [{"from": iso(T0 + 50), "to": iso(T0 + 80), "reason": "the target exited"}]
    assert up.restarts == 1 and not up.down and up.lost is None
    assert state.view.target is not None and state.view.target.up
    assert state.view.target.restarts == 1


def test_a_remnant_of_the_lost_deployment_is_told_apart() -> None:
    up, *_ = uptime()
    whole = deployment(100)
    up.found()
    up.went(whole, "the target exited")
    assert up.remnant(deployment(100, engine=False))  # its API server lingers
    assert not up.remnant(deployment(200))


def test_close_ends_an_open_gap_and_nothing_when_up() -> None:
    up, store, _, time = uptime()
    up.found()
    up.close()
    assert store.gaps == []
    up.went(deployment(100), "gone")
    time.advance(10)
    up.close()
    assert store.gaps == [{"from": iso(T0), "to": iso(T0 + 10), "reason": "gone"}]
