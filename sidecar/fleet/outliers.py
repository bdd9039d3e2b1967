"""Which deployments differ from the rest of the fleet that runs the same model and fingerprint.
Pure functions over `SnapshotSummary` records, reusing `diff`'s statistics
(sidecar.analyze.compare).

Each deployment (a host and a `model@port`) is compared with the pooled rest of its group (the
other deployments with the same model and fingerprint digest) as `diff` compares two sides,
with the window as the unit of every figure (`as_window_unit`), from each deployment's sums
(sidecar.fleet.stats: the same changes as `compare`, at a cost that does not grow with the
windows). A
deployment far off inflates every other deployment's rest, so the comparison runs in rounds:
the deployment with the strongest evidence (the smallest adjusted p) is named an outlier and
leaves the pool, and the others are compared again without it, until a round names none. With
two deployments left they are compared once; if they differ, both are named (which one is odd
needs a third). Bonferroni covers every test of every round and group: each is judged at
alpha / m, m counting all of them, so the chance of naming any deployment of a fleet whose
deployments all run the same load stays under alpha.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sidecar.analyze.compare import ALPHA, Change, merge, simultaneous, units_of
from sidecar.fleet.stats import Profile, family, pooled, profile
from sidecar.records.summary import SampleBlock, SnapshotSummary

Key = tuple[str, str]  # (host, deployment)
Group = tuple[str, str]  # (model, fingerprint digest)


@dataclass(frozen=True, slots=True)
class Outlier:
    host: str
    deployment: str
    group: Group
    against: int  # the deployments in the rest it was compared with
    changes: tuple[Change, ...]  # significant at the final m, largest first
    workload: str | None  # why the served work differs from the rest's, when it does
    pair: bool = False  # one of two that differ: which one is odd needs a third


@dataclass(frozen=True, slots=True)
class Outliers:
    outliers: tuple[Outlier, ...]
    tested: int  # m: every test of every round and group
    rounds: int
    alpha: float
    alone: tuple[Key, ...]  # deployments with no other of their model and fingerprint
    unknown: tuple[Key, ...]  # no fingerprint (summaries before schema 3): not compared


@dataclass
class _Test:
    key: Key
    group: Group
    against: int
    changes: list[Change]
    workload: str | None
    pair: bool


def find_outliers(
    groups: Mapping[Group, Mapping[Key, Sequence[SnapshotSummary]]], alpha: float = ALPHA
) -> Outliers:
    """`groups`: (model, fingerprint) -> deployment -> its summaries (SnapshotSummary)."""
    # Each deployment's units summed once (sidecar.fleet.stats): a test then costs the number
    # of figures, whatever the number of windows.
    pools = {g: {k: profile(as_window_unit(s) for s in v) for k, v in d.items()}
             for g, d in groups.items() if g[1] and len(d) >= 2}  # fmt: skip
    alone = tuple(sorted(k for g, d in groups.items() if g[1] and len(d) < 2 for k in d))
    unknown = tuple(sorted(k for g, d in groups.items() if not g[1] for k in d))
    tests: list[_Test] = []
    flagged: list[_Test] = []
    rounds = 0
    while pools:
        rounds += 1
        new = [t for g, pool in pools.items() for t in _round(g, pool)]
        tests += new
        fresh = {id(t) for t in new}
        judged = _judge(tests, alpha)
        done = []
        for g, pool in pools.items():
            mine = [(t, c) for t, c in zip(tests, judged, strict=True)
                    if id(t) in fresh and t.group == g]  # fmt: skip
            hits = [(min(ch.p_adjusted or 1.0 for ch in c if ch.significant), t) for t, c in mine
                    if any(ch.significant for ch in c)]  # fmt: skip
            if not hits:
                done.append(g)
                continue
            if len(pool) == 2:
                flagged += [t for _, t in hits]
                done.append(g)
                continue
            worst = min(hits, key=lambda h: h[0])[1]
            flagged.append(worst)
            del pool[worst.key]
        for g in done:
            del pools[g]
    final = {id(t): c for t, c in zip(tests, _judge(tests, alpha), strict=True)}
    out = []
    for t in flagged:
        significant = [ch for ch in final[id(t)] if ch.significant]
        if significant:  # judged again at the final m: only what still holds is named
            out.append(Outlier(t.key[0], t.key[1], t.group, t.against,
                               tuple(sorted(significant, key=lambda c: -c.magnitude)),
                               t.workload, t.pair))  # fmt: skip
    tested = sum(ch.se is not None for t in tests for ch in t.changes)
    return Outliers(tuple(out), tested, rounds, alpha, alone, unknown)


def _round(group: Group, pool: Mapping[Key, Profile]) -> list[_Test]:
    keys = sorted(pool)
    if len(keys) == 2:  # symmetric: one test, and its mirror for the other of the two
        changes, mix = family(pool[keys[1]], pool[keys[0]])
        return [_Test(keys[0], group, 1, changes, mix, True),
                _Test(keys[1], group, 1, [], mix, True)]  # fmt: skip
    out = []
    for key in keys:
        # The deployment (B) against the pooled rest (A): a change is the deployment's.
        rest = pooled(pool[k] for k in keys if k != key)
        changes, mix = family(rest, pool[key])
        out.append(_Test(key, group, len(keys) - 1, changes, mix, False))
    return out


def as_window_unit(summary: SnapshotSummary) -> SnapshotSummary:
    """The summary with its segments summed into one: the window is the unit of every test.
    Deployments differ in load from window to window far more than the segments of a window
    differ (the reason `diff` takes windows as the units of CPU and rates), and a fleet has
    windows enough; it also makes the tests 5 to 6 times cheaper."""
    blocks = summary.sampling.blocks
    if len(blocks) < 2:
        return summary
    u = merge(units_of(summary))
    block = SampleBlock(
        duration_s=sum(b.duration_s for b in blocks), samples=sum(b.samples for b in blocks),
        counts=u.counts, cpu_s=u.cpu_s, generation_tokens=u.generation_tokens,
        prompt_tokens=u.prompt_tokens, requests=u.requests, span_s=u.span_s,
    )  # fmt: skip
    return replace(summary, sampling=replace(summary.sampling, blocks=(block,)))


def _judge(tests: list[_Test], alpha: float) -> list[list[Change]]:
    """Every test's changes at the Bonferroni level of all tests so far. The second of a pair
    carries no changes of its own: it shares its partner's."""
    flat = [ch for t in tests for ch in t.changes]
    judged = iter(simultaneous(flat, alpha))
    out = [[next(judged) for _ in t.changes] for t in tests]
    for i, t in enumerate(tests):
        if t.pair and not t.changes and i > 0:
            out[i] = [_mirror(ch) for ch in out[i - 1]]
    return out


def _mirror(ch: Change) -> Change:
    """The partner's view of a pair's change: A and B swapped."""
    if ch.scale == "pp":
        change = None if ch.change is None else -ch.change
        low = None if ch.high is None else -ch.high
        high = None if ch.low is None else -ch.low
    else:
        change = None if not ch.change else 1 / ch.change
        low = None if not ch.high else 1 / ch.high
        high = None if not ch.low else 1 / ch.low
    return replace(ch, a=ch.b, b=ch.a, change=change, low=low, high=high)
