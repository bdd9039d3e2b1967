"""Intervals a share can have: each side's share within [0, 1] and their difference within
[-1, 1], as Welch's t interval on the raw difference cannot promise with few units (two 20 s
windows of 10 s segments gave worker idle -170 .. +139 pp).

- Each side: Wilson's score interval at the side's *effective* sample size, the Korn-Graubard
  rule for a share estimated from clustered samples (Korn and Graubard 1998, "Confidence
  intervals for proportions with small expected number of positive counts estimated from survey
  data", Survey Methodology 24): n_eff = p (1 - p) / var, the ratio estimator's variance over
  the units, never above the number of samples (a design effect below 1 would claim more than
  independent samples give) and the number of samples where p is 0 or 1. The critical value is
  Student's t at the comparison's Welch-Satterthwaite degrees of freedom and Bonferroni level,
  which is Korn-Graubard's degrees-of-freedom adjustment (Wilson at n_eff with t equals Wilson
  at n_eff (z/t)^2 with z).
- The difference: Newcombe's hybrid score interval (Newcombe 1998, "Interval estimation for
  the difference between independent proportions", Statistics in Medicine 17, method 10),
  which combines the two Wilson intervals. Away from 0 and 1 it is Welch's interval; near them
  it bends as the shares can.
The two-sided p of a difference is the level at which its interval just reaches no change, so
a difference is significant exactly when its interval excludes 0.
"""

from __future__ import annotations

import math

from scipy import special


def effective_n(share: float, var: float | None, samples: float) -> float:
    """Korn-Graubard's effective sample size of a share over clustered samples."""
    if var is None or var <= 0 or not 0 < share < 1:
        return samples
    return min(samples, share * (1 - share) / var)


def wilson(share: float, n: float, crit: float) -> tuple[float, float]:
    """Wilson's score interval of a share over `n` (effective) samples at critical value
    `crit`; within [0, 1] for any n > 0 (scipy's binomtest(...).proportion_ci(method="wilson")
    for whole counts, which it takes only)."""
    c2n = crit * crit / n
    centre = (share + c2n / 2) / (1 + c2n)
    half = crit / (1 + c2n) * math.sqrt(share * (1 - share) / n + c2n / (4 * n))
    # It holds the share; rounding at 0 or 1 must not say otherwise.
    return max(0.0, min(centre - half, share)), min(1.0, max(centre + half, share))


def newcombe(a: tuple[float, float], b: tuple[float, float], crit: float) -> tuple[float, float]:
    """The interval of B - A, each side (share, effective n): Newcombe's hybrid score interval.
    Within [l_B - u_A, u_B - l_A], so within [-1, 1]."""
    (pa, na), (pb, nb) = a, b
    la, ua = wilson(pa, na, crit)
    lb, ub = wilson(pb, nb, crit)
    d = pb - pa
    return d - math.hypot(pb - lb, ua - pa), d + math.hypot(ub - pb, pa - la)


def newcombe_p(a: tuple[float, float], b: tuple[float, float], df: float) -> float:
    """Two-sided p of B - A: 2 P(T_df > c), c the critical value at which the interval's
    nearer end reaches 0 (its ends move away from the estimate as c grows)."""
    d = b[0] - a[0]
    if d == 0:
        return 1.0

    def gap(c: float) -> float:
        low, high = newcombe(a, b, c)
        return low if d > 0 else -high

    top = 1.0
    while gap(top) > 0:
        top *= 4
        if top > 1e8:  # no spread on either side: as certain as the samples can say
            return 0.0
    low, high = 0.0, top  # gap falls from > 0 at 0 to <= 0 at top: bisect to 1e-10
    while high - low > 1e-10:
        mid = (low + high) / 2
        low, high = (mid, high) if gap(mid) > 0 else (low, mid)
    return 2 * t_sf((low + high) / 2, df)


def t_ppf(q: float, df: float) -> float:
    """Student's t quantile: scipy.stats.t.ppf(q, df), from scipy.special alone (importing
    scipy.stats costs `trend` about a second more)."""
    return float(special.stdtrit(df, q))


def t_sf(x: float, df: float) -> float:
    """Student's t upper tail: scipy.stats.t.sf(x, df)."""
    return float(special.stdtr(df, -x))
