"""The deployment's history (sidecar/analyze/history.py): which windows it takes, the pooled
between-window spread, and a one-window comparison tested against it (sidecar/analyze/compare.py).
The recorded real windows: tests/unit/diff/test_diff_history.py."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from sidecar.analyze.compare import ONE_WINDOW_NOTE, Side, compare
from sidecar.analyze.history import (
    MIN_HISTORY,
    NO_HISTORY,
    History,
    Load,
    comparable,
    depth,
    history_for,
)
from sidecar.records.readings import ServingFigures
from sidecar.records.summary import Fingerprint, SampleBlock, SamplingSection, SnapshotSummary

FP = Fingerprint(vllm="0.31.0", model="m")


def window(name: str, ttft: float = 0.1, rate: float = 10.0, prompt_share: float = 0.75,
           fp: Fingerprint | None = FP, cpu: float = 30.0, deployment: str | None = "m@8000",
           ) -> SnapshotSummary:  # fmt: skip
    """A 30 s window of two segments: RATE requests/s of 100 tokens, PROMPT_SHARE of them
    prompt, the worker's CPU and a TTFT."""
    tokens = rate * 30 * 100
    prompt, generated = tokens * prompt_share, tokens * (1 - prompt_share)
    blocks = tuple(
        SampleBlock(15.0, 100, counts={"worker": {"forward": 60, "idle": 40}}, cpu_s={"worker": cpu * (0.45 + 0.1 * k)},
                    span_s=15.0, requests=rate * 15, prompt_tokens=prompt / 2,
                    generation_tokens=generated / 2)
        for k in range(2)  # the segments differ a little, as real ones do
    )  # fmt: skip
    serving = ServingFigures(window_s=30.0, requests_finished=rate * 30, prompt_tokens=prompt,
                             generation_tokens=generated, ttft_mean_s=ttft)  # fmt: skip
    return SnapshotSummary(name=name, created_at="2026-12-01T00:00:00+00:00", host="h",
                           deployment=deployment, fingerprint=fp, serving=serving,
                           sampling=SamplingSection(blocks=blocks))  # fmt: skip


def steady(n: int, seed: int = 1, scale: float = 0.1) -> list[SnapshotSummary]:
    """N windows of one steady load: CPU and TTFT move by about SCALE (log) between windows."""
    rng = np.random.default_rng(seed)
    return [window(f"h{i:02d}", ttft=0.1 * math.exp(rng.normal(0, scale)),
                   cpu=30 * math.exp(rng.normal(0, scale))) for i in range(n)]  # fmt: skip


def test_the_spread_is_pooled_within_groups_on_the_log_scale() -> None:
    """Each group has its own mean: a change between A's and B's runs is no spread."""
    a_runs = [window(f"a{i}", ttft=t) for i, t in enumerate((0.1, 0.2, 0.1, 0.2))]
    b_runs = [window(f"b{i}", ttft=t) for i, t in enumerate((1.0, 2.0))]
    h = History((tuple(a_runs), tuple(b_runs)), 6, 0, 0)
    spread = h.spread(lambda s: s.serving.ttft_mean_s)
    assert spread is not None
    half = math.log(2) / 2  # every log sits half a log(2) from its group's mean
    assert spread.var == pytest.approx(6 * half**2 / 4) and spread.df == 4
    assert spread.windows == 6 and h.depth == 5 and h.enough


def test_a_compared_side_of_several_windows_adds_its_own_spread() -> None:
    h = History((tuple(steady(5)),), 5, 0, 0)
    alone = h.spread(lambda s: s.serving.ttft_mean_s)
    both = h.spread(lambda s: s.serving.ttft_mean_s, [steady(3, seed=9)])
    assert alone is not None and both is not None
    assert (alone.df, both.df) == (4, 6) and both.windows == 5


def test_under_the_minimum_a_figure_has_no_spread() -> None:
    short = History((tuple(steady(MIN_HISTORY - 1)),), 4, 0, 0)
    assert not short.enough and short.spread(lambda s: s.serving.ttft_mean_s) is None
    # measured (above zero) in too few of the windows: none either
    enough = History((tuple(steady(MIN_HISTORY)),), 5, 0, 0)
    assert enough.spread(lambda s: 1.0 if s.name < "h02" else None) is None
    assert NO_HISTORY.spread(lambda s: 1.0) is None and not NO_HISTORY.enough


@pytest.mark.parametrize(
    ("sizes", "worth"), [((), 0), ((1,), 1), ((5,), 5), ((4, 2), 5), ((3, 1), 3), ((1, 1), 1)]
)
def test_depth_is_the_degrees_of_freedom_plus_one(sizes: tuple[int, ...], worth: int) -> None:
    assert depth(sizes) == worth


@pytest.mark.parametrize(
    ("load", "ok"),
    [
        (Load(10.0, 0.75), True),
        (Load(14.9, 0.84), True),  # within x/÷1.5 and 10 points
        (Load(6.7, 0.66), True),
        (Load(15.1, 0.75), False),  # busier
        (Load(6.6, 0.75), False),  # quieter
        (Load(10.0, 0.86), False),  # another mix
        (Load(0.0, None), False),  # idle against a load
        (Load(None, None), True),  # unknown: not held against it
    ],
)
def test_a_comparable_load(load: Load, ok: bool) -> None:
    assert comparable(load, Load(10.0, 0.75)) is ok


def test_history_takes_same_fingerprint_and_load_and_leaves_out_the_compared_windows() -> None:
    a, b = window("a"), window("b")
    candidates = [
        *steady(6),
        window("a"),  # the compared window itself, found again
        window("busy", rate=30.0),
        window("other-mix", prompt_share=0.95),
        window("upgraded", fp=replace(FP, vllm="0.32.0")),
        window("old", fp=None),
        window("elsewhere", deployment="n@8001"),
    ]
    h = history_for(Side("A", (a,)), Side("B", (b,)), candidates)
    assert [s.name for g in h.groups for s in g] == [f"h{i:02d}" for i in range(6)]
    assert (h.considered, h.other_fingerprint, h.other_load) == (11, 3, 2)


def test_windows_like_b_form_a_group_of_their_own() -> None:
    """B ran another vLLM at another load: windows like B's are a second group, windows like
    neither are left out."""
    upgraded = replace(FP, vllm="0.32.0")
    a, b = window("a"), window("b", fp=upgraded, rate=30.0)
    later = [window(f"u{i}", fp=upgraded, rate=30.0) for i in range(3)]
    h = history_for(Side("A", (a,)), Side("B", (b,)), [*steady(4), *later,
                                                       window("x", fp=upgraded)])  # fmt: skip
    assert [len(g) for g in h.groups] == [4, 3] and h.depth == 6 and h.other_load == 1
    assert "A's and B's runs apart" in h.words()


def test_a_one_window_comparison_is_tested_against_the_history() -> None:
    history = steady(12)
    a, b = Side("A", (window("a", cpu=30.0),)), Side("B", (window("b", cpu=60.0),))
    h = history_for(a, b, history)
    c = compare(a, b, history=h)
    cores = next(ch for ch in c.cores if (ch.role, ch.name) == ("worker", "all"))
    assert cores.tested and cores.significant and cores.history_windows == 12
    assert cores.change == pytest.approx(2.0)
    assert cores.df == 11 and c.history is h
    assert {ch.name for ch in c.history_tested} >= {"all", "TTFT mean", "requests/s"}
    # the same windows without history: shown, not tested
    plain = compare(a, b)
    assert not any(ch.tested for ch in plain.cores) and plain.history is None
    # history tests join the one family: m counts them
    assert c.tested == plain.tested + len(c.history_tested)


def test_a_steady_history_raises_no_alarm_on_its_own_windows() -> None:
    """Every pair of 12 simulated steady windows, the other 10 the history: at most the
    family-wise rate of pairs flag anything in CPU, costs, rates or latency."""
    wins = steady(12, seed=3)
    alarms = 0
    pairs = 0
    for i in range(len(wins)):
        for j in range(i + 1, len(wins)):
            a, b = Side("A", (wins[i],)), Side("B", (wins[j],))
            c = compare(a, b, history=history_for(a, b, wins))
            pairs += 1
            alarms += any(ch.significant for ch in c.history_tested)
    assert alarms <= 0.05 * pairs + 1


def test_too_little_history_says_what_it_cannot_test_and_how_much_more_would() -> None:
    a, b = Side("A", (window("a"),)), Side("B", (window("b", cpu=60.0),))
    h = history_for(a, b, [*steady(2), window("busy", rate=30.0)])
    c = compare(a, b, history=h)
    assert not c.history_tested
    notes = {ch.note for ch in (*c.cores, *c.costs) if ch.note}
    expected = (f"{ONE_WINDOW_NOTE}: not tested; needs {MIN_HISTORY} windows of this deployment "
                "at this load (same fingerprint, comparable load); found 2, 3 more would do "
                "(left out: 1 at another load)")  # fmt: skip
    assert notes == {expected}
    off = compare(a, b, history=NO_HISTORY)
    assert {ch.note for ch in off.costs} == {
        f"{ONE_WINDOW_NOTE}: not tested; the deployment's history was not consulted (--no-history)"
    }


def test_two_windows_a_side_keep_their_own_spread() -> None:
    """With two windows or more a side the sides' own spread (Welch) tests them: no history."""
    wins = steady(10)
    a, b = Side("A", tuple(wins[:2])), Side("B", tuple(wins[2:4]))
    c = compare(a, b, history=history_for(a, b, wins[4:]))
    assert not c.history_tested and any(ch.tested for ch in c.cores)


def test_a_window_shorter_than_the_history_s_is_given_more_spread() -> None:
    """A 10 s window against 30 s ones moves about three times as much: its share of the
    variance is stretched by 3; a longer one is not shrunk."""
    h = History((tuple(steady(5)),), 5, 0, 0)
    short = replace(window("s"), serving=replace(window("s").serving, window_s=10.0))
    long = replace(window("l"), serving=replace(window("l").serving, window_s=90.0))
    assert h.typical_s == 30.0
    assert h.stretch(short) == pytest.approx(3.0) and h.stretch(long) == 1.0
    a, b = Side("A", (window("a"),)), Side("B", (short,))
    c_short = compare(a, b, history=h)
    c_plain = compare(a, Side("B", (window("b"),)), history=h)
    se = {c.name: c.se for c in c_short.history_tested if c.kind == "serving"}
    se_plain = {c.name: c.se for c in c_plain.history_tested if c.kind == "serving"}
    ttft = se["TTFT mean"]
    assert ttft is not None and se_plain["TTFT mean"] is not None
    assert ttft == pytest.approx(se_plain["TTFT mean"] * math.sqrt(2))  # (1 + 3) / (1 + 1)
