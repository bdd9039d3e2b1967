"""`diff` that can tell and that people can read (issue "Comparisons that can tell", items 3 and
5), on the real windows recorded in tests/fixtures/diff: every interval one the figure can have,
a headline that says what these samples could have detected and names the largest changes
even when they are not significant, latencies with their units, the one-window caveat said
once, and --fail-on's large rises as factors. The JSON keeps every key it had."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.analyze.compare import LATENCY_NAMES, Change, Side, compare
from sidecar.cli import main
from sidecar.diff.text import change_words, fail_on_words, render_text, to_json
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RECORD = FIXTURES / "diff"
OLD = FIXTURES / "schema1" / "20261201T112537Z"
SCHEMA4 = FIXTURES / "schema4" / "20261201T210833Z"


def window(kind: str, index: int) -> Path:
    return sorted((RECORD / kind).iterdir())[index]


def first_segments(folder: Path, n: int) -> SnapshotSummary:
    """A recorded window's first N segments: what a window of N segments holds (two: the
    issue's 20 s snapshots at 10 s segments, here 10 s at 5 s)."""
    s = read_summary(folder)
    return replace(s, sampling=replace(s.sampling, blocks=s.sampling.blocks[:n]))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["diff", *args])
    return code, capsys.readouterr().out


def sides(a: tuple[SnapshotSummary, ...], b: tuple[SnapshotSummary, ...]) -> tuple[Side, Side]:
    return Side("A: a", a), Side("B: b", b)


def _read(kind: str, *indexes: int) -> tuple[SnapshotSummary, ...]:
    return tuple(read_summary(window(kind, i)) for i in indexes)


CASES = {
    "two segments a side, steady against prefill-heavy": (
        (first_segments(window("steady-mixed", 2), 2),),
        (first_segments(window("prefill-heavy", 1), 2),),
    ),
    "two segments a side, the same steady load": (
        (first_segments(window("steady-mixed", 0), 2),),
        (first_segments(window("steady-mixed", 2), 2),),
    ),
    "three segments against two, max-num-seqs 1": (
        (first_segments(window("steady-mixed", 3), 3),),
        (first_segments(window("max-num-seqs-1", 2), 2),),
    ),
    "one window a side, steady against prefill-heavy": (
        _read("steady-mixed", -1),
        _read("prefill-heavy", 0),
    ),
    "two windows a side, steady against max-num-seqs 1": (
        _read("steady-mixed", 0, 1),
        _read("max-num-seqs-1", 0, 1),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_interval_is_one_the_figure_can_have(case: str) -> None:
    """A difference of shares within [-1, 1] (each share within [0, 1]), a ratio above 0; the
    estimate inside its interval. With two segments a side Welch's interval on the raw
    difference ran to +-2000 points on these windows."""
    c = compare(*sides(*CASES[case]))
    tested = [ch for ch in c.family if ch.tested]
    assert any(ch.kind == "share" for ch in tested)
    for ch in tested:
        assert ch.low is not None and ch.high is not None and ch.change is not None
        if ch.scale == "pp":
            assert -1.0 <= ch.low <= ch.change <= ch.high <= 1.0, (ch.role, ch.name)
        else:
            assert 0.0 < ch.low <= ch.change <= ch.high, (ch.role, ch.name)
        assert ch.significant == (ch.low > (1 if ch.scale == "ratio" else 0) or
                                  ch.high < (1 if ch.scale == "ratio" else 0))  # fmt: skip
        assert ch.p_adjusted is not None and (ch.p_adjusted < c.alpha) == ch.significant


def _half_widths(changes: list[dict[str, Any]]) -> list[float]:
    return [(ch["high"] - ch["low"]) / 2 for ch in changes if ch["low"] is not None]


def test_no_significant_change_says_what_could_have_been_detected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two steady windows without the deployment's history: nothing significant, and the
    headline says how large a change in a phase share these samples could detect (the widest
    interval's half-width), that the CPU and latency figures were not tested, and the largest
    changes, marked. (With the history, tests/unit/diff/test_diff_history.py.)"""
    a, b = window("steady-mixed", 0), window("steady-mixed", 1)
    code, text = run(capsys, str(a), str(b), "--no-history")
    assert code == 0
    headline, largest = text.splitlines()[:2]
    assert headline.startswith("[Diff] No significant change: none of the 14 tested")
    _, out = run(capsys, str(a), str(b), "--format", "json", "--no-history")
    doc = json.loads(out)
    widest = max(_half_widths(doc["shares"]))
    assert doc["detectable"]["shares"] == pytest.approx(widest, abs=1e-6)
    assert doc["detectable"]["cpu"] is None and doc["detectable"]["serving"] is None
    assert (f"These samples could detect a change above about \u00b1{100 * widest:.1f} pp in "
            "any phase share; smaller ones could go unseen") in headline  # fmt: skip
    untested = sum(ch["untested_side_wide"] for k in ("shares", "cores", "costs", "serving")
                   for ch in doc[k])  # fmt: skip
    assert headline.endswith(f" {untested} figures were not tested (see the caveat).")
    assert largest.startswith("[Diff] Largest changes: ")
    assert "; not significant)" in largest and "; not tested)" in largest
    assert [ch["name"] for ch in doc["largest"]] and not any(
        ch["significant"] for ch in doc["largest"]
    )


def test_two_time_ranges_say_what_each_family_could_detect(
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = RECORD / "steady-mixed"
    code, text = run(capsys, f"{folder}@..2026-12-01T14:49", f"{folder}@2026-12-01T14:49..")
    assert code == 0
    headline = text.splitlines()[0]
    assert re.search(r"about \u00b1\d+\.\d pp in any phase share, \u00d7/\u00f7\d+\.\d+ in any "
                     r"CPU figure or \u00d7/\u00f7\d+\.\d+ in any serving figure", headline)  # fmt: skip
    assert "not tested" not in headline and "Caveat: A and B have one window" not in text


def test_largest_changes_are_listed_even_beside_significant_ones() -> None:
    c = compare(*sides(_read("steady-mixed", -1), _read("prefill-heavy", 0)))
    lines = render_text(c).splitlines()
    rest = next(line for line in lines if line.startswith("[Diff] Largest of the rest: "))
    # the CPU per token, untestable with one window a side, is still named with its size
    assert re.search(r"CPU per 1k generated tokens[^;]* up \u00d7\d+\.\d \([^)]*; not tested\)",
                     rest)  # fmt: skip
    assert lines.index(rest) == 1 + next(
        i for i, line in enumerate(lines) if line.startswith("[Diff] Significant: ")
    )


def test_latencies_print_in_ms_or_s() -> None:
    c = compare(*sides(_read("steady-mixed", -1), _read("max-num-seqs-1", 0)))
    text = render_text(c)
    table = text.split("[Diff] Serving figures:\n", 1)[1]
    rows = {line[:24].strip(): line[24:].split() for line in table.splitlines()[2:]}
    for name in LATENCY_NAMES:
        cells = rows[name]
        a, b = " ".join(cells[:2]), " ".join(cells[2:4])
        for value in (a, b):
            assert re.fullmatch(r"\d+ ms|\d+\.\d\d s", value), (name, value)
    assert re.fullmatch(r"\d+\.\d%", rows["KV cache usage"][0])
    assert "0.05958" not in text
    ttft = next(ch for ch in c.serving if ch.name == "TTFT mean")
    assert re.fullmatch(r"TTFT mean up \u00d7\d+\.\d \(\d+ ms \u2192 \d\.\d\d s; not tested\)",
                        change_words(ttft, "not tested"))  # fmt: skip


def test_the_one_window_caveat_is_said_once_not_on_every_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One window a side and no history: the CPU, traffic and latency rows read "not tested",
    and why (and what would test them) is said once, as a caveat. The JSON keeps each row's
    note."""
    a, b = window("steady-mixed", -1), window("prefill-heavy", 0)
    _, text = run(capsys, str(a), str(b), "--no-history")
    assert text.count("compare two windows or more a side") == 1
    (caveat,) = [line for line in text.splitlines() if "compare two windows or more" in line]
    said = re.match(r"Caveat: A and B have one window each: (\d+) CPU, traffic, latency and "
                    "serving figures are shown but not tested", caveat)  # fmt: skip
    assert said is not None and "PATH@SINCE..UNTIL" in caveat
    _, out = run(capsys, str(a), str(b), "--format", "json", "--no-history")
    doc = json.loads(out)
    rows = [ch for k in ("cores", "costs", "serving") for ch in doc[k]]
    assert all(ch["untested_side_wide"] for ch in rows) and int(said[1]) == len(rows)
    assert text.count(" not tested\n") + text.endswith(" not tested") == len(rows)
    tables = text.split("[Diff] Workload:")[1].splitlines()
    assert max(len(line) for line in tables if not line.startswith("[Diff]")) < 100
    assert sum("compare two windows or more" in line for line in doc["caveats"]) == 1
    assert all(ch["note"].startswith("one window on a side") for ch in doc["costs"])


def test_fail_on_names_large_rises_as_factors(capsys: pytest.CaptureFixture[str]) -> None:
    """All steady windows against the three after a restart with --max-num-seqs 1: TTFT rose
    about fifty-fold, which reads x49.8 (55 ms -> 2.75 s), not 4880 %."""
    before, after = RECORD / "steady-mixed", RECORD / "max-num-seqs-1"
    code, text = run(capsys, f"{before}@..", f"{after}@..", "--fail-on", "10%")
    assert code == 10
    block = text.split("[Diff] Regressions beyond --fail-on 10%:\n", 1)[1].splitlines()
    ttft = next(line for line in block if line.startswith("- TTFT mean "))
    assert re.fullmatch(r"- TTFT mean up \u00d7\d+\.\d \(\d+ ms \u2192 \d\.\d\d s\)", ttft)
    assert all("\u00d7" in line for line in block)
    assert not re.search(r"up \d{3,} %", text), "a rise of x2 or more reads as a factor"
    assert fail_on_words(0.10) == "10%" and fail_on_words(3.0) == "300% (\u00d74.0)"


OLD_KEYS = {"verdict", "a", "b", "fingerprint", "caveats", "workload_differs", "method",
            "shares", "cores", "costs", "per_request", "serving", "custom", "significant",
            "regressions", "findings"}  # fmt: skip
CHANGE_KEYS = {"kind", "role", "name", "a", "b", "scale", "change", "low", "high",
               "significant", "p_adjusted", "note"}  # fmt: skip


def test_the_json_keeps_every_key_and_adds_new_ones() -> None:
    c = compare(*sides(_read("steady-mixed", -1), _read("prefill-heavy", 0)))
    doc = to_json(c)
    assert set(doc) >= OLD_KEYS | {"detectable", "largest"}
    assert set(doc["method"]) >= {"alpha", "tested", "intervals"}
    for key in ("shares", "cores", "costs", "per_request", "serving", "significant", "largest"):
        for ch in doc[key]:
            assert set(ch) >= CHANGE_KEYS, key
    assert doc["detectable"]["shares"] is not None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (OLD, OLD),
        (OLD, SCHEMA4),
        (SCHEMA4, window("steady-mixed", 0)),
        (window("max-num-seqs-1", 0), OLD),
    ],
)
def test_old_snapshots_still_diff(capsys: pytest.CaptureFixture[str], a: Path, b: Path) -> None:
    """Schema 1 and 4 (one unit a window), without history (with it, a schema-4 window against
    a recorded steady one is tested against the steady windows' spread): nothing can be
    tested, the headline says so rather than a bare "no significant change", and the reason is
    a caveat said once."""
    code, text = run(capsys, str(a), str(b), "--no-history")
    assert code == 0
    assert ("\n[Diff] No significant change could be found: none of the figures could be tested "
            "with these samples (see the caveat).\n") in f"\n{text}"  # fmt: skip
    assert text.count("has no spread to test against") == 1
    _, out = run(capsys, str(a), str(b), "--format", "json", "--no-history")
    doc = json.loads(out)
    assert doc["method"]["tested"] == 0
    assert doc["detectable"] == {"shares": None, "cpu": None, "serving": None}


def _change(**kw: Any) -> Change:
    base: dict[str, Any] = {"kind": "serving", "role": None, "name": "TTFT mean", "a": 0.055,
                            "b": 2.75, "scale": "ratio", "change": 50.0}  # fmt: skip
    return Change(**{**base, **kw})


def test_half_widths_are_points_or_factors() -> None:
    assert _change(low=25.0, high=100.0).half_width == pytest.approx(2.0)
    assert _change(scale="pp", change=0.1, low=0.02, high=0.2).half_width == pytest.approx(0.09)
    assert _change().half_width is None
