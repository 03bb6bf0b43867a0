"""pass@k against brute force over every k-subset of a task's samples, and the bootstrap
interval's behaviour."""

from __future__ import annotations

import itertools

import pytest

from thicket.estimators import bootstrap, pass_at_k


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_success(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_1_is_the_success_share():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_impossible_counts_are_refused(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_the_interval_holds_the_mean_and_narrows_with_more_tasks():
    few = bootstrap([0.0, 1.0] * 5, seed=0)
    many = bootstrap([0.0, 1.0] * 500, seed=0)
    assert few.mean == many.mean == 0.5
    assert few.low < 0.5 < few.high and many.low < 0.5 < many.high
    assert many.high - many.low < (few.high - few.low) / 5
    # a binomial mean's 95% interval is about +-1.96 sd: sd = 0.5 / sqrt(1000)
    assert many.high - many.low == pytest.approx(2 * 1.96 * 0.5 / 1000 ** 0.5, rel=0.1)


def test_equal_values_give_a_point_and_the_same_seed_the_same_interval():
    assert bootstrap([0.25] * 9, seed=3) == bootstrap([0.25] * 9, seed=3)
    point = bootstrap([0.25] * 9, seed=3)
    assert (point.low, point.mean, point.high, point.tasks) == (0.25, 0.25, 0.25, 9)
    assert bootstrap([0.0, 0.3, 1.0], seed=1) == bootstrap([0.0, 0.3, 1.0], seed=1)


def test_no_task_is_refused():
    with pytest.raises(ValueError):
        bootstrap([], seed=0)
