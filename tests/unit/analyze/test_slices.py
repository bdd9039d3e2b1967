"""The time slices' length (sidecar/analyze/slices.py), chosen from samples recorded in order on
the real vLLM CPU server under a steady mixed load (devtools/ordered_check.py), and what a
comparison does with slices (sidecar/analyze/compare.py)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from sidecar.analyze.compare import Side, share_units_of, units_of
from sidecar.analyze.slices import BIN_S, choose_unit, followed, lag1
from sidecar.config.settings import Config
from sidecar.records.summary import SampleBlock, SnapshotSummary
from sidecar.store.summary_io import read_summary

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "noise" / "ordered.json"


def record() -> dict:  # type: ignore[type-arg]
    return json.loads(RECORD.read_text())


def test_the_record_was_read_right_side_by_side_with_py_spys_raw_output() -> None:
    checks = record()["side_by_side"]
    assert len(checks) >= 3  # the API server, the EngineCore, the worker (and its parent)
    for c in checks:
        # the same samples, give or take the moment the two runs started apart
        assert abs(c["read_samples"] - c["raw_samples"]) <= max(3, 0.1 * c["raw_samples"])


def test_the_shipped_slices_are_at_least_as_long_as_the_record_asks() -> None:
    r = record()
    assert r["ordered"]["bin_s"] == BIN_S and len(r["ordered"]["bins"]) * BIN_S >= 120
    choice = choose_unit(r["ordered"]["bins"])
    assert choice.to_dict() == r["choice"]  # the record's own figures, computed again
    assert choice.unit_s is not None
    assert choice.unit_s <= Config().sampling.unit_s <= 3 * choice.unit_s
    # half-second slices are not independent: the record shows it (what the choice rests on)
    first = choice.candidates[0]
    assert first.unit_s == 0.5 and not first.passes and first.mean_rho > 0.15


def test_the_followed_shares_are_the_ones_a_comparison_tests_with_power() -> None:
    names = followed(record()["ordered"]["bins"])
    assert {"worker/forward", "worker/idle", "api_server/idle"} <= set(names)


def test_lag1_is_the_usual_estimator() -> None:
    rng = random.Random(3)
    values = [rng.random() for _ in range(200)]
    ar = [0.0]
    for _ in range(400):
        ar.append(0.8 * ar[-1] + rng.gauss(0, 1))
    # pandas' autocorr is Pearson's r of the series against itself shifted: the same to O(1/n)
    assert lag1(values) == pytest.approx(pd.Series(values).autocorr(1), abs=0.02)
    assert lag1(ar) == pytest.approx(0.8, abs=0.08)
    assert lag1([1.0, 1.0, 1.0]) is None and lag1([1.0, 2.0]) is None


def test_independent_bins_choose_the_shortest_slices_and_a_slow_drift_none() -> None:
    rng = random.Random(5)
    noise = [{"worker": {"forward": rng.randint(0, 10), "idle": 10}} for _ in range(400)]
    assert choose_unit(noise).unit_s == 0.5
    level, drift = 0.0, []
    for _ in range(400):  # a share that wanders slowly (an AR(1) at 0.995 a bin)
        level = 0.995 * level + rng.gauss(0, 0.3)
        drift.append({"worker": {"forward": max(0, round(10 + 2 * level)), "idle": 10}})
    assert choose_unit(drift).unit_s is None  # no length up to 10 s is free of it


RECORDED = next((RECORD.parents[1] / "diff" / "steady-mixed").iterdir()) / "summary.json"


def summary(blocks: tuple[SampleBlock, ...], unit_s: float | None) -> SnapshotSummary:
    real = read_summary(RECORDED.parent)
    return replace(real, sampling=replace(real.sampling, blocks=blocks, unit_s=unit_s))


def test_a_window_with_slices_gives_its_slices_as_the_shares_units() -> None:
    parts = ({"worker": {"forward": 3, "idle": 7}}, {"worker": {"forward": 5, "idle": 5}})
    block = SampleBlock(4.0, 20, {"worker": {"forward": 8, "idle": 12}}, parts=parts)
    s = summary((block, block), 2.0)
    units = share_units_of(s)
    assert [dict(u.counts) for u in units] == [*parts, *parts]
    assert all(u.span_s == 2.0 for u in units)
    assert len(Side("A", (s,)).share_units) == 4
    # written before schema 7, or a segment without slices: the segments stay the units
    assert share_units_of(summary((block, block), None)) == units_of(summary((block, block), None))
    bare = SampleBlock(4.0, 20, {"worker": {"forward": 8, "idle": 12}})
    mixed = summary((block, bare), 2.0)
    assert share_units_of(mixed) == units_of(mixed)
