"""Paired comparisons of policies evaluated on the same tasks with the same sampling seed: the
difference in pass@1, a ratio of gains over a common base, McNemar's exact test for one outcome a
task, and the minimum difference a design can detect, computed before it runs.

A policy's outcomes are each task's (samples, successes). Every interval is a percentile bootstrap
of one of two kinds, which answer two questions:
- `Resampling.SAMPLES`: the tasks fixed, each task's samples redrawn (binomially, at its observed
  rate) for every policy: could sampling noise alone give this difference on these tasks? The
  minimum detectable effect below is this kind's.
- `Resampling.TASKS`: the tasks redrawn, each task's outcomes under every policy kept together:
  would the difference hold on other tasks like these? Wider where a gain lies on a few tasks.
Both are seeded with a constant, as in thicket.estimators.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from thicket.estimators import LEVEL, RESAMPLES, Estimate

POWER = 0.8
Outcomes = Sequence[tuple[int, int]]  # per task: (evaluated samples, successes)


class Resampling(enum.Enum):
    SAMPLES = "samples within each task"
    TASKS = "tasks"


def pass_at_1(outcomes: Outcomes) -> float:
    return sum(c / n for n, c in outcomes) / len(outcomes)


def resampled_pass_at_1(policies: Sequence[Outcomes], how: Resampling, seed: int = 0,
                        resamples: int = RESAMPLES) -> np.ndarray:
    """(policies, resamples): each policy's pass@1 on each resample, the same resample for all."""
    if len({len(outcomes) for outcomes in policies}) != 1:
        raise ValueError(f"paired over tasks: task counts {[len(o) for o in policies]} differ")
    counts = np.asarray(policies, dtype=float)  # (policies, tasks, 2)
    if (counts[:, :, 0] < 1).any():
        raise ValueError("paired over tasks: every task needs an evaluated sample under every policy")
    n, rates = counts[:, :, 0], counts[:, :, 1] / counts[:, :, 0]
    rng = np.random.default_rng(seed)
    if how is Resampling.TASKS:
        picks = rng.integers(0, n.shape[1], size=(resamples, n.shape[1]))
        return rates[:, picks].mean(axis=2)
    drawn = rng.binomial(n.astype(int)[:, None, :], rates[:, None, :], size=(len(policies), resamples, n.shape[1]))
    return (drawn / n[:, None, :]).mean(axis=2)


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def paired_difference(a: Outcomes, b: Outcomes, how: Resampling = Resampling.TASKS, seed: int = 0,
                      level: float = LEVEL) -> Estimate:
    """b's pass@1 less a's on the same tasks, with a percentile interval of the chosen kind."""
    means = resampled_pass_at_1([a, b], how, seed)
    return Estimate(pass_at_1(b) - pass_at_1(a), *_interval(means[1] - means[0], level), len(a))


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


def gain_ratio(base: Outcomes, a: Outcomes, b: Outcomes, cost_a: float = 1.0, cost_b: float = 1.0,
               how: Resampling = Resampling.TASKS, seed: int = 0, level: float = LEVEL) -> Ratio:
    """(b's gain over base per unit of cost_b) / (a's per unit of cost_a), with a percentile interval
    over the same resamples. Its interval is only bounded where a's gain is positive in every
    resample: a ratio whose denominator can be 0 or negative says nothing."""
    means = resampled_pass_at_1([base, a, b], how, seed)
    gain_a, gain_b = (means[1] - means[0]) / cost_a, (means[2] - means[0]) / cost_b
    point_a = (pass_at_1(a) - pass_at_1(base)) / cost_a
    point = None if point_a == 0 else (pass_at_1(b) - pass_at_1(base)) / cost_b / point_a
    if (gain_a <= 0).any():
        return Ratio(point, None, None)
    return Ratio(point, *_interval(gain_b / gain_a, level))


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
    `samples` independent samples a task under each, detects with this power against sampling
    noise (`Resampling.SAMPLES`: the tasks fixed): z_sum x the standard error of the difference, if
    each task's success chance were its rate under both policies and the two policies' outcomes
    were independent. With one sample a task (greedy decoding), a task's two outcomes disagree with
    chance 2q(1-q): the same formula at samples=1. How a gain spreads over tasks is not in it: the
    `Resampling.TASKS` interval's width also holds that, and is known only after the run."""
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
