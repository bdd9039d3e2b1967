"""`diff`'s comparison (sidecar.analyze.compare) of one deployment against the pooled rest,
from sums.

Every figure `compare` tests is a ratio estimator over units: r = Σy / Σx, with variance
n/(n-1) Σ(y - r x)² / (Σx)², which expands into n, Σy, Σx, Σy², Σx², Σxy; a latency's mean
of logs is the same with x = 1. So each deployment's units are summed once, the pooled rest of
a deployment is the group's sums less its own, and each comparison costs the number of figures,
not the number of windows: a fleet of thousands of windows is compared in milliseconds, where
`compare` over the same units takes seconds per deployment. The figures, the rules that pick
which are tested (MIN_SHARE, MIN_SAMPLES, the binomial floor, MIN_BUSY_SHARE, MIN_COST_SAMPLES,
two windows a side for CPU, rates and latencies) and the tests themselves are `compare`'s;
`tests/unit/fleet/test_fleet_stats.py` checks that both give the same changes on recorded windows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from sidecar.analyze.compare import (
    GROUPS,
    LATENCIES,
    ONE_WINDOW,
    RATES,
    ROLES,
    WAITING,
    Change,
    Comparison,
    Ratio,
    Side,
    Unit,
    Workload,
    change_of,
    costed,
    merge,
    share_change,
    units_of,
    windows_change,
)
from sidecar.records import Phase
from sidecar.records.summary import SnapshotSummary

PHASES = tuple(p.value for p in Phase)
BUSY = tuple(p for p in PHASES if p not in WAITING)
_WORKLOAD = ("span_s", "requests", "prompt_tokens", "generation_tokens")


@dataclass(slots=True)
class Sums:
    """n, Σy, Σx, Σy², Σx², Σxy of a figure's (y, x) pairs over units."""

    n: int = 0
    y: float = 0.0
    x: float = 0.0
    yy: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, y: float, x: float) -> None:
        if not (math.isfinite(y) and math.isfinite(x)):
            return  # as compare.ratio: a non-finite pair is no unit
        self.n += 1
        self.y += y
        self.x += x
        self.yy += y * y
        self.xx += x * x
        self.xy += x * y

    def plus(self, other: Sums, sign: int = 1) -> Sums:
        return Sums(self.n + sign * other.n, self.y + sign * other.y, self.x + sign * other.x,
                    self.yy + sign * other.yy, self.xx + sign * other.xx,
                    self.xy + sign * other.xy)  # fmt: skip

    def ratio(self) -> Ratio:
        """compare.ratio's estimate and variance, from the sums."""
        if self.n == 0 or self.x <= 0:
            return Ratio(None, None, self.n)
        r = self.y / self.x
        if self.n < 2:
            return Ratio(r, None, self.n)
        residual = max(self.yy - 2 * r * self.xy + r * r * self.xx, 0.0)
        return Ratio(r, self.n / (self.n - 1) * residual / self.x**2, self.n)


Key = tuple[str, ...]


@dataclass
class Profile:
    """A side's sums: `units` over its segments (the shares, and CPU and rates when a side has
    one window), `windows` over its windows (CPU and rates otherwise), `values` over the
    windows' serving readings (latencies)."""

    windows: int = 0
    units: dict[Key, Sums] = field(default_factory=dict)
    by_window: dict[Key, Sums] = field(default_factory=dict)
    values: dict[Key, Sums] = field(default_factory=dict)

    def plus(self, other: Profile, sign: int = 1) -> Profile:
        def add(a: dict[Key, Sums], b: dict[Key, Sums]) -> dict[Key, Sums]:
            return {k: a.get(k, Sums()).plus(b.get(k, Sums()), sign) for k in {*a, *b}}

        return Profile(
            self.windows + sign * other.windows,
            add(self.units, other.units),
            add(self.by_window, other.by_window),
            add(self.values, other.values),
        )


def profile(summaries: Iterable[SnapshotSummary]) -> Profile:
    out = Profile()
    for s in summaries:
        out.windows += 1
        units = units_of(s)
        pairs = [_pairs(u) for u in units]
        for unit in pairs:
            _add(out.units, unit)
        # A window of one unit (the fleet sums its segments) is its own window unit.
        _add(out.by_window, pairs[0] if len(units) == 1 else _pairs(merge(units)))
        for _, attr in LATENCIES:
            v = getattr(s.serving, attr)
            if v is not None:
                _sums(out.values, ("value", attr)).add(v, 1.0)
                if v > 0:
                    _sums(out.values, ("log", attr)).add(math.log(v), 1.0)
    return out


def _sums(table: dict[Key, Sums], key: Key) -> Sums:
    got = table.get(key)
    if got is None:
        got = table[key] = Sums()
    return got


def _add(table: dict[Key, Sums], pairs: list[tuple[Key, float, float]]) -> None:
    for key, y, x in pairs:
        _sums(table, key).add(y, x)


def _pairs(u: Unit) -> list[tuple[Key, float, float]]:
    """The unit's (y, x) of every figure it takes part in, keyed by figure."""
    out: list[tuple[Key, float, float]] = [(("units",), 0.0, 1.0)]
    for attr in _WORKLOAD:
        v = getattr(u, attr)
        if v is not None:
            out.append((("workload", attr), v, 1.0))
    for role, counts in u.counts.items():
        n = float(sum(counts.values()))
        out.append((("role", role), n, 1.0))
        busy = float(sum(c for p, c in counts.items() if p not in WAITING))
        out.append((("busy", role), busy, 1.0))
        out += [(("share", role, phase), float(counts.get(phase, 0)), n) for phase in PHASES]
        for group, members in GROUPS.items():
            out.append((("share", role, group), float(sum(counts.get(m, 0) for m in members)), n))
    for role in {*u.counts, *u.cpu_s}:
        cpu = u.cpu_s.get(role)
        if cpu:
            out.append((("cpu_any", role), 1.0, 1.0))
        if cpu is None:
            continue
        counts = u.counts.get(role, {})
        busy = sum(c for p, c in counts.items() if p not in WAITING)
        pers = (("cores", u.span_s), ("cost", None if u.generation_tokens is None
                                      else u.generation_tokens / 1000))  # fmt: skip
        for kind, per in pers:
            if not per:
                continue
            out.append(((kind, role, "all"), cpu, per))
            out += [((kind, role, phase), cpu * counts.get(phase, 0) / busy if busy else 0.0, per)
                    for phase in BUSY]  # fmt: skip
    for _, attr in RATES:
        v = getattr(u, attr)
        if v is not None and u.span_s:
            out.append((("rate", attr), v, u.span_s))
    return out


# ---------------------------------------------------------------------------------- compare


def family(a: Profile, b: Profile) -> tuple[list[Change], str | None]:
    """`compare(A, B).family` (untested by Bonferroni: estimates, standard errors and degrees
    of freedom; `simultaneous` judges them) and `mix_differs`, from the sums."""
    by_window = a.windows >= 2 and b.windows >= 2
    ca, cb = (a.by_window, b.by_window) if by_window else (a.units, b.units)
    cpu = [*_cpu(ca, cb, "cores"), *_cpu(ca, cb, "cost"), *_rates(ca, cb)]
    if not by_window:
        cpu = [replace(c, estimate=None, se=None, df=None, note=c.note or ONE_WINDOW)
               for c in cpu]  # fmt: skip
    changes = [*_shares(a.units, b.units), *cpu, *_latencies(a, b)]
    mix = Comparison(Side("A", ()), Side("B", ()), (), (), (_workload(a), _workload(b)),
                     (), (), (), (), (), 0, 0.0).mix_differs  # fmt: skip
    return changes, mix


def _get(t: dict[Key, Sums], *key: str) -> Sums:
    return t.get(key) or Sums()


def _roles(ua: dict[Key, Sums], ub: dict[Key, Sums]) -> list[str]:
    present = [{k[1] for k, s in t.items() if k[0] == "role" and s.y > 0} for t in (ua, ub)]
    both = present[0] & present[1]
    return [r for r in ROLES if r in both] + sorted(both - set(ROLES))


def _shares(ua: dict[Key, Sums], ub: dict[Key, Sums]) -> list[Change]:
    out = []
    for role in _roles(ua, ub):
        names = list(PHASES)
        for group, members in GROUPS.items():
            if all(_get(ua, "share", role, m).y + _get(ub, "share", role, m).y > 0
                   for m in members):  # fmt: skip
                names.append(group)
        for name in names:
            # Every unit of a side is a pair, (0, 0) where the role has no samples: n is theirs.
            sa, sb = (replace(_get(t, "share", role, name), n=_get(t, "units").n)
                      for t in (ua, ub))  # fmt: skip
            found = share_change(role, name, sa.ratio(), sb.ratio(), sa.y + sb.y, (sa.x, sb.x))
            if found is not None:
                out.append(found)
    return out


def _cpu(ca: dict[Key, Sums], cb: dict[Key, Sums], kind: str) -> list[Change]:
    out = []
    for role in _roles(ca, cb):
        if _get(ca, "cpu_any", role).n + _get(cb, "cpu_any", role).n == 0:
            continue
        phases = ["all"]
        busy = [_get(t, "busy", role).y for t in (ca, cb)]
        for phase in BUSY:
            hits = [_get(t, "share", role, phase).y for t in (ca, cb)]
            shares = [h / n if n > 0 else 0.0 for h, n in zip(hits, busy, strict=True)]
            if costed(shares, hits):
                phases.append(phase)
        for name in phases:
            a, b = (_get(t, kind, role, name).ratio() for t in (ca, cb))
            out.append(change_of(kind, role, name, a, b, log=True))
    return out


def _rates(ca: dict[Key, Sums], cb: dict[Key, Sums]) -> list[Change]:
    return [change_of("serving", None, name, _get(ca, "rate", attr).ratio(),
                      _get(cb, "rate", attr).ratio(), log=True)
            for name, attr in RATES]  # fmt: skip


def _latencies(a: Profile, b: Profile) -> list[Change]:
    out = []
    for name, attr in LATENCIES:
        va, vb = _get(a.values, "value", attr), _get(b.values, "value", attr)
        means = (va.y / va.n if va.n else None, vb.y / vb.n if vb.n else None)
        logs = (_get(a.values, "log", attr).ratio(), _get(b.values, "log", attr).ratio())
        out.append(windows_change(name, means, (va.n, vb.n), logs))
    return out


def _workload(p: Profile) -> Workload:
    t = p.units

    def total(attr: str) -> float | None:
        s = _get(t, "workload", attr)
        return s.y if s.n else None

    return Workload(windows=p.windows, units=_get(t, "units").n, seconds=total("span_s"),
                    requests=total("requests"), prompt_tokens=total("prompt_tokens"),
                    generation_tokens=total("generation_tokens"))  # fmt: skip


def pooled(profiles: Iterable[Profile]) -> Profile:
    """The sides' sums added (the rest of a group: added, not the total less one, so no sum
    loses digits to a subtraction)."""
    out = Profile()
    for p in profiles:
        out = out.plus(p)
    return out
