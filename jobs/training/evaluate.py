"""pass@1 of a demo policy, measured by the product: `thicket eval`'s path (independent
trajectories of a `sample` sweep, read back from the shards; thicket.evaluation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from thicket.evaluation.run import Evaluation, evaluate
from thicket.spec import SweepSpec, parse_spec

EVAL_TASKS = range(200, 264)  # TextCraft tasks below the expert tasks, plans of 3 to 19 steps
# How the demo sweeps prompt the policy (sweeps/demo.yaml): its requests, whatever the search.
DEMO_POLICY: dict[str, Any] = {"temperature": 1.0, "max_tokens": 48, "max_thought_chars": 64,
                               "constrain_actions": True, "concurrency": 32}
DEMO_MAX_DEPTH = 12


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


def model_pass_at_1(model_dir: str | Path, output: str | Path, tasks: range = EVAL_TASKS, samples: int = 4,
                    seed: int = 0, env: str = "textcraft", max_depth: int = DEMO_MAX_DEPTH) -> Evaluation:
    """pass@1 of a local model folder, served by a vLLM that thicket starts for the sweep."""
    spec = pass_spec({"kind": "vllm", "model": str(model_dir)}, output, tasks, samples, seed, env, max_depth)
    return evaluate(spec, tasks, (1,))
