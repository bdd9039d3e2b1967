"""`trend` and `diff` share one noise model: on series of real recorded windows
(tests/fixtures/diff: ten steady `mixed` windows, then three `prefill-heavy` ones, then three
with max_num_seqs 1, recorded in that order on 2026-12-01, meta.json), trend reports a level
change exactly where diff of the same windows calls that figure significant. For every
candidate PELT proposes, the windows trend names on each side are read again from the fixture
folders and compared with `sidecar.analyze.compare.compare`, diff's own function; trend
flagged it <=> diff's row for the figure is significant. No processes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.analyze.compare import LATENCIES, RATES, Change, Comparison, Side, compare
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary
from sidecar.trend.levels import SERVING_FIGURES, LevelTests, Verdict, figure_of, side_windows
from sidecar.trend.series import Trend, TrendOptions, compute_trend
from sidecar.trend.source import load_table, summary_reader

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "diff"
STEADY, PREFILL, ONE_SEQ = "steady-mixed", "prefill-heavy", "max-num-seqs-1"
SERIES = ("share.*", "*_per_s", "ttft*", "itl*")  # every share and serving figure diff tests
PREFILL_FROM = datetime(2026, 12, 1, 14, 53, 7, tzinfo=UTC)  # prefill-heavy's first window
ONE_SEQ_FROM = datetime(2026, 12, 1, 14, 55, 49, tzinfo=UTC)


def _store(tmp_path: Path, *groups: str) -> Path:
    """A host folder of the recorded windows of GROUPS (their summary.json, unmodified)."""
    host = tmp_path / "out" / "vm"
    for group in groups:
        for folder in sorted((RECORDED / group).iterdir()):
            (host / folder.name).mkdir(parents=True)
            shutil.copy(folder / "summary.json", host / folder.name / "summary.json")
    return host


def _trend(host: Path, windows: Callable[[str], SnapshotSummary | None] | None) -> Trend:
    table = load_table(host, note=lambda _: None)
    options = TrendOptions(start=datetime(2026, 11, 30, tzinfo=UTC), series=SERIES)
    return compute_trend(table.to_pandas(), options, host="vm", windows=windows)


def _recorded(name: str) -> SnapshotSummary:
    (folder,) = [RECORDED / g / name for g in (STEADY, PREFILL, ONE_SEQ)
                 if (RECORDED / g / name).is_dir()]  # fmt: skip
    return read_summary(folder)


def _diff(a: tuple[str, ...], b: tuple[str, ...]) -> Comparison:
    return compare(Side("A", tuple(map(_recorded, a))), Side("B", tuple(map(_recorded, b))))


# diff's figure names for trend's serving columns, from compare's own tables.
DIFF_NAMES = {f"{attr}_per_s": name for name, attr in RATES} | {a: n for n, a in LATENCIES}


def _row(c: Comparison, series: str) -> Change | None:
    if series.startswith("share."):
        _, role, phase = series.split(".", 2)
        rows = [x for x in c.shares if x.role == role and x.name == phase]
    else:
        rows = [x for x in c.serving if x.name == DIFF_NAMES[series]]
    return rows[0] if rows else None


def _agreement(trend: Trend) -> list[tuple[str, datetime, bool, bool]]:
    """(series, time, trend flagged it, diff of its windows calls it significant), for every
    candidate."""
    out = []
    for s in trend.series:
        flagged = {c.time for c in s.changes}
        for c in s.candidates:
            assert c.test is not None
            row = _row(_diff(c.test.a_windows, c.test.b_windows), s.name)
            out.append((s.name, c.time, c.time in flagged, row is not None and row.significant))
    return out


def test_a_steady_series_has_no_level_change_and_diff_of_the_same_windows_finds_none(
    tmp_path: Path,
) -> None:
    host = _store(tmp_path, STEADY)
    trend = _trend(host, summary_reader(host, note=lambda _: None))
    assert [c for s in trend.series for c in s.changes] == []
    rows = _agreement(trend)
    # PELT proposes 7 candidates, among them the worker attention 5.8 % -> 7.4 %.
    assert len(rows) == 7 and all(
        not flagged and not significant for *_, flagged, significant in rows
    )
    (attention,) = [c for s in trend.series if s.name == "share.worker.attention"
                    for c in s.candidates]  # fmt: skip
    assert (round(100 * attention.before, 1), round(100 * attention.after, 1)) == (5.8, 7.4)
    assert attention.test is not None and attention.test.verdict is Verdict.NOT_SIGNIFICANT
    # diff of those windows finds nothing at all, in any figure; nor of the halves.
    assert _diff(attention.test.a_windows, attention.test.b_windows).significant == ()
    names = sorted(p.name for p in (RECORDED / STEADY).iterdir())
    assert _diff(tuple(names[:5]), tuple(names[5:])).significant == ()


@pytest.mark.parametrize(
    ("groups", "candidates", "flagged"),
    [((STEADY, PREFILL), 20, 17), ((STEADY, PREFILL, ONE_SEQ), 41, 32)],
)
def test_trend_flags_a_change_exactly_where_diff_of_the_same_windows_calls_it_significant(
    tmp_path: Path, groups: tuple[str, ...], candidates: int, flagged: int
) -> None:
    host = _store(tmp_path, *groups)
    trend = _trend(host, summary_reader(host, note=lambda _: None))
    rows = _agreement(trend)
    assert len(rows) == candidates and sum(r[2] for r in rows) == flagged
    assert [r for r in rows if r[2] != r[3]] == []  # flagged <=> significant, every candidate
    # The shift itself, at the first prefill-heavy window: its shares and its serving figures.
    at_shift = {name for name, t, hit, _ in rows if hit and t == PREFILL_FROM}
    assert {"share.worker.attention", "share.worker.idle", "prompt_tokens_per_s",
            "generation_tokens_per_s", "ttft_mean_s", "itl_mean_s"} <= at_shift  # fmt: skip
    if ONE_SEQ in groups:
        at_second = {name for name, t, hit, _ in rows if hit and t == ONE_SEQ_FROM}
        assert {"share.worker.attention", "requests_per_s", "ttft_p95_s"} <= at_second
    # The windows either side of the shift are the recorded groups (10 steady, 3 prefill).
    (tokens,) = [s for s in trend.series if s.name == "prompt_tokens_per_s"]
    first = tokens.changes[0].test
    assert first is not None and first.verdict is Verdict.SIGNIFICANT
    assert first.a_windows == tuple(sorted(p.name for p in (RECORDED / STEADY).iterdir()))
    assert first.b_windows == tuple(sorted(p.name for p in (RECORDED / PREFILL).iterdir()))
    assert first.change is not None and first.change.low is not None and first.change.low > 1
    assert first.tested_in == _diff(first.a_windows, first.b_windows).tested
    m = trend.multiplicity
    assert m.tests > 0 and 0 < m.bound <= m.tests * 0.05 / min(
        c.test.tested_in for s in trend.series for c in s.candidates
        if c.test is not None and c.test.tested_in
    )  # fmt: skip


def test_without_the_windows_no_candidate_is_a_change(tmp_path: Path) -> None:
    """The trend table alone has no units to test against: every candidate is not tested, and
    none is reported (the HTML page's trend, given no reader)."""
    trend = _trend(_store(tmp_path, STEADY, PREFILL), windows=None)
    candidates = [c for s in trend.series for c in s.candidates]
    assert len(candidates) == 20 and all(s.changes == () for s in trend.series)
    assert {c.test.note for c in candidates if c.test is not None} == {
        "no snapshot folders to read the windows from"
    }


def test_an_unreadable_window_is_left_out_with_a_warning(tmp_path: Path) -> None:
    """A summary garbled after its row was tabulated: the table still has the row, the
    level change's test leaves the window out and says so."""
    host = _store(tmp_path, STEADY, PREFILL)
    load_table(host, note=lambda _: None)  # the table, current
    broken = host / "20261201T145342Z" / "summary.json"  # the second prefill-heavy window
    broken.write_text("{not json")
    warnings: list[str] = []
    trend = _trend(host, summary_reader(host, note=warnings.append))
    assert any(str(host / "20261201T145342Z") in w and "left out" in w for w in warnings)
    (tokens,) = [s for s in trend.series if s.name == "prompt_tokens_per_s"]
    assert tokens.changes  # two prefill-heavy windows still carry the shift
    first = tokens.changes[0].test
    assert first is not None and first.b_windows == ("20261201T145307Z", "20261201T145418Z")


def test_without_scipy_the_candidates_are_not_tested_and_the_fix_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The core install has no scipy ([analysis]): trend still runs, and says what to install."""
    import sys

    monkeypatch.setitem(sys.modules, "scipy", None)
    for module in ("sidecar.analyze.compare", "sidecar.analyze.intervals"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    host = _store(tmp_path, STEADY, PREFILL)
    trend = _trend(host, summary_reader(host, note=lambda _: None))
    notes = {c.test.note for s in trend.series for c in s.candidates if c.test is not None}
    assert all(s.changes == () for s in trend.series)
    (note,) = notes
    assert note is not None and note.startswith(
        "vllm-sidecar trend needs scipy, which the [analysis] extra installs"
    )
    assert "pip install 'vllm-sidecar[analysis]'" in note


def test_the_figures_diff_does_not_test_are_not_tested() -> None:
    assert figure_of("main.engine_core.model_wait") is None  # diff compares all threads
    assert figure_of("requests_running") is None
    assert figure_of("share.worker.idle") == ("share", "worker", "idle")
    assert figure_of("custom.router_queue") == ("custom", None, "router_queue")
    tests = LevelTests(reader=lambda _: None)
    test = tests.test("requests_running", [("a", "snapshot")] * 3, [("b", "snapshot")] * 3)
    assert test.verdict is Verdict.NOT_TESTED and test.note == "diff does not test requests_running"


def test_the_serving_names_are_diffs() -> None:
    assert DIFF_NAMES == SERVING_FIGURES  # compare's RATES and LATENCIES, as trend's columns


def test_a_side_leaves_out_the_baselines_that_repeat_its_snapshots() -> None:
    """A baseline is its hour's snapshots merged (sidecar/samples: 12 py-spy segments, the
    6 of each snapshot): counted with them, each sample would count twice."""
    both = [("s1", "snapshot"), ("b1", "baseline"), ("s2", "snapshot")]
    assert side_windows(both) == [("s1", "snapshot"), ("s2", "snapshot")]
    assert side_windows([("b1", "baseline"), ("b2", "baseline")]) == [
        ("b1", "baseline"),
        ("b2", "baseline"),
    ]
