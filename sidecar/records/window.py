"""The sampling stage's frozen records: one window of stacks, its segments, each process's
py-spy over it; and windows put together (a continuous hour's periods as its baseline).

Records only: taking a window is sidecar/sampling/sampler.py's, writing it
sidecar/window/snapshot.py's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sidecar.records import Role, StackSample


class SamplingMode(StrEnum):
    """How a window's stacks were taken; its value is what summary.json's `sampling.mode` says."""

    CONTINUOUS = "continuous"  # one py-spy per process, all the time, each at its own rate
    WINDOWS = "windows"  # one py-spy over the tree for `window_s` in every `interval_s`
    # A stall incident's `py-spy dump`s (store/incidents.py): never a configured mode.
    DUMP = "dump"


@dataclass(frozen=True, slots=True)
class ProcessOutcome:
    """What one process's py-spy did in a segment: requested vs achieved, errors, its CPU."""

    pid: int
    requested_hz: float  # the rate times the share of the segment it sampled
    samples: int
    errors: int
    cpu_s: float
    wall_s: float
    behind_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LapReading:
    """What changed over one segment, from the end of the previous one to the end of this one
    (so py-spy's attach is inside): the units a comparison of two windows has them per."""

    span_s: float  # the seconds these readings cover
    cpu_s: Mapping[Role, float] = field(default_factory=dict)  # all threads, per role (psutil)
    # vLLM's counters' deltas (/metrics); None: a scrape at either end failed.
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    requests: float | None = None  # finished


@dataclass(frozen=True, slots=True)
class Segment:
    """One py-spy run of the window: its seconds, its stacks (weight 1) -> count, and what the
    `Lap` read over it; None: the window was taken without laps (its stacks alone)."""

    wall_s: float
    counts: Mapping[StackSample, int]
    reading: LapReading | None = None
    # `counts` in consecutive time slices of the window's `unit_s`, in order; () without.
    parts: tuple[Mapping[StackSample, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Window:
    """The stacks of one sampling window, aggregated (stack -> count)."""

    started_at: float  # wall clock (Unix seconds), for the snapshot's name and humans
    duration_s: float
    rate_hz: float
    stacks: tuple[StackSample, ...]
    samples: int
    errors: int
    sampler_cpu_s: float
    segments: int
    partial: bool = False
    partial_reason: str | None = None
    warnings: tuple[str, ...] = ()
    behind_s: float = 0.0  # the most py-spy fell behind its sampling schedule
    # Why py-spy itself failed (killed, an error exit, nothing sampled), when it did: the
    # daemon counts that; a target that exited or a stop signal is no failure of the sampler.
    sampler_failure: str | None = None
    # Each segment's own counts, in order: contiguous stretches of samples, the units that the
    # comparison of two windows estimates its variance from (`stacks` is their sum).
    blocks: tuple[Segment, ...] = ()
    attach_s: float = 0.0  # py-spy's attach time, all segments together: not in `duration_s`
    elapsed_s: float = 0.0  # wall time the window took, attaches included
    # The sidecar's own CPU over the window (parsing, classifying, scraping, writing the last
    # window; every thread of its process), beside py-spy's `sampler_cpu_s`.
    self_cpu_s: float = 0.0
    # Continuous mode: each process's py-spy over the window (requested vs achieved).
    per_process: tuple[ProcessOutcome, ...] = ()
    mode: SamplingMode = SamplingMode.WINDOWS
    unit_s: float | None = None  # the slices' length where the segments kept `parts`


def merge_windows(windows: list[Window]) -> Window:
    """Consecutive windows as one (a continuous hour's periods as its baseline): stacks and
    counts added, segments kept in order, the first start, the worst lateness. The segments'
    time slices are left out: a merged window (an hour's baseline) has segments enough to be
    its own units, and its summary stays small."""
    first, last = windows[0], windows[-1]
    counts: Counter[StackSample] = Counter()
    for w in windows:
        for s in w.stacks:
            counts[replace(s, weight=1)] += s.weight
    samples = sum(w.samples for w in windows)
    duration = sum(w.duration_s for w in windows)
    reasons = [w.partial_reason for w in windows if w.partial_reason]
    warnings = tuple(dict.fromkeys(x for w in windows for x in w.warnings))
    return Window(
        started_at=first.started_at,
        duration_s=duration,
        rate_hz=sum(w.rate_hz * w.duration_s for w in windows) / duration if duration else 0.0,
        stacks=tuple(replace(s, weight=n) for s, n in counts.items()),
        samples=samples,
        errors=sum(w.errors for w in windows),
        sampler_cpu_s=sum(w.sampler_cpu_s for w in windows),
        segments=sum(w.segments for w in windows),
        partial=bool(reasons),
        partial_reason=reasons[-1] if reasons else None,
        warnings=warnings,
        behind_s=max(w.behind_s for w in windows),
        sampler_failure=next((w.sampler_failure for w in windows if w.sampler_failure), None),
        blocks=tuple(replace(b, parts=()) for w in windows for b in w.blocks),
        attach_s=sum(w.attach_s for w in windows),
        elapsed_s=last.started_at + last.elapsed_s - first.started_at,
        self_cpu_s=sum(w.self_cpu_s for w in windows),
        per_process=sum_per_process([o for w in windows for o in w.per_process]),
        mode=last.mode,
    )


def sum_per_process(outcomes: list[ProcessOutcome]) -> tuple[ProcessOutcome, ...]:
    """Each process's segments added up; `requested_hz` weighted by the time each sampled."""
    by_pid: dict[int, list[ProcessOutcome]] = {}
    for o in outcomes:
        by_pid.setdefault(o.pid, []).append(o)
    out = []
    for pid, runs in by_pid.items():
        wall = sum(o.wall_s for o in runs)
        hz = sum(o.requested_hz * o.wall_s for o in runs) / wall if wall else 0.0
        out.append(ProcessOutcome(pid=pid, requested_hz=hz, samples=sum(o.samples for o in runs),
                                  errors=sum(o.errors for o in runs),
                                  cpu_s=sum(o.cpu_s for o in runs), wall_s=wall,
                                  behind_s=max(o.behind_s for o in runs)))  # fmt: skip
    return tuple(out)
