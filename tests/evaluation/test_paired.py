"""thicket.evaluation.paired against figures worked by hand and against simulation: the minimum
detectable effect is checked by drawing many evaluations from known per-goal success chances and
counting how often a difference of that size is detected (the definition of power), and each
bootstrap's spread against the standard error its resampling implies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from thicket.evaluation.paired import (
    Resampling, gain_ratio, mcnemar_exact, minimum_detectable_effect, paired_difference, pass_at_1, pilot_rates,
    resampled_pass_at_1, z_sum)


def test_z_sum_is_the_textbook_two_sided_005_at_80_percent_power():
    assert z_sum() == pytest.approx(1.959964 + 0.841621, abs=1e-5)  # 2.80


def test_the_mde_of_64_goals_at_one_half_with_32_samples_by_hand():
    # Each goal: 2 x 0.25 / 32 = 0.015625; 64 goals: 1.0; / 64^2 -> 0.000244; sqrt 0.015625; x 2.8016.
    assert minimum_detectable_effect([0.5] * 64, 32) == pytest.approx(0.015625 * 2.801585, rel=1e-5)
    # Goals never (or always) solved add no variance: the design is as good as its uncertain goals.
    assert minimum_detectable_effect([0.5] * 8 + [0.0] * 56, 32) == pytest.approx(
        math.sqrt(8 * 2 * 0.25 / 32) / 64 * 2.801585, rel=1e-5)


def test_the_mde_has_80_percent_power_in_simulation():
    rng = np.random.default_rng(7)
    goals, samples, trials = 64, 32, 4000
    rates = rng.uniform(0.05, 0.6, size=goals)
    effect = minimum_detectable_effect(list(rates), samples)
    a = rng.binomial(samples, rates, size=(trials, goals)) / samples
    b = rng.binomial(samples, np.clip(rates + effect, 0, 1), size=(trials, goals)) / samples
    differences = (b - a).mean(axis=1)
    # A z-test of the mean difference at the standard error the design assumed.
    detected = differences / (effect / z_sum()) > 1.959964
    assert 0.75 <= detected.mean() <= 0.86  # 0.80 by the formula; the alternative's spread differs a little


def test_pilot_rates_give_an_unbiased_spread():
    for n, c in [(4, 1), (32, 8), (8, 3)]:
        (q,) = pilot_rates([(n, c)])
        assert q * (1 - q) == pytest.approx(min(0.25, c / n * (1 - c / n) * n / (n - 1)))
    assert pilot_rates([(4, 0), (4, 4)]) == [0.0, 0.0]  # never or always: no spread
    with pytest.raises(ValueError):
        pilot_rates([(1, 1)])


def test_mcnemar_exact_by_hand():
    # 10 discordant goals split 1 / 9: 2 x (C(10,0) + C(10,1)) / 2^10 = 22 / 1024.
    a = [True] * 1 + [False] * 9 + [True] * 5 + [False] * 20
    b = [False] * 1 + [True] * 9 + [True] * 5 + [False] * 20
    assert mcnemar_exact(a, b) == pytest.approx(22 / 1024)
    assert mcnemar_exact(b, a) == pytest.approx(22 / 1024)
    assert mcnemar_exact([True, False], [True, False]) == 1.0  # nothing discordant
    assert mcnemar_exact([True, False], [False, True]) == 1.0  # an even split


def test_paired_difference_is_the_mean_of_the_goals_differences():
    a, b = [(4, 0), (4, 2), (4, 4), (4, 1)], [(4, 1), (4, 2), (4, 4), (4, 3)]
    for how in Resampling:
        estimate = paired_difference(a, b, how)
        assert estimate.mean == pytest.approx(0.1875)
        assert estimate.low <= estimate.mean <= estimate.high and estimate.tasks == 4
    with pytest.raises(ValueError):
        paired_difference([(4, 0)], [(4, 0), (4, 1)])
    with pytest.raises(ValueError):
        paired_difference([(0, 0)], [(4, 1)])  # a goal with no evaluated sample


def test_each_resampling_has_the_spread_it_stands_for():
    # 40 goals: half at 16/32, half never solved, under two policies.
    a = [(32, 16)] * 20 + [(32, 0)] * 20
    b = [(32, 16)] * 20 + [(32, 0)] * 18 + [(32, 32)] * 2  # b also always solves two goals a never does
    means = resampled_pass_at_1([a, b], Resampling.SAMPLES)
    # Sampling noise only: per goal at 1/2, 0.25/32 for each policy; the solved and unsolved ones none.
    expected = math.sqrt(20 * 0.25 / 32 * 2) / 40
    assert np.std(means[1] - means[0]) == pytest.approx(expected, rel=0.05)
    # Goals redrawn: the difference (1 on 2 goals of 40, 0 elsewhere) has sd sqrt(p(1-p)/40), p = 0.05.
    means = resampled_pass_at_1([a, b], Resampling.TASKS)
    assert np.std(means[1] - means[0]) == pytest.approx(math.sqrt(0.05 * 0.95 / 40), rel=0.05)
    # A gain on two goals is certain against sampling noise, not against the choice of goals.
    assert paired_difference(a, b, Resampling.SAMPLES).low > 0
    assert paired_difference(a, b, Resampling.TASKS).low == 0.0


def test_gain_ratio_per_call():
    base, a, b = [(10, 0)] * 10, [(10, 1)] * 10, [(10, 2)] * 10
    ratio = gain_ratio(base, a, b)
    assert (ratio.mean, ratio.low, ratio.high) == pytest.approx((2.0, 2.0, 2.0)) and ratio.excludes_one()
    assert gain_ratio(base, a, b, cost_a=1.0, cost_b=2.0).mean == pytest.approx(1.0)  # twice the calls
    # a's gain is 0 on some resamples (one goal gained): the ratio's interval is unbounded.
    spiky = [(10, 0)] * 9 + [(10, 10)]
    unbounded = gain_ratio(base, spiky, b)
    assert unbounded.low is None and unbounded.high is None and not unbounded.excludes_one()
    assert "unbounded" in str(unbounded)
    assert pass_at_1(spiky) == pytest.approx(0.1)
