"""The deployment's own history: how much each figure moves between windows when nothing changed.

A deployment's CPU, costs, rates and latencies vary from one window to the next far more than
within one (tests/fixtures/diff: a role's CPU by up to 2x on steady load), so a comparison of
one window against one has no spread of its own to test them against. Its other windows do,
where they ran the same thing at a comparable load:

- Which windows. The other windows of the deployment (its snapshots and baselines) that share
  no time with the compared windows nor with each other (an hourly baseline is put together
  from the hour's periods, which its snapshots hold too: the same seconds twice would shrink
  the spread; regular snapshots are taken first, baselines where they overlap none), with the
  same deployment and fingerprint as a compared side
  (`fingerprint_changes` empty; a window without a fingerprint, written before schema 3, cannot
  show that and is left out) and a comparable load: requests finished per second within
  x/÷LOAD_RATIO of that side's, and the prompt share of tokens within MIX_SHARE of it (the
  bound at which the diff says the workload differs). Windows like A's form one group; where B
  ran otherwise (another fingerprint or load), windows like B's form a second.
- The spread. Each window's figure on the log scale (as compare tests ratios), and the pooled
  within-group variance: s^2 = sum over groups of sum (x - mean_g)^2 / df, df = windows -
  groups. Each group has its own mean, so a change between A's and B's runs is not counted as
  noise. A side that has two windows or more (1 against few) adds its own windows as a group.
- The test (sidecar.analyze.compare): log B/A over SE^2 = s^2 (1/n_a + 1/n_b), Student's t
  with the pooled df, in the diff's one Bonferroni family. A compared window shorter than the
  history's median window averages over less time, so its share of SE^2 is stretched by
  median / its length (never shrunk for a longer one: a drift in load does not average out);
  on the record, a 15 s partial window against 40 s ones raised a false alarm without it.
  History is used only where a side has one window: with two or more a side the sides' own
  spread (Welch) tests the compared conditions themselves and needs no assumption that the
  history varied as they do.
- The minimum. A figure is tested against history when at least MIN_HISTORY windows' worth
  (df + 1) of it was measured; below that it stays untested and the diff says how much history
  would let it.

Windows after the compared ones count as well as earlier ones: under "nothing changed" they are
as good a sample of the spread; a change that the fingerprint does not show and that falls
inside the history only widens the spread (fewer detections, never more false alarms).
Pure functions over `SnapshotSummary` records: the loader (sidecar/diff/sides.py) finds the
candidates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sidecar.analyze.compare import MIX_SHARE, Side, fingerprint_changes, workload
from sidecar.records.summary import SnapshotSummary

MIN_HISTORY = 5  # windows' worth (df + 1) below which a figure is not tested against history
LOAD_RATIO = 1.5  # requests finished per second, either way, for a comparable load
HISTORY_WORDS = "same fingerprint, comparable load"
WINDOW_NAME = re.compile(r"^\d{8}T\d{6}Z")  # a window's name starts with its UTC start


@dataclass(frozen=True, slots=True)
class Load:
    """What a window (or side) served, as the comparable-load rule reads it."""

    request_rate: float | None  # requests finished per second
    prompt_share: float | None  # prompt tokens over all tokens


def load_of(summaries: Sequence[SnapshotSummary]) -> Load:
    w = workload(Side("", tuple(summaries)))
    rate = w.requests / w.seconds if w.requests is not None and w.seconds else None
    return Load(rate, w.prompt_share)


def comparable(load: Load, ref: Load) -> bool:
    """Within x/÷LOAD_RATIO of the reference's request rate and MIX_SHARE of its prompt share;
    a figure either does not know is not held against the window."""
    rate, ref_rate = load.request_rate, ref.request_rate
    if rate is not None and ref_rate is not None:
        if (rate > 0) != (ref_rate > 0):
            return False
        if rate > 0 and not 1 / LOAD_RATIO <= rate / ref_rate <= LOAD_RATIO:
            return False
    share, ref_share = load.prompt_share, ref.prompt_share
    return share is None or ref_share is None or abs(share - ref_share) <= MIX_SHARE


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure's between-window variance on the log scale, its degrees of freedom, and how
    many history windows measured it."""

    var: float
    df: int
    windows: int


@dataclass(frozen=True, slots=True)
class History:
    """The windows a one-window comparison is tested against: `groups` (windows like A's, then
    like B's where B ran otherwise), and what was left out of the candidates and why."""

    groups: tuple[tuple[SnapshotSummary, ...], ...]
    considered: int  # candidate windows, the compared ones left out
    other_fingerprint: int  # left out: another deployment or fingerprint, or none recorded
    other_load: int  # left out: a load not comparable to either side's
    off: bool = False  # not consulted (`diff --no-history`)
    overlapping: int = 0  # left out: sharing time with a compared window or a taken one

    @property
    def windows(self) -> int:
        return sum(len(g) for g in self.groups)

    @property
    def depth(self) -> int:
        """Windows' worth of spread: df + 1 (each further group costs a window: its mean)."""
        return depth([len(g) for g in self.groups])

    @property
    def typical_s(self) -> float | None:
        """The median length of the history's windows (seconds)."""
        lengths = sorted(n for g in self.groups for s in g if (n := window_s(s)) > 0)
        if not lengths:
            return None
        mid = len(lengths) // 2
        return lengths[mid] if len(lengths) % 2 else (lengths[mid - 1] + lengths[mid]) / 2

    def stretch(self, s: SnapshotSummary) -> float:
        """How much more than a typical history window a compared window's figure can move:
        the median length over its own, at least 1."""
        typical, length = self.typical_s, window_s(s)
        return max(1.0, typical / length) if typical and length > 0 else 1.0

    @property
    def enough(self) -> bool:
        return not self.off and self.depth >= MIN_HISTORY

    def words(self) -> str:
        """`the spread between 9 other windows of this deployment (same fingerprint, ...)`."""
        runs = "" if len(self.groups) < 2 else "; A's and B's runs apart"
        return (f"the spread between {self.windows} other windows of this deployment "
                f"({HISTORY_WORDS}{runs})")  # fmt: skip

    def shortfall(self) -> str:
        """Why it cannot test, and how much more history would: `needs 5 windows of this
        deployment at this load (...); found 2, 3 more would do (left out: 4 at another load)`."""
        if self.off:
            return "the deployment's history was not consulted (--no-history)"
        found = f"found {self.windows}"
        if len(self.groups) > 1:
            found += f" in {len(self.groups)} runs (A's and B's), worth {self.depth}"
        more = max(MIN_HISTORY - self.depth, 0)
        left = [f"{n} {why}" for n, why in ((self.other_load, "at another load"),
                                            (self.other_fingerprint, "of another fingerprint"),
                                            (self.overlapping, "overlapping another window"))
                if n]  # fmt: skip
        return (f"needs {MIN_HISTORY} windows of this deployment at this load ({HISTORY_WORDS}); "
                f"{found}, {more} more would do"
                + (f" (left out: {', '.join(left)})" if left else ""))  # fmt: skip

    def spread(
        self,
        figure: Callable[[SnapshotSummary], float | None],
        sides: Iterable[Sequence[SnapshotSummary]] = (),
    ) -> Spread | None:
        """The pooled within-group variance of log `figure` over the history's groups, with
        `sides` (the compared sides of two windows or more) as further groups; None when the
        history's own windows that measured it (above zero) are worth under MIN_HISTORY."""
        if self.off:
            return None
        own = [_logs(figure, g) for g in self.groups]
        if depth([len(g) for g in own]) < MIN_HISTORY:
            return None
        found = [g for g in (*own, *(_logs(figure, s) for s in sides)) if len(g) >= 2]
        df = sum(len(g) - 1 for g in found)
        squares = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in found)
        return Spread(squares / df, df, sum(len(g) for g in own))


NO_HISTORY = History((), 0, 0, 0, off=True)


def depth(sizes: Sequence[int]) -> int:
    """Windows' worth of spread in groups of these sizes: df + 1 over the groups of two or more."""
    used = [n for n in sizes if n >= 2]
    return sum(used) - len(used) + 1 if used else min(1, sum(sizes))


def _logs(figure: Callable[[SnapshotSummary], float | None], windows: Iterable[SnapshotSummary]
          ) -> list[float]:  # fmt: skip
    return [math.log(v) for s in windows if (v := figure(s)) is not None and v > 0]


def history_for(a: Side, b: Side, candidates: Iterable[SnapshotSummary]) -> History:
    """The candidates like A (same deployment and fingerprint as A's latest window, a load
    comparable to A's), then those like B and not like A: each a group. Left out: the compared
    windows (found again by name), and windows that share time with them or with a window
    already taken (regular snapshots are taken before baselines)."""
    compared = {s.name for side in (a, b) for s in side.summaries}
    taken = [span for side in (a, b) for s in side.summaries if (span := _span(s)) is not None]
    refs = [(_like(side), load_of(side.summaries)) for side in (a, b)]
    groups: list[list[SnapshotSummary]] = [[], []]
    considered = other_fingerprint = other_load = overlapping = 0
    # Regular snapshots first: a baseline spans the hour's periods, which they hold too.
    for s in sorted(candidates, key=lambda s: s.kind == "baseline"):
        if s.name in compared and s.kind != "baseline":
            continue  # a compared window, found again
        considered += 1
        span = _span(s)
        if span is not None and any(_overlap(span, t) for t in taken):
            overlapping += 1
            continue
        same = [like(s) for like, _ in refs]
        if not any(same):
            other_fingerprint += 1
            continue
        load = load_of((s,))
        side = next((i for i, (ok, (_, ref)) in enumerate(zip(same, refs, strict=True))
                     if ok and comparable(load, ref)), None)  # fmt: skip
        if side is None:
            other_load += 1
            continue
        groups[side].append(s)
        if span is not None:
            taken.append(span)
    found = tuple(tuple(sorted(g, key=lambda s: s.name)) for g in groups if g)
    return History(found, considered, other_fingerprint, other_load, overlapping=overlapping)


def _span(s: SnapshotSummary) -> tuple[float, float] | None:
    """The seconds a window covers (Unix), from its name (its UTC start) and its length; None
    when its name is no window's."""
    if WINDOW_NAME.match(s.name) is None:
        return None
    start = datetime.strptime(s.name[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    return start, start + window_s(s)


def window_s(s: SnapshotSummary) -> float:
    """A window's length: vLLM's readings' span, or the sampling's (0: unknown)."""
    return max(s.serving.window_s or 0.0, s.sampling.duration_s)


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _like(side: Side) -> Callable[[SnapshotSummary], bool]:
    """Whether a window ran what the side's latest window ran (deployment and fingerprint)."""
    latest = next((s for s in reversed(side.summaries) if s.fingerprint is not None), None)

    def like(s: SnapshotSummary) -> bool:
        if latest is None or latest.fingerprint is None or s.fingerprint is None:
            return False
        if latest.deployment and s.deployment and latest.deployment != s.deployment:
            return False
        return not fingerprint_changes(latest.fingerprint, s.fingerprint)

    return like
