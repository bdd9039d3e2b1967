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
    "issue 22, blocked here: on this server the API server's tokenising share does not follow "
    "the prompt tokens (the `rates` chunk: prompt tokens x4, input_processing -0.25 and -0.09 "
    "points on average at 5 and 20 Hz, up in 0 of 12 pairs), so no test can call it up in 9 "
    "pairs of 10 at a family-wise 5 %; and at the default 5 Hz the worker's forward share alone "
    "(about 150 samples a window, +-16 points) is seen in 2 of 10"))  # fmt: skip
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


def test_a_higher_rate_side_by_side_narrows_the_forward_interval_at_a_cost(computed: dict) -> None:  # type: ignore[type-arg]
    """The `rates` chunk: windows alternating 5 and 20 Hz on one server and load. Four times
    the samples, but the mixed load's forward share moves between slices, so its effective
    samples grow less than four times; the interval narrows, the sampler costs more."""
    low, high = computed["rates"]
    assert (low["rate_hz"], high["rate_hz"]) == (5.0, 20.0)
    assert high["mixed_worker_samples_median"] >= 3 * low["mixed_worker_samples_median"]
    growth = high["mixed_forward_effective_n_median"] / low["mixed_forward_effective_n_median"]
    assert 1 < growth < 4
    assert high["forward_half_width_pp_median"] < low["forward_half_width_pp_median"]
    assert high["forward_detected"] > low["forward_detected"]
    assert high["sampler_cpu_share_median"] > 2 * low["sampler_cpu_share_median"]
    assert low["steady_false_alarms"] == high["steady_false_alarms"] == 0
    assert all(c["requests_per_s_ratio"] < 1 for c in computed["rate_cost"])


def test_tokenising_does_not_follow_the_prompt_tokens_on_this_server(computed: dict) -> None:  # type: ignore[type-arg]
    """Why the tokenising half of the shift bar cannot be met here: in the side-by-side chunk
    the prefill-heavy windows carry about four times the prompt tokens, and the API server's
    input_processing share does not move."""
    for rate in computed["rates"]:
        assert rate["prompt_tokens_ratio_median"] > 3
        assert rate["input_processing_up"] == 0
        assert abs(rate["mean_input_processing_change_pp"]) < 1.0


def test_the_readme_states_the_records_figures(computed: dict) -> None:  # type: ignore[type-arg]
    readme = " ".join((FIXTURE.parents[2] / "README.md").read_text().split())
    steady, shift = computed["steady"], computed["shift"]
    assert f"**{steady['false_alarms']} of {steady['pairs']}** steady pairs" in readme
    up = sum(r["forward_or_compute_up"] for r in shift["rows"])
    forward = sum(r["forward_significant"] for r in shift["rows"])
    assert f"up in {up} of {shift['pairs']} pairs, its forward share alone in {forward}:" in readme
    high = computed["rates"][-1]
    said = (f"`--rate {high['rate_hz']:g}` saw it in {high['forward_detected']} of "
            f"{high['shift_pairs']} (±{high['forward_half_width_pp_median']:.0f} points)")  # fmt: skip
    assert said in readme
