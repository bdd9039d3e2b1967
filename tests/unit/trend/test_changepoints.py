"""Change points on synthetic series: a level shift of 5 sigma is found within one point, a flat
noisy series gives none (seeded Gaussian noise; the penalty is in sidecar/trend/changepoints.py); the
numpy PELT finds ruptures' breaks."""

from __future__ import annotations

import numpy as np
import pytest

from sidecar.trend.changepoints import MIN_SIZE, change_points, noise_sigma, pelt, penalty


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize(("n", "at"), [(60, 30), (200, 37), (720, 500)])
def test_a_five_sigma_shift_is_found_within_one_point(seed: int, n: int, at: int) -> None:
    rng = np.random.default_rng(seed)
    sigma = 0.02  # a phase share's noise, say
    values = 0.3 + rng.normal(0, sigma, n)
    values[at:] += 5 * sigma
    (change,) = change_points(values)
    assert abs(change.index - at) <= 1
    assert change.before == pytest.approx(0.3, abs=2 * sigma)
    assert change.after == pytest.approx(0.3 + 5 * sigma, abs=2 * sigma)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("n", [100, 720])
def test_a_flat_noisy_series_has_no_change(seed: int, n: int) -> None:
    values = 1500 + np.random.default_rng(seed).normal(0, 40, n)  # tokens/s
    assert change_points(values) == []


def test_two_shifts_both_found_and_the_levels_told() -> None:
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.normal(10, 1, 80), rng.normal(20, 1, 80), rng.normal(5, 1, 80)])
    changes = change_points(values)
    assert [c.index for c in changes] == pytest.approx([80, 160], abs=1)
    assert [round(c.after) for c in changes] == [20, 5]


def test_exact_plateaus_and_degenerate_series() -> None:
    steps = np.array([1.0] * 10 + [2.0] * 10)  # replicated snapshots: no noise at all
    assert [c.index for c in change_points(steps)] == [10]
    assert change_points(np.ones(50)) == []
    assert change_points(np.array([1.0, 5.0, 1.0])) == []  # too short for two segments


def test_the_noise_estimate_ignores_the_step() -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(0, 1, 400)
    values[200:] += 50
    assert noise_sigma(values) == pytest.approx(1.0, rel=0.2)


@pytest.mark.parametrize("seed", range(40))
def test_the_same_breaks_as_ruptures_kernel_cpd(seed: int) -> None:
    """The numpy PELT is ruptures' linear-kernel (least-squares) PELT, break for break, on
    random series of random length with up to three random steps."""
    import ruptures as rpt

    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 800))
    values = rng.normal(0, 1, n)
    for _ in range(int(rng.integers(0, 4))):
        values[int(rng.integers(1, n)) :] += rng.normal(0, 4)
    pen = penalty(values)
    expected = rpt.KernelCPD(kernel="linear", min_size=MIN_SIZE).fit(values).predict(pen=pen)
    assert pelt(values, pen, MIN_SIZE) == [int(e) for e in expected]
