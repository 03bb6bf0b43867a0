"""Evaluate a spec's policy: independent samples of each task (a `sample` sweep run by
`thicket run`'s code), read back from the shards as per-task outcomes, then estimated.

A trajectory counts when its leaf is evaluated (StopReason.evaluated: the episode ended,
reached the depth limit or scored a disaster); trajectories cut by a budget, a timeout or
an error say nothing about the policy and are counted apart, as `excluded`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from thicket.async_main import run_main
from thicket.errors import BadInput
from thicket.estimators import Estimate, bootstrap, pass_at_k
from thicket.rollout.sweep import raise_for_failures, run_tasks
from thicket.search.tree import StopReason
from thicket.shards.storage import iter_shards
from thicket.spec import SweepSpec, parse_spec
from thicket.storage import open_store

LEAF_COLUMNS = ["stop_reason", "success", "path_return"]


@dataclass(frozen=True)
class TaskOutcome:
    task: int
    returns: tuple[float, ...]  # the path return of each evaluated trajectory
    successes: int
    excluded: int  # trajectories cut by a budget, a timeout or an error

    @property
    def samples(self) -> int:
        return len(self.returns)


@dataclass(frozen=True)
class Evaluation:
    name: str
    env: str
    outcomes: tuple[TaskOutcome, ...]
    ks: tuple[int, ...]
    seed: int  # of the samples

    @property
    def evaluated(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.samples]

    def pass_at(self, k: int) -> Estimate | None:
        values = [pass_at_k(o.samples, o.successes, k) for o in self.evaluated if o.samples >= k]
        return bootstrap(values) if values else None

    @property
    def mean_return(self) -> Estimate | None:
        values = [sum(o.returns) / o.samples for o in self.evaluated]
        return bootstrap(values) if values else None

    @property
    def trajectories(self) -> int:
        return sum(o.samples for o in self.outcomes)

    @property
    def excluded(self) -> int:
        return sum(o.excluded for o in self.outcomes)

    def summary(self) -> str:
        figures = [f"pass@{k} {self.pass_at(k) or 'n/a'}" for k in self.ks]
        figures.append(f"mean return {self.mean_return or 'n/a'}")
        counts = (f"{len(self.outcomes)} tasks, {self.trajectories} trajectories"
                  + (f", {self.excluded} excluded (budget, timeout or error)" if self.excluded else ""))
        return f"eval {self.name} ({self.env}): {' · '.join(figures)} · {counts} · 95% intervals over tasks"

    def to_json(self) -> dict[str, Any]:
        def figure(estimate: Estimate | None) -> dict[str, float | int] | None:
            return estimate.to_json() if estimate else None

        return {
            "name": self.name, "env": self.env, "seed": self.seed, "level": 0.95,
            "tasks": len(self.outcomes), "trajectories": self.trajectories, "excluded": self.excluded,
            "successes": sum(o.successes for o in self.outcomes),
            "solved_tasks": sum(o.successes > 0 for o in self.outcomes),
            **{f"pass_at_{k}": figure(self.pass_at(k)) for k in self.ks},
            "mean_return": figure(self.mean_return),
            "per_task": [{"task": o.task, "samples": o.samples, "successes": o.successes, "excluded": o.excluded,
                          "mean_return": round(sum(o.returns) / o.samples, 4) if o.samples else None}
                         for o in self.outcomes],
        }


def eval_spec(spec: SweepSpec, samples: int, output: str | None = None) -> SweepSpec:
    """SPEC with its search replaced by `samples` independent trajectories a task (its depth
    limit and temperature kept, no budget to cut them), under the name NAME-eval."""
    search: dict[str, Any] = {"algorithm": "sample", "samples": samples, "max_depth": spec.search.max_depth,
                              "max_nodes": samples * spec.search.max_depth + 1}
    if spec.search.temperature is not None:
        search["temperature"] = spec.search.temperature
    data = spec.model_dump()
    data |= {"name": f"{spec.name}-eval", "search": search}
    if output is not None:
        data["output"] = output
    return parse_spec(data)


def check_ks(ks: Sequence[int], samples: int) -> tuple[int, ...]:
    for k in ks:
        if not 1 <= k <= samples:
            raise BadInput(f"--k {k}: pass@k needs 1 <= k <= --samples ({samples})")
    return tuple(sorted(set(ks)))


def outcomes(spec: SweepSpec, tasks: Sequence[int]) -> tuple[TaskOutcome, ...]:
    """Each asked task's trajectories, from its committed tree."""
    wanted, found = set(tasks), {}
    for ref, table in iter_shards(open_store(spec.sweep_uri, spec.storage.settings())):
        if ref.task not in wanted:
            continue
        leaves = [row for row in table.select(LEAF_COLUMNS).to_pylist()
                  if row["stop_reason"] not in (StopReason.OPEN, StopReason.EXPANDED)]
        ended = [row for row in leaves if StopReason(row["stop_reason"]).evaluated]
        found[ref.task] = TaskOutcome(ref.task, tuple(float(row["path_return"]) for row in ended),
                                      sum(bool(row["success"]) for row in ended), len(leaves) - len(ended))
    missing = wanted - set(found)
    if missing:
        raise RuntimeError(f"eval: tasks {sorted(missing)[:10]} have no committed tree")
    return tuple(found[task] for task in sorted(wanted))


def evaluate(spec: SweepSpec, tasks: Sequence[int], ks: Sequence[int], progress: bool = False) -> Evaluation:
    """Run the eval sweep `spec` (from eval_spec) on `tasks` and estimate from its trees."""
    summary = run_main(run_tasks(spec, list(tasks), progress=progress))
    raise_for_failures(summary)
    return Evaluation(spec.name, spec.tasks.env, outcomes(spec, tasks), tuple(ks), spec.seed)
