"""What a sweep says about the policy that grew it: pass@1 and mean return from its own
independent samples, where its search drew them (algorithm `sample`: every trajectory is one
sample of the policy from the task's start). Other searches steer their samples (a tree's
later turns depend on earlier returns), so their trees give no unbiased pass@1: `thicket
eval` measures those policies. Definitions as `thicket eval`'s (docs/evaluation.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from thicket.aggregate.forest import Forest
from thicket.estimators import bootstrap

INDEPENDENT = "sample"  # the search whose trajectories are independent samples


@dataclass
class PolicyFigures:
    successes: list[float] = field(default_factory=list)  # per tree of independent samples: share of successes
    returns: list[float] = field(default_factory=list)  # its samples' mean return
    trajectories: int = 0

    def add(self, forest: Forest) -> None:
        algorithms = forest.table.column("algorithm").to_numpy(zero_copy_only=False)
        sampled = algorithms[forest.roots] == INDEPENDENT
        leaves = forest.leaves[forest.evaluated[forest.leaves]]
        tree = forest.tree_of[leaves]
        for t in np.flatnonzero(sampled):
            mine = leaves[tree == t]
            if len(mine):
                self.successes.append(float(forest.success[mine].mean()))
                self.returns.append(float(forest.returns[mine].mean()))
                self.trajectories += len(mine)

    def merge(self, other: PolicyFigures) -> None:
        self.successes += other.successes
        self.returns += other.returns
        self.trajectories += other.trajectories

    def to_json(self) -> dict[str, object] | None:
        if not self.successes:
            return None
        return {"source": "the sweep's independent samples (algorithm sample)", "level": 0.95,
                "tasks": len(self.successes), "trajectories": self.trajectories,
                "pass_at_1": bootstrap(self.successes).to_json(),
                "mean_return": bootstrap(self.returns).to_json()}
