"""The live tests' bounds, derived from the recorded noise of this machine.

benchmarks/noise.py records many windows of each workload, taken exactly as the live tests take
theirs (devtools/live_window.py), in tests/fixtures/noise/live_windows.json. This module turns
that record into what tests/integration/test_live_snapshot.py asserts, so that each assertion
rests on the spread measured here rather than on a guess:

- a `Margin` for each comparison between workloads (prefill-heavy has more worker compute per
  step's bookkeeping than decode-heavy): the test asserts that one window of A less one of B is
  above the recorded mean difference less K standard deviations of that difference;
- a `Claim` for each fixed bound the docs state (docs/PHASES.md: at least 95 % of a role's samples
  in its allowed phases; README: counts within 10 %): the test asserts the stated bound, and
  tests/unit/project/test_noise_bounds.py checks that the record puts it far enough from the
  recorded mean for the same chance of a false failure;
- the number of windows to take per workload until one is valid (`attempts`).

The standard deviations are those of one new window (a prediction: sd^2 (1 + 1/n) from n
recorded windows), and K the Student t quantile for P_FALSE_FAILURE at their degrees of
freedom, which accounts for estimating them from few windows. Re-measuring updates it all.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.live_window import EXPECTED, WORKLOADS, load_inside, measures
from devtools.loadgen import LoadResult

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "noise" / "live_windows.json"
# What the record keeps of each window's summary.json: enough to compute every figure again.
SUMMARY_PARTS = ("created_at", "sampling", "by_role", "role_samples", "main_thread", "serving")
# The chance of a false failure per assertion. The margins sit exactly at it; the stated
# bounds further out (test_noise_bounds.py prints each one's chance): a run of the live tests
# fails falsely with a chance of about 2e-4, and passes 5 times in a row with more than 99.9 %.
P_FALSE_FAILURE = 1e-4


@dataclass(frozen=True, slots=True)
class Spread:
    """Mean and sample standard deviation of one figure over n windows."""

    n: int
    mean: float
    sd: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        n = len(values)
        if n < 3:
            raise ValueError(f"{n} windows recorded: a spread needs at least 3 (re-measure)")
        mean = math.fsum(values) / n
        return cls(n, mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)))


def t_sf(x: float, df: int) -> float:
    """P(T > x) for Student's t with DF degrees of freedom (x >= 0), by Simpson's rule on the
    density (there is no SciPy here): within 1e-12 of the closed forms for 1 and 2 df."""
    if x < 0:
        raise ValueError("t_sf takes x >= 0")
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def density(t: float) -> float:
        return c * math.pow(1 + t * t / df, -(df + 1) / 2)

    steps = 4000  # even
    h = x / steps
    body = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
    return 0.5 - h / 3 * (density(0.0) + body + density(x))


@functools.cache
def t_quantile(p: float, df: int) -> float:
    """The x with P(T > x) = p, by bisection."""
    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf(mid, df) > p else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True, slots=True)
class Record:
    """The recorded windows (benchmarks/noise.py's output)."""

    sessions: tuple[Mapping[str, Any], ...]  # each server session's provenance
    windows: tuple[Mapping[str, Any], ...]

    def valid(self, workload: str) -> list[Mapping[str, Any]]:
        """The windows the sidecar did not report invalid, the only kind the tests assert on;
        less any window taken while the previous window's load was still running (before
        `take_window` waited for an idle server, one such window held that load's tail)."""
        return [
            w
            for i, w in enumerate(self.windows)
            if w["workload"] == workload and not w["invalid_reason"] and not self._after_overrun(i)
        ]

    def _after_overrun(self, index: int) -> bool:
        before = self.windows[index - 1] if index else None
        if before is None or before.get("session") != self.windows[index].get("session"):
            return False
        fields = before.get("load")
        return fields is not None and not load_inside(_load(fields))

    def spread(self, workload: str, quantity: str) -> Spread:
        """Over the valid windows that have the figure (the counts' agreement is not computed
        for a window whose load outran it)."""
        windows = self.valid(workload)
        return Spread.of(
            [float(w["measures"][quantity]) for w in windows if quantity in w["measures"]]
        )


def measures_again(window: Mapping[str, Any]) -> dict[str, float]:
    """A recorded window's figures computed again from what the record kept of it."""
    load = _load(window["load"]) if window["load"] else None
    return measures(window["summary"], load, "\n".join(window["log"]))


def _load(fields: Mapping[str, Any]) -> LoadResult:
    return LoadResult(**{k: fields[k] for k in LoadResult.__dataclass_fields__})


def recompute(path: Path = FIXTURE) -> int:
    """Write every recorded window's figures again from what the record kept (after a change
    to a figure's definition); returns how many windows changed."""
    data = json.loads(path.read_text())
    changed = 0
    for window in data["windows"]:
        again = measures_again(window)
        changed += again != window["measures"]
        window["measures"] = again
    path.write_text(json.dumps(data, indent=1) + "\n")
    return changed


def load_record(path: Path = FIXTURE) -> Record:
    data = json.loads(path.read_text())
    return Record(tuple(data["sessions"]), tuple(data["windows"]))


@dataclass(frozen=True, slots=True)
class Margin:
    """One window of workload A minus one of workload B, for QUANTITY, is above `bound`:
    the recorded mean difference less K standard deviations of that difference."""

    quantity: str
    a: str
    b: str
    mean_diff: float
    sd: float  # of the difference between one new window of each, prediction included
    df: float  # Welch-Satterthwaite degrees of freedom of that standard deviation
    k: float
    bound: float


def margin(record: Record, quantity: str, a: str, b: str) -> Margin:
    """The windows are independent, so the variances add; each is the prediction variance of
    one new window, sd^2 (1 + 1/n), and K the t quantile for its Welch-Satterthwaite df."""
    sa, sb = record.spread(a, quantity), record.spread(b, quantity)
    va, vb = sa.sd**2 * (1 + 1 / sa.n), sb.sd**2 * (1 + 1 / sb.n)
    parts = va**2 / (sa.n - 1) + vb**2 / (sb.n - 1)
    df = (va + vb) ** 2 / parts if parts > 0 else float(sa.n + sb.n - 2)
    k = t_quantile(P_FALSE_FAILURE, max(1, math.floor(df)))
    diff, sd = sa.mean - sb.mean, math.sqrt(va + vb)
    return Margin(quantity, a, b, diff, sd, df, k, diff - k * sd)


@dataclass(frozen=True, slots=True)
class Claim:
    """A bound the docs state for QUANTITY in every window: at least `low`, at most `high`."""

    quantity: str
    low: float | None = None
    high: float | None = None

    def holds(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def headroom(self, spread: Spread) -> float:
        """How many prediction standard deviations the recorded mean is from the nearer bound
        (negative: on the wrong side). A figure that never moved has infinite headroom."""
        sd = spread.sd * math.sqrt(1 + 1 / spread.n)
        gaps = [spread.mean - self.low] if self.low is not None else []
        gaps += [self.high - spread.mean] if self.high is not None else []
        gap = min(gaps)
        return gap / sd if sd > 0 else math.copysign(math.inf, gap)

    def p_false_failure(self, spread: Spread) -> float:
        """The chance that one new window is on the wrong side (t with n - 1 df)."""
        h = self.headroom(spread)
        return 0.0 if h == math.inf else 1.0 if h <= 0 else t_sf(h, spread.n - 1)


def invalid_rate(record: Record, workload: str) -> float:
    """The share of WORKLOAD's windows the sidecar reported invalid, as (x + 1) / (m + 2):
    never 0 from a record without a late window, which would promise more than it showed."""
    windows = [w for w in record.windows if w["workload"] == workload]
    late = sum(1 for w in windows if w["invalid_reason"])
    return (late + 1) / (len(windows) + 2)


def p_no_valid_window(record: Record, n: int) -> float:
    """The chance a run finds no valid window of some workload in N attempts."""
    workloads = {w["workload"] for w in record.windows}
    return 1 - math.prod(1 - invalid_rate(record, w) ** n for w in workloads)


def attempts(record: Record) -> int:
    """Windows to take per workload at most (see P_NO_VALID_WINDOW)."""
    n = 1
    while n < MAX_ATTEMPTS and p_no_valid_window(record, n) >= P_NO_VALID_WINDOW:
        n += 1
    return n


# Retakes: a live test takes up to `attempts(record)` windows per workload until the sidecar
# reports one valid: enough for a chance under P_NO_VALID_WINDOW a run of finding none for some
# workload, at the recorded rates of invalid windows, but never more than MAX_ATTEMPTS (each
# costs about 25 s). A workload without a valid window has its accuracy checks skipped.
P_NO_VALID_WINDOW = 1e-3
MAX_ATTEMPTS = 5

PREFILL, DECODE, MIXED = WORKLOADS
# The live tests' comparisons between workloads: one window of A above one of B. Each must have
# a positive margin in the record (tests/unit/project/test_noise_bounds.py), or it is not asserted.
COMPARISONS = (
    ("compute_to_step_overhead", PREFILL, DECODE),
    ("compute_to_step_overhead", PREFILL, MIXED),
)
# Bounds the docs state, asserted on every valid window as they are: docs/PHASES.md roles (at
# least 95 % of a role's samples in its allowed phases, at most 3 % `other`), the README's
# agreement (counts within 10 %), a model that is stepped at all (a window that missed the
# load shows 0.005), and enough samples (the record's windows hold 3,100 to 4,000; far
# fewer means py-spy missed part of the window, and shares noisier than recorded).
CLAIMS = (
    Claim("samples", low=2000),
    *(Claim(f"{role}_inside", low=0.95) for role in EXPECTED),
    *(Claim(f"{role}_other", high=0.03) for role in EXPECTED),
    Claim("main_thread_step", low=0.02),
    *(
        Claim(f"{name}_ratio", low=0.9, high=1.1)
        for name in ("requests", "prompt_tokens", "generation_tokens", "logged_prompt")
    ),
)
