"""The fleet's comparison from sums (sidecar/fleet/stats.py) gives `compare`'s changes: the same
figures tested, the same estimates, standard errors and degrees of freedom, on recorded real
windows (tests/fixtures/diff), with segments or windows as units, one window or many a side."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.analyze.compare import Side, compare
from sidecar.fleet.outliers import as_window_unit
from sidecar.fleet.stats import family, pooled, profile
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "diff"


def _read(name: str) -> list[SnapshotSummary]:
    return [read_summary(p) for p in sorted((FIXTURES / name).iterdir())]


STEADY, PREFILL, MAX_SEQS_1 = _read("steady-mixed"), _read("prefill-heavy"), _read("max-num-seqs-1")


def _key(c: object) -> tuple[object, ...]:
    return (c.kind, c.role, c.name)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("a", "b", "windows"),
    [
        (STEADY[0::2], STEADY[1::2], False),  # segments as units, five windows a side
        (STEADY[0::2], STEADY[1::2], True),  # the fleet's: windows as units
        (STEADY + MAX_SEQS_1, PREFILL, True),  # a pooled rest of two kinds of load
        (STEADY[:1], PREFILL[:1], False),  # one window a side: CPU and rates untested
        (STEADY[4:6], MAX_SEQS_1, False),  # a window of one segment (1,000 samples) inside
    ],
)
def test_the_sums_give_compares_changes(
    a: list[SnapshotSummary], b: list[SnapshotSummary], windows: bool
) -> None:
    if windows:
        a, b = [as_window_unit(s) for s in a], [as_window_unit(s) for s in b]
    want = compare(Side("A", tuple(a)), Side("B", tuple(b)))
    got, mix = family(pooled([profile(a[:1]), profile(a[1:])]), profile(b))
    assert mix == want.mix_differs
    assert [_key(c) for c in got] == [_key(c) for c in want.family]
    for g, w in zip(got, want.family, strict=True):
        assert g.note == w.note, _key(w)
        for attr in ("a", "b", "change", "estimate", "se", "df"):
            gv, wv = getattr(g, attr), getattr(w, attr)
            assert (gv is None) == (wv is None), (_key(w), attr)
            if wv is not None:
                assert gv == pytest.approx(wv, rel=1e-9, abs=1e-12), (_key(w), attr)
