"""The comparison's statistics (sidecar/analyze/compare.py): the ratio estimator, the intervals, and
their calibration on simulated correlated samples with a known truth. The recorded real windows
are tests/unit/diff/test_diff_recorded.py."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sidecar.analyze.compare import (
    Side,
    Unit,
    compare,
    fingerprint_changes,
    ratio,
    regressions,
    units_of,
)
from sidecar.records.summary import Fingerprint, SampleBlock, SamplingSection, SnapshotSummary
from sidecar.store.summary_io import read_summary

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_the_ratio_estimator_and_its_variance_by_hand() -> None:
    pairs = [(2.0, 10.0), (4.0, 10.0), (3.0, 20.0)]
    r = ratio(pairs)
    assert r.value == pytest.approx(9 / 40)
    # n/(n-1) * sum (y - R x)^2 / (sum x)^2
    resid = sum((y - 9 / 40 * x) ** 2 for y, x in pairs)
    assert r.var == pytest.approx(3 / 2 * resid / 40**2)
    assert r.n == 3


def test_one_unit_has_an_estimate_but_no_variance_and_no_units_none() -> None:
    assert ratio([(1.0, 4.0)]).var is None
    assert ratio([(1.0, 4.0)]).value == 0.25
    assert ratio([]).value is None
    assert ratio([(1.0, 0.0)]).value is None


def _summary(
    name: str, blocks: list[SampleBlock], fp: Fingerprint | None = None
) -> SnapshotSummary:
    return SnapshotSummary(name=name, created_at="2026-12-01T00:00:00+00:00", host="h",
                           sampling=SamplingSection(blocks=tuple(blocks)), fingerprint=fp)  # fmt: skip


def _blocks(rng: np.random.Generator, p: float, n_units: int, rho: float, cpu: float,
            tokens: float) -> list[SampleBlock]:  # fmt: skip
    """Units of a steady load: each unit's true share drawn around P (beta, intra-unit
    correlation RHO: samples within a unit move together), 200 worker samples a unit."""
    a = p * (1 - rho) / rho
    b = (1 - p) * (1 - rho) / rho
    out = []
    for _ in range(n_units):
        share = rng.beta(a, b)
        forward = int(rng.binomial(200, share))
        gen = float(rng.poisson(tokens))
        out.append(SampleBlock(
            duration_s=5.0, samples=200,
            counts={"worker": {"forward": forward, "idle": 200 - forward}},
            cpu_s={"worker": cpu * gen / tokens * float(rng.normal(1, 0.05))},
            generation_tokens=gen, prompt_tokens=gen * 3, requests=gen / 50, span_s=5.0,
        ))  # fmt: skip
    return out


def test_steady_load_false_alarms_stay_at_the_stated_rate_on_correlated_samples() -> None:
    """Two sides drawn from the same steady load, 400 times: the family-wise rate of *any*
    significant change must not exceed 5 % (plus the simulation's own error)."""
    rng = np.random.default_rng(7)
    alarms = 0
    trials = 400
    for _ in range(trials):
        a = _summary("a", _blocks(rng, 0.3, 6, 0.05, 5.0, 3000))
        b = _summary("b", _blocks(rng, 0.3, 6, 0.05, 5.0, 3000))
        alarms += bool(compare(Side("A", (a,)), Side("B", (b,))).significant)
    rate = alarms / trials
    se = math.sqrt(0.05 * 0.95 / trials)
    assert rate <= 0.05 + 2 * se, f"{alarms} false alarms in {trials} steady pairs"


def test_a_real_shift_is_found_and_named() -> None:
    rng = np.random.default_rng(1)
    a = _summary("a", _blocks(rng, 0.30, 6, 0.02, 5.0, 3000))
    b = _summary("b", _blocks(rng, 0.45, 6, 0.02, 5.0, 3000))
    c = compare(Side("A", (a,)), Side("B", (b,)))
    (forward,) = [ch for ch in c.shares if ch.role == "worker" and ch.name == "forward"]
    assert forward.significant and forward.low is not None and forward.low > 0
    assert forward.high is not None and forward.low <= 0.15 <= forward.high  # the truth
    assert c.significant[0] is forward or forward in c.significant


def test_a_doubled_cpu_cost_per_token_is_a_regression_beyond_10_percent() -> None:
    """CPU costs are tested with the windows as units (two or more a side)."""
    rng = np.random.default_rng(3)
    a = tuple(_summary(f"a{i}", _blocks(rng, 0.3, 6, 0.02, 5.0, 3000)) for i in range(3))
    b = tuple(_summary(f"b{i}", _blocks(rng, 0.3, 6, 0.02, 10.0, 3000)) for i in range(3))
    one = compare(Side("A", a[:1]), Side("B", b[:1]))
    assert not any(ch.tested for ch in one.costs) and not regressions(one, 0.10)
    c = compare(Side("A", a), Side("B", b))
    (total,) = [ch for ch in c.costs if ch.role == "worker" and ch.name == "all"]
    assert total.significant and total.change == pytest.approx(2.0, rel=0.1)
    assert total in regressions(c, 0.10)
    assert total not in regressions(c, 1.5)  # beyond a 150 % threshold it is not


def test_a_window_without_segments_is_one_unit_and_is_not_tested() -> None:
    """Summaries written before schema 3 keep no segments: one unit a window, so a single pair
    cannot be tested, and the diff says so instead of inventing an interval."""
    old = read_summary(FIXTURES / "schema1" / "20261201T112537Z")
    (unit,) = units_of(old)
    assert isinstance(unit, Unit) and unit.counts
    c = compare(Side("A", (old,)), Side("B", (old,)))
    assert c.tested == 0 and not c.significant
    assert all(ch.note for ch in c.shares)


def test_fingerprint_changes_name_software_and_flags_in_order() -> None:
    a = Fingerprint(vllm="0.31.0", python="3.12.3", model="m",
                    serving={"--max-num-seqs": "256", "--dtype": "float32"})  # fmt: skip
    b = replace(a, vllm="0.32.0", serving={"--max-num-seqs": "128", "--dtype": "float32",
                                           "--enable-prefix-caching": "true"})  # fmt: skip
    words = [c.words() for c in fingerprint_changes(a, b)]
    assert words[0] == "vLLM 0.31.0 \u2192 0.32.0"
    assert "max-num-seqs 256 \u2192 128" in words
    assert "enable-prefix-caching default \u2192 true" in words
    assert not any("dtype" in w for w in words)
    assert fingerprint_changes(a, None) == ()
    assert fingerprint_changes(a, replace(a, notes={"torch": "not found"})) == ()
