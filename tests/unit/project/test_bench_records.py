"""The continuous-mode benchmark's recorded runs (benchmarks/continuous.py, `make
bench-continuous`): each record is whole, its comparisons are what its counts say, and the
documentation's "Measured here" page (docs/method/measurements.md, moved there from the README)
quotes the newest one's figures as measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MEASURED = ROOT / "docs" / "method" / "measurements.md"
RECORDS = sorted((ROOT / "tests" / "fixtures" / "bench" / "continuous").glob("*.json"))


def test_there_are_records() -> None:
    assert RECORDS


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_each_record_is_whole_and_consistent(path: Path) -> None:
    r = json.loads(path.read_text())
    assert r["periods"] * r["interval_s"] == r["span_s"]
    assert len(r["snapshots"]) == r["periods"]
    assert 0 < r["cpu_share"] < 0.2 and r["rss_mib"]["peak"] >= r["rss_mib"]["last"]
    assert r["samples"] > 0 and r["reference_samples"] > r["samples"]
    assert r["commit"] in path.name
    for s in r["shares"]:
        assert s["within_1pt"] == (abs(s["diff_pts"]) <= 1.0)
        assert s["diff_pts"] == pytest.approx(s["continuous_pct"] - s["reference_pct"], abs=0.02)


def test_the_docs_quote_the_newest_record() -> None:
    r = json.loads(RECORDS[-1].read_text())
    readme = MEASURED.read_text()
    within = sum(s["within_1pt"] for s in r["shares"])
    assert f"{100 * r['cpu_share']:.2f} % of one core" in readme
    assert f"{within} of {len(r['shares'])} shares" in readme
    assert f"{r['rss_mib']['first']:.1f} to {r['rss_mib']['last']:.1f} MiB" in readme
