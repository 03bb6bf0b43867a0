"""Paired comparisons of policies evaluated on the same tasks with the same sampling seed: the
difference in pass@1, a ratio of gains over a common base, McNemar's exact test for one outcome a
task, and the minimum difference a design can detect, computed before it runs.

Tasks are the unit: every interval is a percentile bootstrap that resamples tasks and keeps each
task's outcomes under every policy together (its samples are not independent of each other, and
the policies' outcomes on one task are not independent of each other either). The bootstrap is
seeded with a constant, as in thicket.estimators.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from thicket.estimators import LEVEL, RESAMPLES, Estimate, bootstrap

POWER = 0.8


def paired_difference(a: Sequence[float], b: Sequence[float], seed: int = 0) -> Estimate:
    """b - a: the mean over tasks of each task's difference (its pass@1 under b less under a)."""
    if len(a) != len(b):
        raise ValueError(f"paired over tasks: {len(a)} tasks against {len(b)}")
    return bootstrap([y - x for x, y in zip(a, b)], seed=seed)


@dataclass(frozen=True)
class Ratio:
    mean: float | None  # None where the denominator's gain is 0
    low: float | None  # None: unbounded (the denominator's gain is <= 0 in part of the resamples)
    high: float | None

    def __str__(self) -> str:
        def show(value: float | None) -> str:
            return "unbounded" if value is None else f"{value:.2f}"
        return f"{show(self.mean)} [{show(self.low)}, {show(self.high)}]"

    def excludes_one(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 1 or self.high < 1)


def gain_ratio(base: Sequence[float], a: Sequence[float], b: Sequence[float], cost_a: float = 1.0,
               cost_b: float = 1.0, seed: int = 0, resamples: int = RESAMPLES, level: float = LEVEL) -> Ratio:
    """(gain of b over base per unit of cost_b) / (gain of a over base per unit of cost_a), with a
    percentile interval over the same task resamples. Its interval is only bounded where a's gain is
    positive in every resample: a ratio whose denominator can be 0 or negative says nothing."""
    data = np.asarray([base, a, b], dtype=float)
    if len({len(row) for row in (base, a, b)}) != 1:
        raise ValueError("paired over tasks: the three policies' task counts differ")
    picks = np.random.default_rng(seed).integers(0, data.shape[1], size=(resamples, data.shape[1]))
    means = data[:, picks].mean(axis=2)  # (3, resamples)
    gain_a, gain_b = (means[1] - means[0]) / cost_a, (means[2] - means[0]) / cost_b
    point_a = (data[1].mean() - data[0].mean()) / cost_a
    point = None if point_a == 0 else float((data[2].mean() - data[0].mean()) / cost_b / point_a)
    if (gain_a <= 0).any():
        return Ratio(point, None, None)
    low, high = np.quantile(gain_b / gain_a, [(1 - level) / 2, (1 + level) / 2])
    return Ratio(point, float(low), float(high))


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value for one binary outcome a task under two policies: of the
    discordant tasks, how unlikely a split at least this uneven is if each way is equally likely."""
    if len(a) != len(b):
        raise ValueError(f"paired over tasks: {len(a)} tasks against {len(b)}")
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    discordant = only_a + only_b
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, i) for i in range(min(only_a, only_b) + 1)) / 2 ** discordant
    return min(1.0, 2 * tail)


def z_sum(power: float = POWER, level: float = LEVEL) -> float:
    """z_(1 - alpha/2) + z_power: a two-sided test at `level` with this power (2.80 at 0.95 and 0.8)."""
    normal = NormalDist()
    return normal.inv_cdf((1 + level) / 2) + normal.inv_cdf(power)


def minimum_detectable_effect(rates: Sequence[float], samples: int, power: float = POWER,
                              level: float = LEVEL) -> float:
    """The smallest difference in pass@1 between two policies that a paired design over these tasks,
    `samples` independent samples a task under each, detects with this power: z_sum x the standard
    error of the difference, if each task's success chance were its rate under both policies and
    the two policies' outcomes were independent (a positive correlation between them, which pairing
    exploits, only shrinks it). With one sample a task (greedy decoding), a task's two outcomes
    disagree with chance 2q(1-q): the same formula at samples=1."""
    if samples < 1 or not rates:
        raise ValueError("a design needs at least one task and one sample a task")
    variance = sum(2 * q * (1 - q) / samples for q in rates) / len(rates) ** 2
    return z_sum(power, level) * math.sqrt(variance)


def pilot_rates(outcomes: Sequence[tuple[int, int]]) -> list[float]:
    """Per-task success chances from a pilot's (samples, successes), shrunk so that q(1-q) is unbiased:
    the plug-in c/n gives n-1/n of q(1-q) in expectation, so a planning variance built on it would be
    too small. Returns q' with q'(1-q') = c/n (1 - c/n) n/(n-1) (q' <= 1/2; only q(1-q) matters)."""
    rates = []
    for n, c in outcomes:
        if n < 2:
            raise ValueError("a pilot needs at least 2 samples a task to estimate its variance")
        spread = (c / n) * (1 - c / n) * n / (n - 1)
        rates.append((1 - math.sqrt(max(0.0, 1 - 4 * min(spread, 0.25)))) / 2)
    return rates
