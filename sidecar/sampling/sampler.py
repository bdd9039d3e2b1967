"""py-spy against a process tree, in windows, with its own sample/error counts and CPU cost kept.

The py-spy process lives in `pyspy.py`, behind the `PySpyRunner` seam: this loop is tested on
recorded py-spy outcomes, the real runner against real processes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from sidecar.parsers import parse_raw
from sidecar.records import StackSample
from sidecar.records.window import (
    ProcessOutcome,
    SamplingMode,
    Segment,
    Window,
    sum_per_process,
)
from sidecar.sampling.continuous import own_cpu
from sidecar.sampling.pyspy import (
    ATTACH_GRACE_S,
    LATE_S,
    ProcessRate,
    PySpyRunner,
    RecordOutcome,
    RecordRequest,
    explain_failure,
    last_line,
    whole_rate,
)

# The least a segment waits for py-spy to attach, even when the window's grace is spent.
MIN_ATTACH_S = 2.0
# Continuous mode: what a segment leaves for py-spy to end after SIGINT, in its period.
EXIT_S = 1.5
# Attaches that add up to this share of the sampled time earn the window a warning.
SLOW_ATTACH_SHARE = 0.25


class Lap(Protocol):
    """Readings taken at each segment's boundaries (CPU times, vLLM's counters): `start` before
    the first segment, then `lap` after each returns what changed since the previous call."""

    def start(self) -> None: ...

    def lap(self) -> Mapping[str, float]: ...


def _asked(outcome: RecordOutcome) -> float | None:
    """Continuous mode: the fastest rate a process was asked for (the EngineCore's)."""
    return max((o.requested_hz for o in outcome.per_process), default=None)


@dataclass
class RateController:
    """Adapts the sampling rate so py-spy stays within `budget` of one core.

    py-spy's cost grows with rate x processes x stack depth (about 1 ms of CPU per
    process-sample measured on vLLM here), so it is measured, not assumed: after each segment
    the CPU per tick is known and the next rate is budget / (CPU per tick).
    """

    rate_hz: float
    budget: float | None = None  # share of one core, e.g. 0.02
    min_hz: float = 1.0  # py-spy's lowest rate: it takes whole samples per second
    max_hz: float = 100.0

    def update(self, cpu_s: float, wall_s: float, behind_s: float = 0.0) -> float:
        if self.budget is None or wall_s <= 0 or cpu_s <= 0:
            return self.rate_hz
        cpu_per_tick = cpu_s / (self.rate_hz * wall_s)
        wanted = self.budget / cpu_per_tick
        if behind_s >= LATE_S:  # starved of CPU: within budget or not, ask for less
            wanted = min(wanted, self.rate_hz / 2)
        # Move at most 2x per segment: one noisy segment must not swing the rate wildly.
        wanted = min(max(wanted, self.rate_hz / 2), self.rate_hz * 2)
        self.rate_hz = float(whole_rate(min(max(wanted, self.min_hz), self.max_hz)))
        return self.rate_hz


@dataclass
class Sampler:
    """Samples one process tree for a window, in segments so the rate can adapt between them."""

    runner: PySpyRunner
    pid: int
    controller: RateController
    segment_s: float = 10.0
    alive: Callable[[], bool] = field(default=lambda: True)
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    fail_fast: bool = True  # the daemon clears it after its first good window
    laps: Lap | None = None  # readings per segment; None: the segments keep only their stacks
    # Continuous mode: the processes and rates of the next segment (one py-spy each); None:
    # one py-spy over the whole tree at the controller's rate.
    plan: Callable[[], tuple[ProcessRate, ...]] | None = None
    # The sidecar's own CPU seconds so far (all its threads): counted in the budget with py-spy's.
    self_cpu: Callable[[], float] = field(default=lambda: own_cpu())
    # Told each segment's outcome (continuous mode's planner: it reads the sidecar's own CPU
    # itself, over its horizon, so that the time between windows counts too).
    on_segment: Callable[[RecordOutcome], object] | None = None

    def window(self, duration_s: float, stop: Callable[[], bool] = lambda: False) -> Window:
        started_at, start = self.wall_clock(), self.clock()
        counts: Counter[StackSample] = Counter()
        totals = {"samples": 0, "errors": 0, "cpu": 0.0, "segments": 0, "behind": 0.0,
                  "attach": 0.0, "attach_max": 0.0}  # fmt: skip
        rates: list[float] = []
        blocks: list[Segment] = []
        warnings: list[str] = []
        reason: str | None = None
        failed = False
        sampled = 0.0  # seconds py-spy actually sampled: its attach time is not the window's
        give_up = start + duration_s + ATTACH_GRACE_S
        if self.laps is not None:
            self.laps.start()
        own_at = self.self_cpu()
        per_process: list[ProcessOutcome] = []
        # Continuous periods end on the wall clock's grid: their attaches are inside them.
        by_wall = self.plan is not None
        while (
            (left := duration_s - (self.clock() - start if by_wall else sampled)) > 0.05
            and self.clock() < give_up
            and not stop()
        ):
            # A segment may wait for py-spy to attach only as long as the window's grace has left
            # (at least MIN_ATTACH_S): a host slow to attach ends the window partial, in time.
            grace = min(max(give_up - self.clock(), MIN_ATTACH_S), ATTACH_GRACE_S)
            # Continuous: py-spy ends on SIGINT after its next sample (up to a second at 1 Hz,
            # more on a loaded host): asked to stop that much before the period's end.
            seconds = min(left - EXIT_S, self.segment_s) if by_wall else min(left, self.segment_s)
            if seconds < 1.0:
                break
            outcome = self._segment(seconds, stop, grace,
                                    first=not totals["segments"])  # fmt: skip
            sampled += outcome.wall_s
            rates.append(_asked(outcome) or self.controller.rate_hz)
            segment = _add(counts, outcome, totals, warnings)
            if self.laps is not None:
                segment = replace(segment, readings=self.laps.lap())
            blocks.append(segment)
            own_now = self.self_cpu()
            own, own_at = max(own_now - own_at, 0.0), own_now
            totals["own"] = totals.get("own", 0.0) + own
            per_process.extend(outcome.per_process)
            if self.plan is None:  # continuous mode's planner hears of it in on_segment
                # The budget counts everything the sidecar costs: py-spy's CPU and its own.
                self.controller.update(outcome.cpu_s + own, outcome.wall_s, outcome.behind_s)
            if self.on_segment is not None:
                self.on_segment(outcome)
            reason, failed = _partial_reason(outcome, self.alive)
            if reason:
                break
        if stop() and reason is None and sampled < duration_s - 0.05:
            reason = "stopped before the window ended (signal)"
        if totals["behind"] >= LATE_S:
            warnings.append(
                f"py-spy fell {totals['behind']:.1f} s behind (starved of CPU) and took the missed "
                "samples in a burst when it ran again: shares lean towards what followed the "
                "stall. Lower the rate, or raise the sidecar's CPU weight (systemd: CPUWeight=)"
            )
        elapsed = self.clock() - start
        if totals["attach"] >= SLOW_ATTACH_SHARE * max(sampled, 1.0):
            warnings.append(
                f"py-spy took {totals['attach']:.1f} s to attach over {totals['segments']:.0f} "
                f"segments (the longest {totals['attach_max']:.1f} s): {sampled:.0f} s of "
                f"samples took {elapsed:.0f} s. The host is short of CPU; longer segments "
                "(--segment, sampling.segment_s) attach less often"
            )
        if reason is None and totals["samples"] == 0:
            reason = "no samples: py-spy did not attach within the window (a loaded host?)"
            failed = True
        return Window(
            started_at=started_at,
            duration_s=sampled,
            rate_hz=sum(rates) / len(rates) if rates else self.controller.rate_hz,
            stacks=tuple(replace(s, weight=n) for s, n in counts.items()),
            samples=int(totals["samples"]),
            errors=int(totals["errors"]),
            sampler_cpu_s=float(totals["cpu"]),
            segments=int(totals["segments"]),
            partial=reason is not None,
            partial_reason=reason,
            warnings=tuple(warnings),
            behind_s=float(totals["behind"]),
            sampler_failure=reason if failed else None,
            blocks=tuple(b for b in blocks if b.counts),
            attach_s=float(totals["attach"]),
            elapsed_s=elapsed,
            self_cpu_s=float(totals.get("own", 0.0)),
            per_process=sum_per_process(per_process),
            mode=SamplingMode.WINDOWS if self.plan is None else SamplingMode.CONTINUOUS,
        )

    def _segment(
        self, seconds: float, stop: Callable[[], bool], attach_grace_s: float, first: bool
    ) -> RecordOutcome:
        processes = self.plan() if self.plan is not None else ()
        request = RecordRequest(pid=self.pid, rate_hz=self.controller.rate_hz, duration_s=seconds,
                                attach_grace_s=attach_grace_s, processes=processes,
                                from_launch=bool(processes))  # fmt: skip
        outcome = self.runner.record(request, stop)
        refused = outcome.returncode != 0 and outcome.killed_after_s is None
        if first and self.fail_fast and refused and not outcome.raw:
            # Nothing sampled at all in the first window: a failed start is fatal (STYLE.md 7).
            # Later failures are data: the window is kept, partial, with py-spy's reason. A
            # py-spy we killed for ignoring SIGINT had attached: that is no failed start.
            raise explain_failure(self.pid, outcome.output)
        return outcome


def _add(
    counts: Counter[StackSample],
    outcome: RecordOutcome,
    totals: dict[str, float],
    warnings: list[str],
) -> Segment:
    parsed = parse_raw(outcome.raw, source="py-spy record")
    segment: Counter[StackSample] = Counter()
    for stack in parsed.stacks:
        segment[replace(stack, weight=1, source=None)] += stack.weight
    counts.update(segment)
    if outcome.samples is None:
        totals["samples"] += sum(s.weight for s in parsed.stacks)
    else:
        totals["samples"] += outcome.samples
    totals["errors"] += outcome.errors or 0
    totals["cpu"] += outcome.cpu_s
    totals["segments"] += 1
    totals["behind"] = max(totals["behind"], outcome.behind_s)
    totals["attach"] += outcome.attach_s
    totals["attach_max"] = max(totals["attach_max"], outcome.attach_s)
    warnings.extend(parsed.warnings[:5])
    return Segment(outcome.wall_s, dict(segment))


def _partial_reason(outcome: RecordOutcome, alive: Callable[[], bool]) -> tuple[str | None, bool]:
    """Why the window ends early, if it does, and whether py-spy itself failed."""
    if outcome.killed_after_s is not None:
        return (
            f"py-spy ignored SIGINT for {outcome.killed_after_s:.0f} s and was killed: the "
            "samples of its last segment are lost"
        ), True
    if (
        outcome.target_exited
        or not alive()
        or "no python processes found" in outcome.output.lower()
    ):
        return "the target exited during the window; the samples taken before are kept", False
    if outcome.returncode != 0:
        why = last_line(outcome.output) or "stopped before it had attached (a loaded host?)"
        return f"py-spy stopped early (exit {outcome.returncode}): {why}", True
    return None, False
