"""Estimators over a task set, pure functions below everything that reports them (`thicket eval`,
the aggregation's policy figures): pass@k and mean return, each with a 95% interval.

pass@k is Chen et al. (2021)'s unbiased estimator, 1 - C(n-c, k) / C(n, k) for a task
with n evaluated samples of which c succeeded, averaged over the tasks that have n >= k.
The mean return is the average over tasks of their samples' mean path return. Intervals
are percentile bootstraps over tasks: tasks are what differs between two evaluations, and
a task's samples are not independent of each other. Seeded with a constant: the same
outcomes give the same interval, whichever command computed it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of a task's n samples, drawn without replacement, hold a success."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float
    tasks: int  # the tasks it averages over

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def to_json(self) -> dict[str, float | int]:
        return {"mean": round(self.mean, 4), "low": round(self.low, 4), "high": round(self.high, 4),
                "tasks": self.tasks}


def bootstrap(values: Sequence[float], seed: int = 0, resamples: int = RESAMPLES, level: float = LEVEL) -> Estimate:
    """The mean of per-task values with a percentile bootstrap interval over tasks."""
    if not values:
        raise ValueError("no task to estimate over")
    data = np.asarray(values, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    means = data[picks].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(float(data.mean()), float(low), float(high), len(data))
