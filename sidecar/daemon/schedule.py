"""When windows start: absolute deadlines on a monotonic clock, baselines on the wall clock.

Regular windows start every `interval_s` from the first, on deadlines that do not drift (a late
window does not push the next one). Baselines start on wall-clock multiples of
`baseline_every_s` (on the hour by default), so baselines of a fleet line up in time. A pure
state machine: the daemon asks `plan()`, waits, runs the window and reports `done()`.

In continuous mode (`continuous=True`) the windows are periods back to back, each ending on a
wall-clock multiple of `interval_s` (so that twelve of them make the hour and a fleet's periods
line up); a first period shorter than half an interval runs on to the next multiple.
Baselines are then not windows of their own but the hour's periods put together (daemon.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config.settings import ScheduleConfig
from sidecar.store.layout import SnapshotKind


@dataclass(frozen=True, slots=True)
class PlannedWindow:
    kind: SnapshotKind
    start: float  # monotonic deadline
    start_wall: float  # the same moment on the wall clock, for logs and the exporter
    duration_s: float | None = None  # continuous mode: the period's length; None: window_s


class Schedule:
    def __init__(
        self,
        config: ScheduleConfig,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        rng: random.Random | None = None,
        continuous: bool = False,
    ) -> None:
        self.config = config
        self.continuous = continuous
        self._clock, self._wall = clock, wall_clock
        self._rng = rng or random.Random()
        self._next = clock()  # the first regular window starts at once
        self._next_baseline_wall = _next_multiple(wall_clock(), config.baseline_every_s)
        self.missed = 0  # regular deadlines that passed while a window (or an outage) ran
        self.lateness_s = 0.0  # how late the last window started against its deadline

    def begin(self) -> None:
        """The target is found: the first regular window starts now. The wait before (for vLLM
        to start) missed nothing and makes no window late."""
        self._next = self._clock()
        self._next_baseline_wall = _next_multiple(self._wall(), self.config.baseline_every_s)
        self.lateness_s = 0.0

    def plan(self) -> PlannedWindow:
        now, wall = self._clock(), self._wall()
        if self.continuous:
            return self._period(now, wall)
        baseline_at = now + (self._next_baseline_wall - wall)
        if baseline_at <= self._next + 1e-6:
            return PlannedWindow(SnapshotKind.BASELINE, baseline_at, self._next_baseline_wall)
        start = self._next + self._jitter()
        return PlannedWindow(SnapshotKind.SNAPSHOT, start, wall + (start - now))

    def _period(self, now: float, wall: float) -> PlannedWindow:
        """The next continuous period: from now to the next wall-clock multiple of the
        interval, or the one after when that is too close to make a period of its own."""
        interval = self.config.interval_s
        end = _next_multiple(wall, interval)
        if end - wall < interval / 2:
            end += interval
        return PlannedWindow(SnapshotKind.SNAPSHOT, now, wall, duration_s=end - wall)

    def started(self, planned: PlannedWindow) -> None:
        self.lateness_s = max(0.0, self._clock() - planned.start)

    def done(self, planned: PlannedWindow) -> None:
        """Advance past what has passed; deadlines skipped because a window overran are missed,
        except the one a baseline replaced."""
        now = self._clock()
        if self.continuous:  # periods follow one another: none is missed, none late
            self._next = now
            return
        if planned.kind is SnapshotKind.BASELINE:
            self._next_baseline_wall = _next_multiple(self._wall(), self.config.baseline_every_s)
            if self._next <= now:  # the regular window that fell inside the baseline
                self._next += self.config.interval_s
        else:
            self._next += self.config.interval_s
        while self._next <= now:
            self._next += self.config.interval_s
            self.missed += 1

    def skip_until(self, now: float) -> None:
        """The target was down: every deadline up to now passed without a window. The next
        regular window stays on the grid, and the outage is no window's lateness."""
        while self._next <= now:
            self._next += self.config.interval_s
            self.missed += 1
        wall = self._wall()
        if self._next_baseline_wall <= wall:
            self._next_baseline_wall = _next_multiple(wall, self.config.baseline_every_s)

    def _jitter(self) -> float:
        return self._rng.uniform(0, self.config.jitter_s) if self.config.jitter_s > 0 else 0.0


def _next_multiple(wall: float, period: float) -> float:
    """The next wall-clock multiple of `period` strictly after `wall` (an hour: on the hour)."""
    return (math.floor(wall / period) + 1) * period
