"""A target's comings and goings, kept one way for the single daemon and each fleet deployment:
the rediscovery's backoff, and the outage bookkeeping (one gap per outage, `target_up`, the
restarts counted when it is found again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sidecar.daemon.parts import Store
from sidecar.exporter import ExporterState
from sidecar.target.discovery import Deployment

T = TypeVar("T")
FIRST_WAIT_S = 1.0
BACKOFF_MAX_S = 30.0


def backoff(find: Callable[[], T | None], sleep: Callable[[float], bool]) -> T | None:
    """`find()` at once, then after 1, 2, 4 ... s (at most 30 s) until it finds something;
    None when `sleep(seconds)` says the daemon was asked to stop meanwhile. A wait with a
    deadline is `find`'s to end: it raises the error that names what it waited for."""
    delay = FIRST_WAIT_S
    while (found := find()) is None:
        if sleep(delay):
            return None
        delay = min(delay * 2, BACKOFF_MAX_S)
    return found


@dataclass
class Uptime:
    """One deployment's outages. An outage is one gap in its store, left open from the moment
    the target went (so a crash of the daemon leaves it open, not lost) and closed when the
    target is found again or the daemon stops; `target_up` is 0 meanwhile. `store` is a
    getter: a reload may replace the store."""

    store: Callable[[], Store]
    state: ExporterState
    clock: Callable[[], float]
    wall: Callable[[], float]
    restarts: int = 0
    lost: Deployment | None = None  # the deployment last lost, until another is found
    since_wall: float | None = None  # the outage's start; None while up
    since_clock: float | None = None  # the same moment on the monotonic clock
    reason: str = ""

    @property
    def down(self) -> bool:
        return self.since_wall is not None

    def went(self, target: Deployment | None, reason: str) -> bool:
        """`target` went away (None: it was already); the outage's gap opens, once. True when
        this began the outage."""
        if target is not None:
            self.lost = target
        if self.since_wall is not None:
            return False
        self.since_wall, self.since_clock, self.reason = self.wall(), self.clock(), reason
        self.store().record_gap(self.since_wall, None, reason)  # open until found again
        self.state.update_target(False, self.restarts, self.since_wall)
        return True

    def remnant(self, target: Deployment) -> bool:
        """`target` is what is left of the deployment lost (a server shutting down)."""
        return self.lost is not None and target.is_remnant_of(self.lost)

    def found(self) -> bool:
        """A target is attached: an outage's gap closes and a restart is counted. True when
        it ended an outage (False: the first attach)."""
        restarted = self.since_wall is not None
        self.close()
        if restarted:
            self.restarts += 1
        self.lost, self.since_wall, self.since_clock, self.reason = None, None, None, ""
        self.state.update_target(True, self.restarts, None)
        return restarted

    def close(self) -> None:
        """The outage's gap ends now (the target found, or the daemon stopping): a gap ends
        where the record ends."""
        if self.since_wall is not None:
            self.store().record_gap(self.since_wall, self.wall(), self.reason)
