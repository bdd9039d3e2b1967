"""How long a window's time slices must be to serve as the units of a comparison.

A comparison estimates how much a phase share moves by chance from the spread of the share
between a window's units (sidecar/analyze/compare.py). That estimate is right when neighbouring
units are uncorrelated: correlated ones agree more than independent ones would, the spread comes
out too small, and a steady server shows "significant" changes. Consecutive samples of a thread
*are* correlated (a forward pass lasts several samples; a burst of requests lasts seconds), so
a unit must be long enough for its neighbour to have forgotten it, and no longer, since every
unit more is power (a 20 s window in 2 s slices is ten units; in py-spy's 10 s segments, two).

The choice, from samples recorded in order on the real server (devtools/ordered_check.py, the
record tests/fixtures/noise/ordered.json): the samples binned by `BIN_S`, each phase share that
holds at least MIN_SHARE of its role's samples (the shares a comparison tests with power) is
followed slice by slice for each candidate length, and the lag-1 autocorrelation of its
consecutive slices measured. The slices are long enough when the samples-weighted mean of those
autocorrelations is at most RHO_MAX and none exceeds RHO_MAX by more than twice its standard
error (1/sqrt(slices)): chance alone puts single series above RHO_MAX, a real dependence puts
them all there. The shortest candidate that passes is the one (`choose_unit`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BIN_S = 0.5  # the recorded bins' length, seconds
CANDIDATES_S = (0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0)
MIN_SHARE = 0.05  # of its role's samples: a phase followed
MIN_SLICES = 12  # a candidate needs this many slices of the record to be judged
RHO_MAX = 0.1  # the lag-1 autocorrelation slices may keep

Bins = Sequence[Mapping[str, Mapping[str, int]]]  # per bin: role -> phase -> samples


@dataclass(frozen=True, slots=True)
class Candidate:
    unit_s: float
    slices: int
    rho: Mapping[str, float]  # "role/phase" -> lag-1 autocorrelation of its slice shares
    mean_rho: float  # weighted by each series' samples
    passes: bool


@dataclass(frozen=True, slots=True)
class Choice:
    unit_s: float | None  # None: no candidate passed (the record is too short or too correlated)
    candidates: tuple[Candidate, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit_s": self.unit_s,
            "rho_max": RHO_MAX,
            "min_share": MIN_SHARE,
            "candidates": [
                {
                    "unit_s": c.unit_s,
                    "slices": c.slices,
                    "mean_rho": round(c.mean_rho, 4),
                    "passes": c.passes,
                    "rho": {k: round(v, 4) for k, v in c.rho.items()},
                }
                for c in self.candidates
            ],
        }


def choose_unit(bins: Bins, bin_s: float = BIN_S) -> Choice:
    """The shortest candidate length whose slices are nearly uncorrelated (module docstring)."""
    series = followed(bins)
    weight = {key: n for key, n in series.items()}
    out: list[Candidate] = []
    for unit_s in CANDIDATES_S:
        per = round(unit_s / bin_s)
        if per < 1 or abs(per * bin_s - unit_s) > 1e-9:
            continue
        slices = [_sum(bins[i : i + per]) for i in range(0, len(bins) - per + 1, per)]
        if len(slices) < MIN_SLICES:
            break
        rho = {}
        for key in series:
            role, phase = key.split("/", 1)
            shares = [s.get(role, {}).get(phase, 0) / t for s in slices
                      if (t := sum(s.get(role, {}).values())) > 0]  # fmt: skip
            if (r := lag1(shares)) is not None:
                rho[key] = r
        total = sum(weight[k] for k in rho)
        mean = sum(weight[k] * r for k, r in rho.items()) / total if total else 0.0
        bound = RHO_MAX + 2 / math.sqrt(len(slices))
        passes = bool(rho) and mean <= RHO_MAX and all(r <= bound for r in rho.values())
        out.append(Candidate(unit_s, len(slices), rho, mean, passes))
    chosen = next((c.unit_s for c in out if c.passes), None)
    return Choice(chosen, tuple(out))


def followed(bins: Bins) -> dict[str, int]:
    """The phases whose share is followed ("role/phase" -> their samples): at least MIN_SHARE
    of the role's samples, and not the whole of them (a share always 1 cannot move)."""
    total = _sum(bins)
    out = {}
    for role, phases in total.items():
        n = sum(phases.values())
        for phase, k in phases.items():
            if n and MIN_SHARE <= k / n < 1 - MIN_SHARE:
                out[f"{role}/{phase}"] = k
    return out


def lag1(values: Sequence[float]) -> float | None:
    """The lag-1 autocorrelation (the usual estimator: the lag-1 autocovariance over the
    variance, both about the whole series' mean); None for a constant or too short series."""
    n = len(values)
    if n < 3:
        return None
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values)
    if var <= 0:
        return None
    return sum((values[i] - mean) * (values[i + 1] - mean) for i in range(n - 1)) / var


def _sum(bins: Bins) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for b in bins:
        for role, phases in b.items():
            mine = out.setdefault(role, {})
            for phase, n in phases.items():
                mine[phase] = mine.get(phase, 0) + n
    return out
