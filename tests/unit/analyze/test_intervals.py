"""The intervals of a difference of shares (sidecar/analyze/intervals.py): Wilson's score
interval as scipy computes it, Newcombe's hybrid score interval as Newcombe published it, and
the bounds a share has, whatever the samples."""

from __future__ import annotations

import itertools

import pytest
from scipy import stats

from sidecar.analyze.intervals import effective_n, newcombe, newcombe_p, wilson

Z95 = float(stats.norm.ppf(0.975))


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 20), (10, 10), (56, 70), (1, 1000)])
def test_wilson_is_scipys_for_whole_counts(k: int, n: int) -> None:
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
    assert wilson(k / n, n, Z95) == pytest.approx((ci.low, ci.high), abs=1e-12)


# Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (the hybrid score
# interval): p1 - p2 for the eight published examples, to the published four decimals.
NEWCOMBE_TABLE_II = [
    ((56, 70), (48, 80), (0.0524, 0.3339)),
    ((9, 10), (3, 10), (0.1705, 0.8090)),
    ((6, 7), (2, 7), (0.0582, 0.8062)),
    ((5, 56), (0, 29), (-0.0381, 0.1926)),
    ((0, 10), (0, 20), (-0.1611, 0.2775)),
    ((0, 10), (0, 10), (-0.2775, 0.2775)),
    ((10, 10), (0, 20), (0.6791, 1.0000)),
    ((10, 10), (0, 10), (0.6075, 1.0000)),
]


@pytest.mark.parametrize(("one", "two", "published"), NEWCOMBE_TABLE_II)
def test_newcombe_gives_the_published_intervals(
    one: tuple[int, int], two: tuple[int, int], published: tuple[float, float]
) -> None:
    (k1, n1), (k2, n2) = one, two
    # newcombe(a, b) is B - A: Newcombe's p1 - p2 is B = sample 1, A = sample 2.
    low, high = newcombe((k2 / n2, n2), (k1 / n1, n1), Z95)
    assert (round(low, 4), round(high, 4)) == pytest.approx(published, abs=1e-4)


SHARES = [0.0, 0.001, 0.02, 0.3, 0.5, 0.97, 1.0]


@pytest.mark.parametrize("crit", [1.0, 3.5, 40.0, 500.0])
@pytest.mark.parametrize("n", [0.5, 3.0, 200.0, 1e6])
def test_every_interval_stays_within_what_a_share_can_be(crit: float, n: float) -> None:
    """Any shares, any (effective) sample size, any critical value (Bonferroni with Welch's
    degrees of freedom near 1 gives hundreds): each share's interval within [0, 1], the
    difference's within [-1, 1] and holding the estimate, mirrored when A and B swap."""
    for pa, pb in itertools.product(SHARES, SHARES):
        for p in (pa, pb):
            lo, hi = wilson(p, n, crit)
            assert 0.0 <= lo <= p <= hi <= 1.0
        low, high = newcombe((pa, n), (pb, n), crit)
        assert -1.0 <= low <= pb - pa + 1e-12 and pb - pa - 1e-12 <= high <= 1.0
        back = newcombe((pb, n), (pa, n), crit)
        assert back == pytest.approx((-high, -low), abs=1e-12)


def test_the_p_value_is_where_the_interval_reaches_no_change() -> None:
    a, b, df = (0.30, 400.0), (0.36, 380.0), 12.0
    p = newcombe_p(a, b, df)
    assert 0 < p < 1
    at_p = float(stats.t.ppf(1 - p / 2, df))  # the interval at level 1 - p ends at 0
    assert newcombe(a, b, at_p)[0] == pytest.approx(0.0, abs=1e-9)
    assert newcombe(a, b, at_p * 0.99)[0] > 0 > newcombe(a, b, at_p * 1.01)[0]
    assert newcombe_p(b, a, df) == pytest.approx(p)
    assert newcombe_p(a, a, df) == 1.0


def test_effective_samples_never_exceed_the_samples() -> None:
    """Korn-Graubard: n_eff = p (1 - p) / var, at most the samples (a design effect under 1
    would claim more than independent samples), and the samples at 0 or 1 or no variance."""
    assert effective_n(0.3, 0.3 * 0.7 / 100, 1000) == pytest.approx(100)
    assert effective_n(0.3, 1e-9, 1000) == 1000
    assert effective_n(0.0, 0.01, 1000) == 1000
    assert effective_n(0.5, None, 50) == 50
