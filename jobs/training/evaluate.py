"""pass@1 of a policy, measured by the product: a `sample` sweep (independent trajectories)
through `thicket run`'s path, its trees read back from the shards.

pass@1 = successful trajectories / trajectories that ended (success, or the depth limit).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thicket.rollout.sweep import raise_for_failures, run_tasks
from thicket.shards.storage import iter_shards
from thicket.spec import SweepSpec, parse_spec
from thicket.storage import open_store

EVAL_TASKS = range(200, 264)  # TextCraft tasks below the expert tasks, plans of 3 to 19 steps
# How the demo sweeps prompt the policy (sweeps/demo.yaml): its requests, whatever the search.
DEMO_POLICY: dict[str, Any] = {"temperature": 1.0, "max_tokens": 48, "max_thought_chars": 64,
                               "constrain_actions": True, "concurrency": 32}
DEMO_MAX_DEPTH = 12


@dataclass(frozen=True)
class PassRate:
    tasks: int
    trajectories: int
    successes: int
    solved_tasks: int  # tasks with at least one success

    @property
    def rate(self) -> float:
        return self.successes / self.trajectories if self.trajectories else 0.0

    def to_json(self) -> dict[str, object]:
        return {"tasks": self.tasks, "trajectories": self.trajectories, "successes": self.successes,
                "solved_tasks": self.solved_tasks, "pass_at_1": round(self.rate, 4)}


def pass_spec(policy: dict[str, Any], output: str | Path, tasks: range, samples: int, seed: int,
              env: str = "textcraft", max_depth: int = DEMO_MAX_DEPTH) -> SweepSpec:
    return parse_spec({
        "name": "pass-at-1",
        "tasks": {"env": env, "start": tasks.start, "stop": tasks.stop, "per_index": len(tasks)},
        "search": {"algorithm": "sample", "samples": samples, "max_depth": max_depth},
        "policy": {**DEMO_POLICY, **policy},
        "run": {"progress": False},
        "output": str(output),
        "seed": seed,
    })


def pass_at_1(spec: SweepSpec) -> PassRate:
    """Run the sample sweep `spec` (its tasks not yet committed) and measure pass@1 from its trees."""
    summary = asyncio.run(run_tasks(spec, list(range(spec.tasks.start, spec.tasks.stop)), progress=False))
    raise_for_failures(summary)
    trajectories = successes = solved = tasks = 0
    for _, table in iter_shards(open_store(spec.sweep_uri)):
        tasks += 1
        ended = [row for row in table.select(["stop_reason", "success"]).to_pylist()
                 if row["stop_reason"] in ("done", "depth_limit")]
        wins = sum(row["success"] for row in ended)
        trajectories, successes, solved = trajectories + len(ended), successes + wins, solved + (wins > 0)
    return PassRate(tasks, trajectories, successes, solved)


def model_pass_at_1(model_dir: str | Path, output: str | Path, tasks: range = EVAL_TASKS, samples: int = 4,
                    seed: int = 0, env: str = "textcraft", max_depth: int = DEMO_MAX_DEPTH) -> PassRate:
    """pass@1 of a local model folder, served by a vLLM that thicket starts for the sweep."""
    policy = {"kind": "vllm", "model": str(model_dir)}
    return pass_at_1(pass_spec(policy, output, tasks, samples, seed, env, max_depth))
