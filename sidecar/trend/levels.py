"""Which of the candidate level changes are real: `diff`'s test on the windows either side.

PELT (sidecar/trend/changepoints.py) proposes where a series may have changed level; it does
not decide. Each candidate is kept only where `vllm-sidecar diff` of the windows of the segment
before against the windows of the segment after calls that figure's change significant: the
same units (py-spy segments for shares, windows for rates and latencies), the same intervals
(Newcombe for shares, Welch on the log scale for ratios) and the same Bonferroni family over
every figure that diff tests (sidecar/analyze/compare.py). `trend` and `diff` then share one
noise model, and disagree on no pair of windows (tests/unit/trend/test_levels_recorded.py).

- Candidates that fail are dropped one at a time, the weakest first (not tested, then the
  largest p), and the others tested again over the wider segments left: each change reported
  is significant between the reported changes around it.
- A side is the segment's windows, at most MAX_WINDOWS of them, the nearest to the change. Where
  a side holds snapshots, its baselines are left out: a baseline is the snapshots of its hour
  merged (their py-spy segments again), and counting both would count the same samples twice.
- Multiplicity: each test is one figure of a diff, judged at alpha / m (m: the figures that
  diff tests), so the chance of any false change among all the tests `trend` runs is at most
  the sum of their alpha / m (`LevelTests.bound`), which `trend` prints. That bound takes the
  split points as given: PELT chose them on the same data, which it does not account for.
- A figure diff does not test (a main thread's share, requests running, the sampler's own
  figures), a window whose summary cannot be read, and a missing scipy (the [analysis] extra)
  leave a candidate "not tested": shown as such, never reported as a change.

scipy (through compare) is imported only when there is a candidate to test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sidecar.extras import missing_extra
from sidecar.records.summary import SnapshotSummary

if TYPE_CHECKING:
    from sidecar.analyze.compare import Change, Comparison

ALPHA = 0.05  # as diff's (sidecar.analyze.compare.ALPHA, which imports scipy)
MAX_WINDOWS = 24  # a side's windows, the nearest to the change: two hours of 5-minute windows

Reader = Callable[[str], SnapshotSummary | None]  # a window's summary by folder name; None: unread
Window = tuple[str, str]  # (folder name, kind) of a row


class Verdict(StrEnum):
    SIGNIFICANT = "significant"
    NOT_SIGNIFICANT = "not significant"
    NOT_TESTED = "not tested"


@dataclass(frozen=True, slots=True)
class LevelTest:
    """diff's verdict on one candidate: its row for the figure (None: diff has no row), the
    family it was judged in (m), and the windows of each side."""

    verdict: Verdict
    change: Change | None
    tested_in: int  # m: the comparisons of that diff's family (0: not tested)
    note: str | None
    a_windows: tuple[str, ...]
    b_windows: tuple[str, ...]

    @property
    def p_adjusted(self) -> float | None:
        return None if self.change is None else self.change.p_adjusted


@dataclass(frozen=True, slots=True)
class Multiplicity:
    """The tests `trend` ran (distinct pairs of sides and figure, each one figure of a diff) and
    the chance of any false change among them: at most `bound`, the sum of their alpha / m."""

    tests: int
    bound: float
    alpha: float


NO_TESTS = Multiplicity(0, 0.0, ALPHA)


@dataclass
class LevelTests:
    """Runs the tests, each diff once (cached by its windows); counts them and their levels."""

    reader: Reader | None
    alpha: float = ALPHA
    summaries: dict[str, SnapshotSummary | None] = field(default_factory=dict)
    diffs: dict[tuple[tuple[str, ...], tuple[str, ...]], Comparison | str] = field(
        default_factory=dict
    )
    done: dict[tuple[str, tuple[str, ...], tuple[str, ...]], LevelTest] = field(
        default_factory=dict
    )

    def multiplicity(self) -> Multiplicity:
        tested = [t for t in self.done.values() if t.tested_in]
        bound = min(1.0, sum(self.alpha / t.tested_in for t in tested))
        return Multiplicity(len(tested), bound, self.alpha)

    def test(self, series: str, before: Sequence[Window], after: Sequence[Window]) -> LevelTest:
        a = tuple(n for n, _ in side_windows(before)[-MAX_WINDOWS:])
        b = tuple(n for n, _ in side_windows(after)[:MAX_WINDOWS])
        key = (series, a, b)
        if key not in self.done:
            self.done[key] = self._test(series, a, b)
        return self.done[key]

    def _test(self, series: str, a: tuple[str, ...], b: tuple[str, ...]) -> LevelTest:
        def untested(why: str, change: Change | None = None) -> LevelTest:
            return LevelTest(Verdict.NOT_TESTED, change, 0, why, a, b)

        if figure_of(series) is None:
            return untested(f"diff does not test {series}")
        if self.reader is not None:  # the windows compared: those whose summary reads
            a, b = (tuple(n for n in names if self._summary(n) is not None) for names in (a, b))
        found = self._diff(a, b)
        if isinstance(found, str):
            return untested(found)
        change, m = row_of(found, series)
        if change is None:
            return untested(_no_row(series))
        if not change.tested:
            return untested(change.note or "diff does not test it here", change)
        verdict = Verdict.SIGNIFICANT if change.significant else Verdict.NOT_SIGNIFICANT
        return LevelTest(verdict, change, m, None, a, b)

    def _diff(self, a: tuple[str, ...], b: tuple[str, ...]) -> Comparison | str:
        if (a, b) not in self.diffs:
            self.diffs[(a, b)] = self._compare(a, b)
        return self.diffs[(a, b)]

    def _compare(self, a: tuple[str, ...], b: tuple[str, ...]) -> Comparison | str:
        if self.reader is None:
            return "no snapshot folders to read the windows from"
        try:
            from sidecar.analyze.compare import Side, compare
        except ModuleNotFoundError as exc:
            extra = missing_extra(exc, "trend")
            if extra is None:
                raise
            return str(extra)
        if not a or not b:
            return "no readable summary on a side"
        sides = [tuple(s for n in names if (s := self._summary(n)) is not None) for names in (a, b)]
        return compare(Side("before", sides[0]), Side("after", sides[1]), alpha=self.alpha)

    def _summary(self, name: str) -> SnapshotSummary | None:
        if name not in self.summaries:
            self.summaries[name] = self.reader(name) if self.reader is not None else None
        return self.summaries[name]


def side_windows(windows: Sequence[Window]) -> list[Window]:
    """The windows a side is compared over: its snapshots, or its baselines when it has none (a
    baseline holds its hour's snapshots' samples again)."""
    snapshots = [w for w in windows if w[1] != "baseline"]
    return snapshots or list(windows)


def confirm(
    series: str,
    candidates: Sequence[int],
    n: int,
    windows: Callable[[int, int], Sequence[Window]],
    tests: LevelTests,
) -> tuple[list[int], dict[int, LevelTest]]:
    """The candidates (first points of a new level, of `n` points) that diff confirms, and the
    last test of each. `windows(lo, hi)`: the windows of the points lo..hi-1. While any fails,
    the weakest is dropped and the rest tested again between the candidates left."""
    live = sorted(candidates)
    last: dict[int, LevelTest] = {}
    while live:
        bounds = [0, *live, n]
        for i, at in enumerate(live, start=1):
            before, after = windows(bounds[i - 1], at), windows(at, bounds[i + 1])
            last[at] = tests.test(series, before, after)
        weak = [at for at in live if last[at].verdict is not Verdict.SIGNIFICANT]
        if not weak:
            break
        live.remove(max(weak, key=lambda at: _weakness(last[at])))
    return live, last


def _no_row(series: str) -> str:
    from sidecar.analyze.compare import MIN_SHARE  # loaded by now: a diff ran

    if series.startswith("share."):
        return f"under {100 * MIN_SHARE:g} % on both sides: diff does not compare it"
    return "not recorded on either side"


def _weakness(test: LevelTest) -> tuple[bool, float]:
    return test.verdict is Verdict.NOT_TESTED, test.p_adjusted or 1.0


# ---------------------------------------------------------------------------------- figures

# trend's serving columns -> diff's figure names (sidecar.analyze.compare.RATES, LATENCIES).
SERVING_FIGURES = {
    "generation_tokens_per_s": "generation tokens/s", "prompt_tokens_per_s": "prompt tokens/s",
    "requests_per_s": "requests/s", "ttft_mean_s": "TTFT mean", "ttft_p50_s": "TTFT p50",
    "ttft_p95_s": "TTFT p95", "itl_mean_s": "ITL mean", "itl_p50_s": "ITL p50",
    "itl_p95_s": "ITL p95", "prefill_time_mean_s": "prefill time mean",
    "decode_time_mean_s": "decode time mean", "requests_waiting": "queue: requests waiting",
    "kv_cache_usage": "KV cache usage", "preemptions": "preemptions",
}  # fmt: skip
CUSTOM = "custom."  # sidecar.store.trend_table.CUSTOM_PREFIX


def figure_of(series: str) -> tuple[str, str | None, str] | None:
    """(kind, role, name) of diff's row for a trend column; None: diff does not test it."""
    if series.startswith("share."):
        _, role, phase = series.split(".", 2)
        return "share", role, phase
    if series.startswith(CUSTOM):
        return "custom", None, series.removeprefix(CUSTOM)
    if series in SERVING_FIGURES:
        return "serving", None, SERVING_FIGURES[series]
    return None


def row_of(comparison: Comparison, series: str) -> tuple[Change | None, int]:
    """diff's row for the column, and the size of the family it was judged in."""
    figure = figure_of(series)
    if figure is None:
        return None, 0
    kind, role, name = figure
    if kind == "custom":
        rows, m = comparison.custom, sum(c.tested for c in comparison.custom)
    else:
        rows, m = (comparison.shares if kind == "share" else comparison.serving), comparison.tested
    found = [c for c in rows if c.role == role and c.name == name]
    return (found[0] if found else None), m


# ---------------------------------------------------------------------------------- words


def test_json(test: LevelTest) -> dict[str, Any]:
    """The verdict as JSON keys; `diff`: diff's row for the figure with `diff --format json`'s
    keys (None: diff has no row for it)."""
    ch = test.change
    row = None
    if ch is not None:
        row = {"kind": ch.kind, "role": ch.role, "name": ch.name, "a": _clean(ch.a),
               "b": _clean(ch.b), "scale": ch.scale, "change": _clean(ch.change),
               "low": _clean(ch.low), "high": _clean(ch.high), "significant": ch.significant,
               "p_adjusted": _clean(ch.p_adjusted), "note": ch.note}  # fmt: skip
    return {"verdict": test.verdict.value, "note": test.note, "tested_in": test.tested_in,
            "a_windows": list(test.a_windows), "b_windows": list(test.b_windows),
            "diff": row}  # fmt: skip


def diff_words(test: LevelTest) -> str:
    """diff's change, its simultaneous interval and adjusted p: `diff: +3.3 pp, +1.8 .. +4.9
    pp, p 3e-07` for a share, `diff: x1.20, x1.05 .. x1.38, p 0.002` for a ratio."""
    ch = test.change
    if ch is None or ch.change is None or ch.low is None or ch.high is None:
        return "diff: -"
    p = ch.p_adjusted if ch.p_adjusted is not None else math.nan
    if ch.scale == "pp":
        return (f"diff: {100 * ch.change:+.1f} pp, {100 * ch.low:+.1f} .. "
                f"{100 * ch.high:+.1f} pp, p {p:.2g}")  # fmt: skip
    return f"diff: x{ch.change:.2f}, x{ch.low:.2f} .. x{ch.high:.2f}, p {p:.2g}"


def chance(p: float) -> str:
    return f"{100 * p:.2g} %" if p >= 0.001 else "under 0.1 %"


def _clean(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)
