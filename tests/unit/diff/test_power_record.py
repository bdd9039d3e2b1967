"""What one 20 s snapshot against another can tell (issue 22), checked on the windows recorded
from the real vLLM CPU server by `make diff-power` (devtools/diff_power.py): every figure of
results.json computed again with the shipped diff (no process), and the bars it must meet."""

from __future__ import annotations

import json

import pytest

from devtools.diff_power_figures import FIXTURE, RESULTS, figures, smallest_detected

pytestmark = pytest.mark.skipif(not RESULTS.exists(), reason="no diff-power record yet")


@pytest.fixture(scope="module")
def computed() -> dict:  # type: ignore[type-arg]
    return figures(FIXTURE)


def test_the_record_is_what_the_shipped_diff_computes_from_its_windows(computed: dict) -> None:  # type: ignore[type-arg]
    assert computed == json.loads(RESULTS.read_text())


def test_steady_pairs_false_alarm_within_the_family_wise_five_percent(computed: dict) -> None:  # type: ignore[type-arg]
    steady = computed["steady"]
    assert steady["pairs"] >= 40
    # the observed rate is within 5 %, and 5 % is inside its exact binomial interval
    assert steady["false_alarms"] / steady["pairs"] <= computed["alpha"]
    assert steady["interval_95"][0] <= computed["alpha"]


def test_mixed_against_prefill_heavy_finds_the_workers_compute_up(computed: dict) -> None:  # type: ignore[type-arg]
    shift = computed["shift"]
    assert shift["pairs"] >= 10
    up = sum(r["forward_or_compute_up"] for r in shift["rows"])
    assert up >= 0.9 * shift["pairs"]


@pytest.mark.xfail(strict=True, reason=(
    "issue 22, open: at the default 5 Hz a 20 s window holds about 450 API-server samples, and "
    "tokenising at about 2 -> 5 % of them is some 9 against 23 samples, which no test at a "
    "family-wise 5 % calls in 9 pairs of 10 (a plain Poisson test gives p = 0.01 before any "
    "correction); nor is the forward share alone (about 150 worker samples a window: about "
    "+-15 points can be seen, the shift is +11 to +20)"))  # fmt: skip
def test_mixed_against_prefill_heavy_finds_forward_and_tokenising_up(computed: dict) -> None:  # type: ignore[type-arg]
    shift = computed["shift"]
    assert shift["both_up"] >= 0.9 * shift["pairs"]
    assert sum(r["forward_significant"] for r in shift["rows"]) >= 0.9 * shift["pairs"]


def test_the_power_curve_rises_with_the_prefill_share(computed: dict) -> None:  # type: ignore[type-arg]
    curve = computed["power"]
    assert len(curve) >= 3 and all(step["pairs"] >= 10 for step in curve)
    steps = [c["prefill_heavy_percent"] for c in curve]
    assert steps == sorted(steps)
    shares = [c["detected_share"] for c in curve]
    assert shares[-1] >= shares[0]
    changes = [c["mean_forward_change_pp"] for c in curve]
    assert changes[-1] > changes[0]  # more prefill-heavy requests, more forward
    assert smallest_detected(curve) is None or smallest_detected(curve) > 0
