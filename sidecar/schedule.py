"""When windows start: absolute deadlines on a monotonic clock, baselines on the wall clock.

Regular windows start every `interval_s` from the first, on deadlines that do not drift (a late
window does not push the next one). Baselines start on wall-clock multiples of
`baseline_every_s` (on the hour by default), so baselines of a fleet line up in time. A pure
state machine: the daemon asks `plan()`, waits, runs the window and reports `done()`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from sidecar.config import ScheduleConfig


class WindowKind(StrEnum):
    SNAPSHOT = "snapshot"
    BASELINE = "baseline"


@dataclass(frozen=True, slots=True)
class PlannedWindow:
    kind: WindowKind
    start: float  # monotonic deadline
    start_wall: float  # the same moment on the wall clock, for logs and the exporter


class Schedule:
    def __init__(
        self,
        config: ScheduleConfig,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
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
        baseline_at = now + (self._next_baseline_wall - wall)
        if baseline_at <= self._next + 1e-6:
            return PlannedWindow(WindowKind.BASELINE, baseline_at, self._next_baseline_wall)
        start = self._next + self._jitter()
        return PlannedWindow(WindowKind.SNAPSHOT, start, wall + (start - now))

    def started(self, planned: PlannedWindow) -> None:
        self.lateness_s = max(0.0, self._clock() - planned.start)

    def done(self, planned: PlannedWindow) -> None:
        """Advance past what has passed; deadlines skipped because a window overran are missed,
        except the one a baseline replaced."""
        now = self._clock()
        if planned.kind is WindowKind.BASELINE:
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
