"""The `thicket` command end to end with the uniform policy (no model needed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from thicket.shards.storage import iter_shards
from thicket.storage.store import LocalStore

ROOT = Path(__file__).resolve().parent.parent
THICKET = str(Path(sys.executable).parent / "thicket")


def thicket(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [THICKET, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def test_demo_with_uniform_policy_runs_fast_writes_readable_shards_and_resumes(tmp_path):
    first = thicket("run", "sweeps/demo.yaml", "--policy", "uniform", "--output", str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert "tasks        6 (6 grown" in first.stdout
    assert "trees        6 grown in this run" in first.stdout and "trees        6 committed in the sweep" in first.stdout
    assert "in flight" not in first.stdout  # the uniform policy makes no LLM requests
    sweep = tmp_path / "demo-textcraft-mcts"
    shards = sorted((sweep / "trees" / "data").glob("*.parquet"))
    assert len(shards) == 1 and shards[0].name.startswith("batch-00000200-00000205.")  # six trees to a file
    trees = list(iter_shards(LocalStore(sweep)))
    assert [ref.task for ref, _ in trees] == list(range(200, 206))
    for _, table in trees:
        assert table.num_rows > 1 and table.column("node").to_pylist() == list(range(table.num_rows))
    assert (sweep / "spec.yaml").is_file()
    again = thicket("run", "sweeps/demo.yaml", "--policy", "uniform", "--output", str(tmp_path))
    assert again.returncode == 0 and re.search(r"\b6 (trees )?already committed", again.stdout), again.stdout
    assert "trees        6 committed in the sweep" in again.stdout
    assert sorted((sweep / "trees" / "data").glob("*.parquet")) == shards


def test_indices_run_a_subset_and_a_full_rerun_completes_the_rest(tmp_path):
    part = thicket("run", "sweeps/demo.yaml", "--policy", "uniform", "--output", str(tmp_path), "--indices", "201-202,204")
    assert part.returncode == 0 and "tasks        3 (3 grown" in part.stdout
    commits = sorted(p.name for p in (tmp_path / "demo-textcraft-mcts" / "trees" / "commits").iterdir())
    assert commits == ["task-00000201.json", "task-00000202.json", "task-00000204.json"]
    rest = thicket("run", "sweeps/demo.yaml", "--policy", "uniform", "--output", str(tmp_path))
    assert "(3 grown, 3 already committed" in rest.stdout


def test_worker_runs_the_range_of_its_completion_index(tmp_path):
    missing_model = tmp_path / "no-model.yaml"
    missing_model.write_text((ROOT / "sweeps/demo.yaml").read_text().replace("models/demo", str(tmp_path / "nope")))
    result = thicket("worker", str(missing_model), "--output", str(tmp_path), env={"JOB_COMPLETION_INDEX": "1"})
    assert result.returncode == 2 and "policy.model" in result.stderr  # no model folder there
    spec = tmp_path / "uniform.yaml"
    spec.write_text((ROOT / "sweeps/demo.yaml").read_text().replace("kind: vllm", "kind: uniform"))
    result = thicket("worker", str(spec), "--output", str(tmp_path), env={"JOB_COMPLETION_INDEX": "1"})
    assert result.returncode == 0, result.stderr
    commits = sorted(p.name for p in (tmp_path / "demo-textcraft-mcts" / "trees" / "commits").iterdir())
    assert commits == ["task-00000203.json", "task-00000204.json", "task-00000205.json"]


def test_export_tot_json_has_the_tot_pipeline_layout(tmp_path):
    assert thicket("run", "sweeps/demo.yaml", "--policy", "uniform", "--output", str(tmp_path)).returncode == 0
    out = tmp_path / "tot_agent_results.json"
    result = thicket("export", str(tmp_path / "demo-textcraft-mcts"), "--format", "tot-json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    episodes = json.loads(out.read_text())
    assert [e["episode"] for e in episodes] == list(range(200, 206))
    step_keys = {
        "observation", "thought_history", "actions_history", "current_thought",
        "current_thought_logp", "current_action", "current_action_logp", "cumulative_reward",
    }
    for episode in episodes:
        assert episode["paths"]
        for path in episode["paths"]:
            assert set(path) == {"trajectory", "final_reward"}
            for i, step in enumerate(path["trajectory"]):
                assert set(step) == step_keys
                assert len(step["actions_history"]) == len(step["thought_history"]) == i
            assert path["final_reward"] == path["trajectory"][-1]["cumulative_reward"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "missing.yaml"], "missing.yaml: cannot read the spec"),
        (["run", "sweeps/demo.yaml", "--indices", "5-2"], "--indices: range 5-2 is reversed"),
        (["run", "sweeps/demo.yaml", "--indices", "0-99"], "outside the spec's tasks 200-205"),
        (["run", "sweeps/demo.yaml", "--policy", "gpt"], "Invalid value for '--policy'"),
        (["run", "sweeps/demo.yaml", "--bogus"], "No such option '--bogus'"),
        (["run", "sweeps/demo.yaml", "--output", "s3://b/x"], "output: 'b' is not a valid S3 bucket name"),
        (["frobnicate"], "No such command 'frobnicate'"),
        (["worker", "sweeps/demo.yaml"], "JOB_COMPLETION_INDEX is not set"),
        (["worker", "sweeps/demo.yaml", "--index", "7"], "--index: 7 is outside 0-1"),
        (["export", "/nonexistent/sweep"], "no committed trees there"),
        (["run", "sweeps/demo.yaml", "--indices", ""], "--indices: empty"),
        (["show", "/nonexistent/sweep", "--task", "1", "-o", "/nonexistent/dir/x.html"], "its folder /nonexistent/dir does not exist"),
        (["export", "/nonexistent/sweep", "-o", "/nonexistent/dir/x.json"], "its folder /nonexistent/dir does not exist"),
        (["status", "tc"], "no kubeconfig at /nonexistent/kubeconfig (from KUBECONFIG)"),
    ],
)
def test_bad_invocations_exit_2_with_one_line(args, needle):
    result = thicket(*args, env={"JOB_COMPLETION_INDEX": "", "KUBECONFIG": "/nonexistent/kubeconfig", "KUBERNETES_SERVICE_HOST": ""})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_bad_spec_exits_2_naming_the_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text((ROOT / "sweeps/demo.yaml").read_text().replace("iterations: 6", "iterations: -1"))
    result = thicket("run", str(spec))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {spec}: search.iterations: Input should be greater than or equal to 1 (got -1)"
