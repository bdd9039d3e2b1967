"""Continuous mode: every process of the target sampled all the time, each at its own rate,
the whole sidecar within a share of one core.

py-spy's cost grows with the samples it takes (each one reads every thread's stack through
process_vm_readv) and with its attaches; the sidecar's own CPU (parsing, classifying, scraping,
writing) comes on top. The planner measures both after every segment and sets the next rates so
that the two together stay within `budget`: the EngineCore and workers carry the phases that
matter and get the full rate, the API server (mostly its idle event loop) a quarter. Below
py-spy's least rate (1 Hz) a process samples at 1 Hz for part of the segment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sidecar import outproc
from sidecar.config.settings import Config
from sidecar.records import ProcessInfo, Role
from sidecar.records.window import SamplingMode
from sidecar.sampling.pyspy import ProcessRate, RecordOutcome

# Rates relative to the EngineCore's: rules as data. `other` (a launcher, a helper) is not sampled.
ROLE_WEIGHTS: Mapping[Role, float] = {
    Role.ENGINE_CORE: 1.0,
    Role.WORKER: 1.0,
    Role.API_SERVER: 0.25,
}
START_HZ = 1.0  # the EngineCore's rate before any cost is measured
MAX_HZ = 20.0  # never more, however cheap (the windows mode's reference rate)
LEAST_SHARE = 0.05  # of a segment, for a process below 1 Hz
AIM = 0.9  # of the budget: measured at 1.11 % of a core with 1.0 (benchmarks/continuous.py)


@dataclass
class RolePlanner:
    """The rates of the next segment, per process, from the measured cost of the last ones."""

    budget: float  # share of one core for the sidecar and py-spy together
    min_hz: float = 0.5  # the EngineCore's least rate, whatever the budget says
    weights: Mapping[Role, float] = field(default_factory=lambda: dict(ROLE_WEIGHTS))
    hz: float = START_HZ  # the EngineCore's (weight 1) rate now
    last_cost_share: float | None = None  # the last segment's measured cost, of one core
    clock: Callable[[], float] = time.monotonic
    self_cpu: Callable[[], float] = field(default=lambda: own_cpu())
    _plan: tuple[ProcessRate, ...] = ()
    horizon_s: float = 300.0  # the cost is read over this long (a period)
    _last: tuple[float, float] | None = None  # (clock, own CPU) at the last update
    # (wall, own CPU, py-spy CPU, samples asked) per update, over the horizon
    _seen: list[tuple[float, float, float, float]] = field(default_factory=list)

    def plan(self, processes: tuple[ProcessInfo, ...]) -> tuple[ProcessRate, ...]:
        out = []
        for p in processes:
            weight = self.weights.get(p.role, 0.0)
            if weight <= 0:
                continue
            hz = min(self.hz * weight, MAX_HZ)
            if hz >= 1.0:
                out.append(ProcessRate(p.pid, round(hz), 1.0, p.title))
            else:
                out.append(ProcessRate(p.pid, 1, max(hz, LEAST_SHARE), p.title))
        self._plan = tuple(out)
        return self._plan

    def requested(self) -> float:
        """Samples per second the current plan asks of py-spy, all processes together."""
        return sum(p.rate_hz * p.share for p in self._plan)

    def update(self, outcome: RecordOutcome) -> float:
        """After a segment: the rate that spends the budget, given what py-spy's samples cost
        and what the sidecar spent besides (which no rate change saves). Both are read over
        the last `horizon_s` (a period: its snapshot's write, once a period, is in it), the
        sidecar's own CPU and the wall time by the planner itself since its last update, so
        that what happens between segments and windows counts too. It aims at `AIM` of the
        budget: the rate follows the cost a segment late, and the margin keeps the average
        inside."""
        now, own = self.clock(), self.self_cpu()
        last, self._last = self._last, (now, own)
        asked = self.requested()
        if last is None or asked <= 0 or outcome.wall_s <= 0 or now <= last[0]:
            return self.hz
        self._seen.append((now - last[0], max(own - last[1], 0.0), outcome.cpu_s,
                           asked * outcome.wall_s))  # fmt: skip
        while len(self._seen) > 1 and sum(x[0] for x in self._seen[1:]) >= self.horizon_s:
            self._seen.pop(0)
        wall, own_s, spy_s, samples = (sum(x[i] for x in self._seen) for i in range(4))
        self.last_cost_share = (own_s + spy_s) / wall
        per_sample = spy_s / samples  # py-spy's CPU per sample asked
        if per_sample <= 0:
            return self.hz
        left = AIM * self.budget - own_s / wall  # what the samples may spend, per second
        affordable = max(left, 0.0) / per_sample  # samples per second, all processes
        wanted = self.hz * affordable / asked
        # At most 2x per segment: one noisy segment must not swing the rates.
        wanted = min(max(wanted, self.hz / 2), self.hz * 2)
        self.hz = min(max(wanted, self.min_hz), MAX_HZ)
        return self.hz

    def started(self) -> None:
        """A window begins: the cost from here is measured (once: later windows go on from
        the last segment, so the time between windows is counted)."""
        if self._last is None:
            self._last = (self.clock(), self.self_cpu())


def own_cpu() -> float:
    """The sidecar's own CPU seconds so far: every thread of its process, and its reaped
    write children (sidecar/outproc.py); py-spy's runs are counted apart, per segment."""
    return time.process_time() + outproc.child_cpu_s()


def is_continuous(config: Config) -> bool:
    """Whether the daemon samples continuously: `sampling.mode: continuous` with one target.
    A fleet daemon (`targets:`) takes its deployments' windows one after another, so it keeps
    the windows mode (README, "Continuous mode")."""
    return config.sampling.mode == SamplingMode.CONTINUOUS and not config.targets
