"""Trees that survive a kill: a `thicket run` child process killed (SIGKILL) or stopped (SIGTERM,
Kubernetes' preemption and drain signal) while its trees grow, then run again, gives the trees
an uninterrupted run grows, for every search algorithm, on a local folder and on S3 (moto).

The oracle is the uninterrupted run of the same spec and seed, not the checkpoint code.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
import yaml

from tests.support.harness import (
    NAME,
    assert_each_task_committed_once,
    start_thicket,
    sweep_spec,
    thicket,
    tree_fingerprint,
    wait_until,
)
from thicket.rollout.checkpoint import CHECKPOINTS
from thicket.shards.storage import committed_task_ids
from thicket.storage import open_store
from thicket.storage.store import Store

TASKS = [0, 1]
SEARCHES = {  # small trees, each about a hundred proposes of 20 ms
    "mcts": {"algorithm": "mcts", "iterations": 12, "expansions": 3, "max_depth": 10},
    "mcts_pw": {"algorithm": "mcts_pw", "iterations": 40, "max_depth": 10},
    "tot": {"algorithm": "tot", "branching": 2, "beam": 4, "max_depth": 8},
    "dense": {"algorithm": "dense", "width": 3, "run_budget": 24, "target_pairs": 1000, "max_depth": 10},
    "sample": {"algorithm": "sample", "samples": 12, "max_depth": 10},
}
INTERRUPTIONS = [("local", signal.SIGKILL), ("s3", signal.SIGTERM)]


def spec_for(tmp_path: Path, algorithm: str) -> Path:
    path = sweep_spec(tmp_path, count=len(TASKS), policy={"latency_s": 0.01},
                      run={"checkpoint": {"every_calls": 4}, "trees_per_shard": 1})
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "search": SEARCHES[algorithm]}, sort_keys=False))
    return path


def segments(store: Store) -> list[str]:
    return [key for key in store.list(CHECKPOINTS)]


def interrupt(spec: Path, output: str, sig: signal.Signals, env: dict[str, str] | None = None,
              after_segments: int = 3) -> tuple[int | None, str]:
    """Start `thicket run`, send it `sig` once its trees saved `after_segments` checkpoint segments;
    (its exit status, its stderr)."""
    store = open_store(f"{output}/{NAME}")
    run = start_thicket("run", str(spec), "--no-aggregate", "--output", output, env=env)
    try:
        wait_until(lambda: len(segments(store)) >= after_segments, 120, f"{after_segments} checkpoint segments", run)
        run.send_signal(sig)
        _, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
    return run.returncode, stderr


def resumed_calls(stdout: str) -> int:
    found = re.search(r"resumed +\d+ trees? from checkpoints: (\d+) nodes and (\d+) LLM calls", stdout)
    assert found, stdout
    return int(found.group(2))


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Each algorithm's uninterrupted trees (computed once per algorithm)."""
    cache: dict[str, object] = {}

    def reference(algorithm: str) -> object:
        if algorithm not in cache:
            tmp = tmp_path_factory.mktemp(f"reference-{algorithm}")
            out = tmp / "out"
            result = thicket("run", str(spec_for(tmp, algorithm)), "--no-aggregate", "--output", str(out))
            assert result.returncode == 0, result.stderr
            assert "resumed" not in result.stdout
            cache[algorithm] = tree_fingerprint(str(out / NAME))
        return cache[algorithm]

    return reference  # type: ignore[return-value]


CASES = [(algorithm, where, sig) for algorithm in SEARCHES for where, sig in INTERRUPTIONS]
CASES += [("tot", "s3", signal.SIGKILL), ("mcts_pw", "local", signal.SIGTERM)]  # the other two pairings


@pytest.mark.slow  # the slow tier (`make test-slow`): a run killed and resumed per case
@pytest.mark.parametrize("algorithm,where,sig", CASES, ids=[f"{a}-{w}-{s.name}" for a, w, s in CASES])
def test_a_killed_run_resumes_its_growing_trees_into_the_uninterrupted_ones(
        algorithm, where, sig, tmp_path, references, request):
    env: dict[str, str] = {}
    if where == "s3":
        s3 = request.getfixturevalue("s3_server")
        env = request.getfixturevalue("aws_env")
        output = f"s3://{s3.make_bucket()}/sweeps"
    else:
        output = str(tmp_path / "out")
    spec = spec_for(tmp_path, algorithm)
    store = open_store(f"{output}/{NAME}")
    returncode, stderr = interrupt(spec, output, sig, env)
    left = set(TASKS) - committed_task_ids(store)
    assert left, "every tree was committed before the signal: nothing was interrupted"
    if sig == signal.SIGTERM:
        assert returncode == 143 and "terminated (SIGTERM)" in stderr, stderr
        assert "saved the checkpoints of" in stderr
    assert segments(store)

    rerun = thicket("run", str(spec), "--no-aggregate", "--output", output, env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert resumed_calls(rerun.stdout) > 0
    assert [line for line in rerun.stderr.splitlines() if "WARNING" in line] == []
    assert_each_task_committed_once(f"{output}/{NAME}", TASKS)
    assert tree_fingerprint(f"{output}/{NAME}") == references(algorithm)
    assert segments(store) == []  # gone with their trees' commits


def test_a_corrupt_checkpoint_is_ignored_from_there_on_with_a_warning(tmp_path, references):
    spec = spec_for(tmp_path, "mcts")
    output = str(tmp_path / "out")
    store = open_store(f"{output}/{NAME}")
    interrupt(spec, output, signal.SIGKILL, after_segments=4)
    task_segments = sorted(k for k in segments(store) if k.startswith(f"{CHECKPOINTS}task-00000000/"))
    assert len(task_segments) >= 2, segments(store)
    store.put(task_segments[1], b"not a checkpoint")  # the second segment: its first one still counts

    rerun = thicket("run", str(spec), "--no-aggregate", "--output", output)
    assert rerun.returncode == 0, rerun.stderr
    assert re.search(r"task 0: checkpoint \S+000001.jsonl.gz ignored from there on: unreadable", rerun.stderr)
    assert tree_fingerprint(f"{output}/{NAME}") == references("mcts")


def test_checkpoints_off_leave_nothing_in_storage(tmp_path):
    spec = sweep_spec(tmp_path, count=1, run={"checkpoint": {"enabled": False}})
    output = str(tmp_path / "out")
    result = thicket("run", str(spec), "--no-aggregate", "--output", output)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "out" / NAME / "checkpoints").exists()


def test_the_stats_say_what_the_checkpoints_brought_back(tmp_path):
    spec = spec_for(tmp_path, "dense")
    output = str(tmp_path / "out")
    store = open_store(f"{output}/{NAME}")
    interrupt(spec, output, signal.SIGTERM)
    rerun = thicket("run", str(spec), "--output", output)  # and aggregate
    assert rerun.returncode == 0, rerun.stderr
    stats = json.loads(store.get("datasets/stats.json"))
    assert stats["resumed"]["llm_calls"] == resumed_calls(rerun.stdout) > 0
    assert 1 <= stats["resumed"]["trees"] <= len(TASKS)
    assert 0 < stats["resumed"]["nodes"] <= stats["nodes"]

