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
from sidecar.records import ParseResult, StackSample
from sidecar.records.window import (
    LapReading,
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

    def lap(self) -> LapReading: ...


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


@dataclass(frozen=True, slots=True)
class Sampler:
    """Samples one process tree for a window, in segments so the rate can adapt between them."""

    runner: PySpyRunner
    pid: int
    controller: RateController
    segment_s: float = 10.0
    alive: Callable[[], bool] = field(default=lambda: True)
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    fail_fast: bool = True  # the daemon's first window only: a failed attach is a failed start
    # Continuous mode: the processes and rates of the next segment (one py-spy each); None:
    # one py-spy over the whole tree at the controller's rate.
    plan: Callable[[], tuple[ProcessRate, ...]] | None = None
    # The sidecar's own CPU seconds so far (all its threads): counted in the budget with py-spy's.
    self_cpu: Callable[[], float] = field(default=lambda: own_cpu())
    # Told each segment's outcome (continuous mode's planner: it reads the sidecar's own CPU
    # itself, over its horizon, so that the time between windows counts too).
    on_segment: Callable[[RecordOutcome], object] | None = None
    # Each segment cut into slices of this many seconds, the units of the phase shares in a
    # comparison (README, "Comparing snapshots"); None: the segments are.
    unit_s: float | None = None

    def window(
        self, duration_s: float, stop: Callable[[], bool] = lambda: False, laps: Lap | None = None
    ) -> Window:
        """`duration_s` of samples, in segments; `laps` read at each segment's boundaries (None:
        the segments keep only their stacks). Ends early, partial, on `stop` or a failure."""
        started_at, start = self.wall_clock(), self.clock()
        give_up = start + duration_s + ATTACH_GRACE_S
        if laps is not None:
            laps.start()
        tally = _Tally(own_mark_s=self.self_cpu())
        reason: str | None = None
        failed = False
        while (next_ := self._next(duration_s, start, give_up, tally, stop)) is not None:
            reason, failed = self._run_segment(*next_, stop, tally, laps)
            if reason:
                break
        if stop() and reason is None and tally.sampled_s < duration_s - 0.05:
            reason = "stopped before the window ended (signal)"
        late = _late_warning(tally)
        elapsed = self.clock() - start
        slow = _slow_attach_warning(tally, elapsed)
        tally.warnings.extend(w for w in (late, slow) if w is not None)
        if reason is None and tally.samples == 0:
            reason = "no samples: py-spy did not attach within the window (a loaded host?)"
            failed = True
        mode = SamplingMode.WINDOWS if self.plan is None else SamplingMode.CONTINUOUS
        rate = sum(tally.rates) / len(tally.rates) if tally.rates else self.controller.rate_hz
        return tally.window(started_at, elapsed, rate, reason, failed, mode, self.unit_s)

    def _next(
        self,
        duration_s: float,
        start: float,
        give_up: float,
        tally: _Tally,
        stop: Callable[[], bool],
    ) -> tuple[float, float] | None:
        """The next segment's seconds and its attach grace; None: the window is done."""
        # Continuous periods end on the wall clock's grid: their attaches are inside them.
        by_wall = self.plan is not None
        left = duration_s - (self.clock() - start if by_wall else tally.sampled_s)
        if left <= 0.05 or self.clock() >= give_up or stop():
            return None
        # A segment may wait for py-spy to attach only as long as the window's grace has left
        # (at least MIN_ATTACH_S): a host slow to attach ends the window partial, in time.
        grace = min(max(give_up - self.clock(), MIN_ATTACH_S), ATTACH_GRACE_S)
        # Continuous: py-spy ends on SIGINT after its next sample (up to a second at 1 Hz,
        # more on a loaded host): asked to stop that much before the period's end.
        seconds = min(left - EXIT_S, self.segment_s) if by_wall else min(left, self.segment_s)
        return (seconds, grace) if seconds >= 1.0 else None

    def _run_segment(
        self,
        seconds: float,
        grace: float,
        stop: Callable[[], bool],
        tally: _Tally,
        laps: Lap | None,
    ) -> tuple[str | None, bool]:
        """One segment sampled and added to `tally`, the rate adapted; why the window ends
        early, if it does, and whether py-spy itself failed."""
        outcome = self._segment(seconds, stop, grace, first=not tally.segments)
        tally.sampled_s += outcome.wall_s
        tally.rates.append(_asked(outcome) or self.controller.rate_hz)
        # parse: the raw text lives in py-spy's temporary file, read as the segment ends.
        segment = tally.add(outcome, parse_raw(outcome.raw, source="py-spy record"))
        if laps is not None:
            segment = replace(segment, reading=laps.lap())
        tally.blocks.append(segment)
        own = tally.own_until(self.self_cpu())
        if self.plan is None:  # continuous mode's planner hears of it in on_segment
            # The budget counts everything the sidecar costs: py-spy's CPU and its own.
            self.controller.update(outcome.cpu_s + own, outcome.wall_s, outcome.behind_s)
        if self.on_segment is not None:
            self.on_segment(outcome)
        return _partial_reason(outcome, self.alive)

    def _segment(
        self, seconds: float, stop: Callable[[], bool], attach_grace_s: float, first: bool
    ) -> RecordOutcome:
        processes = self.plan() if self.plan is not None else ()
        request = RecordRequest(pid=self.pid, rate_hz=self.controller.rate_hz, duration_s=seconds,
                                attach_grace_s=attach_grace_s, processes=processes,
                                from_launch=bool(processes), unit_s=self.unit_s)  # fmt: skip
        outcome = self.runner.record(request, stop)
        refused = outcome.returncode != 0 and outcome.killed_after_s is None
        if first and self.fail_fast and refused and not outcome.raw:
            # Nothing sampled at all in the first window: a failed start is fatal (STYLE.md 7).
            # Later failures are data: the window is kept, partial, with py-spy's reason. A
            # py-spy we killed for ignoring SIGINT had attached: that is no failed start.
            raise explain_failure(self.pid, outcome.output)
        return outcome


@dataclass
class _Tally:
    """A window's running totals, added to as each segment ends."""

    own_mark_s: float  # the sidecar's own CPU seconds when the last segment ended
    counts: Counter[StackSample] = field(default_factory=Counter)
    samples: int = 0
    errors: int = 0
    cpu_s: float = 0.0  # py-spy's
    own_cpu_s: float = 0.0  # the sidecar's own, over the segments
    segments: int = 0
    behind_s: float = 0.0  # the most py-spy fell behind in any segment
    attach_s: float = 0.0
    attach_max_s: float = 0.0
    sampled_s: float = 0.0  # seconds py-spy actually sampled: its attach time is not the window's
    rates: list[float] = field(default_factory=list)
    blocks: list[Segment] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    per_process: list[ProcessOutcome] = field(default_factory=list)

    def add(self, outcome: RecordOutcome, parsed: ParseResult) -> Segment:
        """One segment's stacks and counts; its stacks (weight 1) -> count as a `Segment`."""
        segment: Counter[StackSample] = Counter()
        for stack in parsed.stacks:
            segment[replace(stack, weight=1, source=None)] += stack.weight
        self.counts.update(segment)
        if outcome.samples is None:
            self.samples += sum(s.weight for s in parsed.stacks)
        else:
            self.samples += outcome.samples
        self.errors += outcome.errors or 0
        self.cpu_s += outcome.cpu_s
        self.segments += 1
        self.behind_s = max(self.behind_s, outcome.behind_s)
        self.attach_s += outcome.attach_s
        self.attach_max_s = max(self.attach_max_s, outcome.attach_s)
        self.warnings.extend(parsed.warnings[:5])
        self.per_process.extend(outcome.per_process)
        return Segment(outcome.wall_s, dict(segment), parts=_parts(outcome, parsed))

    def own_until(self, now_s: float) -> float:
        """The sidecar's own CPU since the last segment ended (`now_s`: its CPU so far)."""
        own, self.own_mark_s = max(now_s - self.own_mark_s, 0.0), now_s
        self.own_cpu_s += own
        return own

    def window(
        self,
        started_at: float,
        elapsed_s: float,
        rate_hz: float,
        reason: str | None,
        failed: bool,
        mode: SamplingMode,
        unit_s: float | None = None,
    ) -> Window:
        return Window(
            started_at=started_at,
            duration_s=self.sampled_s,
            rate_hz=rate_hz,
            stacks=tuple(replace(s, weight=n) for s, n in self.counts.items()),
            samples=self.samples,
            errors=self.errors,
            sampler_cpu_s=self.cpu_s,
            segments=self.segments,
            partial=reason is not None,
            partial_reason=reason,
            warnings=tuple(self.warnings),
            behind_s=self.behind_s,
            sampler_failure=reason if failed else None,
            blocks=tuple(b for b in self.blocks if b.counts),
            attach_s=self.attach_s,
            elapsed_s=elapsed_s,
            self_cpu_s=self.own_cpu_s,
            per_process=sum_per_process(self.per_process),
            mode=mode,
            unit_s=unit_s if any(b.parts for b in self.blocks) else None,
        )


def _parts(outcome: RecordOutcome, parsed: ParseResult) -> tuple[Mapping[StackSample, int], ...]:
    """The segment's slices as stacks -> samples. `raw` lists each distinct stack line once, in
    the order the slices first hold them; a line the parser could not read (none expected: the
    lines are our own) leaves the segment without slices rather than with ones that miscount."""
    if not outcome.parts:
        return ()
    keys = [line.rsplit(" ", 1)[0] for line in outcome.raw.splitlines() if line.strip()]
    if len(keys) != len(parsed.stacks):
        return ()
    read = zip(keys, parsed.stacks, strict=True)
    stacks = {k: replace(st, weight=1, source=None) for k, st in read}
    try:
        return tuple({stacks[k]: n for k, n in part.items()} for part in outcome.parts)
    except KeyError:
        return ()


def _late_warning(tally: _Tally) -> str | None:
    if tally.behind_s < LATE_S:
        return None
    return (
        f"py-spy fell {tally.behind_s:.1f} s behind (starved of CPU) and took the missed "
        "samples in a burst when it ran again: shares lean towards what followed the "
        "stall. Lower the rate, or raise the sidecar's CPU weight (systemd: CPUWeight=)"
    )


def _slow_attach_warning(tally: _Tally, elapsed_s: float) -> str | None:
    if tally.attach_s < SLOW_ATTACH_SHARE * max(tally.sampled_s, 1.0):
        return None
    return (
        f"py-spy took {tally.attach_s:.1f} s to attach over {tally.segments:.0f} "
        f"segments (the longest {tally.attach_max_s:.1f} s): {tally.sampled_s:.0f} s of "
        f"samples took {elapsed_s:.0f} s. The host is short of CPU; longer segments "
        "(--segment, sampling.segment_s) attach less often"
    )


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
