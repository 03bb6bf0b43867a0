"""ALFWorld end to end: a small uniform `thicket run` sweep writes trees and datasets that hold
the methods' properties, and the expert planner's plans win through the real env."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.dataset_checks import THICKET, run_checked_sweep
from thicket.envs.alfworld import tasks

REPO = Path(__file__).resolve().parents[2]


def test_a_uniform_sweep_writes_trees_and_datasets(alf_cache: Path, played: dict[int, dict[str, Any]],
                                                   tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: alfworld\ntasks: {{env: alfworld, env_args: {{cache_dir: '{alf_cache}'}}, start: 0, stop: 2, "
        "env_server: {mode: in_process}}\nsearch: {algorithm: dense, width: 3, max_depth: 4, run_budget: 6}\n"
        f"policy: {{kind: uniform}}\noutput: {tmp_path / 'out'}\nseed: 3\n")
    sweep = tmp_path / "out" / "alfworld"
    stats = run_checked_sweep(spec, sweep, timeout=300).stats
    assert stats["trees"] == 2 and set(stats["reward_semantics"]) == {"increment"}
    [(source, trees)] = stats["data_sources"].items()
    assert trees == 2 and source.startswith("alfworld: thicket's generated ALFWorld games (generator v")
    assert "2.1.1 wording): NOT ALFWorld's benchmark" in source
    assert f"- {source} (2 trees)" in (sweep / "datasets" / "README.md").read_text()


def test_the_shipped_uniform_sweep_spec_validates(alf_cache: Path, played: dict[int, dict[str, Any]]) -> None:
    env = {**os.environ, "THICKET_ALFWORLD_CACHE": str(alf_cache)}  # it loads task 0 to ask for valid actions
    done = subprocess.run([THICKET, "validate", str(REPO / "sweeps" / "alfworld-uniform.yaml")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]


def test_expert_plans_win_through_the_real_env(alf_cache: Path, played: dict[int, dict[str, Any]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from thicket.training.experts import PLANNERS, play, planner, with_waste

    monkeypatch.setenv("THICKET_ALFWORLD_CACHE", str(alf_cache))
    assert PLANNERS["alfworld"] is planner("alfworld")
    rng = random.Random(0)
    for task in range(len(tasks.TASK_TYPES)):  # one of each task type
        plan = planner("alfworld")(task)
        assert plan is not None and all(step.thought for step in plan.steps)
        messages = asyncio.run(play("alfworld", task, with_waste(plan, 0.3, rng)))
        assert messages is not None, f"task {task}: the expert's plan did not win"
