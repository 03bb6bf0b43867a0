"""A batch whose store fails some commit markers (after its retries): the trees whose markers
were put are committed and said so, the others fail with their marker's error; a rerun skips
exactly the committed ones and grows the failed ones."""

from __future__ import annotations

import asyncio
import time

import pyarrow as pa
import pytest

from thicket.rollout.sweep import run_tasks
from thicket.rollout.worker import TaskStatus
from thicket.shards.batcher import ShardBatcher
from thicket.shards.storage import (
    CommitMarker,
    CommitStatus,
    PartlyCommitted,
    commit_key,
    committed_shards,
    committed_task_ids,
    read_shard,
    write_shards,
)
from thicket.spec import parse_spec
from thicket.storage.store import LocalStore, StoreUnavailable


class MarkerFaults(LocalStore):
    """A real folder store whose puts of the given tasks' commit markers fail, as a store does
    once its retry deadline has passed (after `delay_s`); every other request goes through."""

    def __init__(self, root, failing: set[int], delay_s: float = 0.0) -> None:
        super().__init__(root)
        self.failing = {commit_key(task): task for task in failing}
        self.delay_s = delay_s
        self.failed: list[int] = []

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if key in self.failing:
            time.sleep(self.delay_s)
            self.failed.append(self.failing[key])
            raise StoreUnavailable(f"storage down while putting {key}")
        return super().put(key, data, if_absent=if_absent)


def tree(task: int, rows: int = 3) -> pa.Table:
    return pa.table({"task": [task] * rows, "node": list(range(rows))})


def spec_for(tmp_path, tasks: int):
    return parse_spec({
        "name": "partial",
        "tasks": {"env": "frozenlake", "env_args": {"size": 4}, "start": 0, "stop": tasks, "per_index": tasks},
        "search": {"algorithm": "mcts", "iterations": 8, "expansions": 2, "max_depth": 8},
        "policy": {"kind": "uniform"},
        "output": str(tmp_path / "out"),
        # every tree in one batch: one data file, then a marker per tree
        "run": {"trees_per_shard": tasks, "shard_wait_s": 60, "progress": False},
        "seed": 3,
    }, "partial.yaml")


async def test_a_partly_committed_batch_reports_each_tree_exactly_and_a_rerun_grows_only_the_failed(tmp_path):
    spec = spec_for(tmp_path, 5)
    root = tmp_path / "out" / "partial"
    faulty = MarkerFaults(root, failing={1, 3})
    first = (await run_tasks(spec, list(range(5)), progress=False, store=faulty)).report
    assert len(list(LocalStore(root).list("trees/data/"))) == 1  # the five trees went in one batch
    status = {o.task: o.status for o in first.outcomes}
    assert status == {0: TaskStatus.COMMITTED, 1: TaskStatus.FAILED, 2: TaskStatus.COMMITTED,
                      3: TaskStatus.FAILED, 4: TaskStatus.COMMITTED}
    assert sorted(faulty.failed) == [1, 3]  # every marker was tried, the failing ones once
    for o in first.failed:
        assert "storage down while putting trees/commits/" in o.error and f"task-{o.task:08d}" in o.error
    assert all(o.nodes > 1 and not o.error for o in first.grown)
    store = LocalStore(root)
    assert committed_task_ids(store) == {0, 2, 4}
    committed_before = {r.task: r for r in committed_shards(store)}

    again = (await run_tasks(spec, list(range(5)), progress=False, store=store)).report
    status = {o.task: o.status for o in again.outcomes}
    assert status == {0: TaskStatus.SKIPPED, 1: TaskStatus.COMMITTED, 2: TaskStatus.SKIPPED,
                      3: TaskStatus.COMMITTED, 4: TaskStatus.SKIPPED}
    refs = {r.task: r for r in committed_shards(store)}
    assert sorted(refs) == [0, 1, 2, 3, 4]
    assert all(refs[t] == committed_before[t] for t in (0, 2, 4))  # the first run's commits stand
    for task, ref in refs.items():
        assert set(read_shard(store, ref).column("task").to_pylist()) == {task}


async def test_each_tree_of_a_batch_gets_its_own_outcome(tmp_path):
    store = MarkerFaults(tmp_path, failing={1})
    other = CommitMarker(2, "trees/data/elsewhere.parquet", "0" * 64, 3, 10, "other", 0.0)
    assert LocalStore(tmp_path).put(commit_key(2), other.to_json(), if_absent=True)  # another writer won task 2
    batcher = ShardBatcher(store, "w", max_trees=3, max_wait_s=60)
    waiting = {task: batcher.add(task, tree(task)) for task in (0, 1, 2)}
    assert await asyncio.wait_for(waiting[0], 10) is CommitStatus.COMMITTED
    assert await asyncio.wait_for(waiting[2], 10) is CommitStatus.ALREADY_COMMITTED
    with pytest.raises(StoreUnavailable, match="task-00000001"):
        await asyncio.wait_for(waiting[1], 10)
    await batcher.aclose()
    assert committed_task_ids(store) == {0, 2}
    [ref] = [r for r in committed_shards(store) if r.task == 0]
    assert read_shard(store, ref).column("task").to_pylist() == [0, 0, 0]


def test_a_store_failing_every_marker_costs_its_wait_once_not_once_per_tree(tmp_path):
    store = MarkerFaults(tmp_path, failing=set(range(6)), delay_s=0.4)
    started = time.monotonic()
    with pytest.raises(PartlyCommitted, match="6 of 6 commit markers not put") as raised:
        write_shards(store, [(task, tree(task)) for task in range(6)], "w")
    assert time.monotonic() - started < 0.4 * 3  # the markers are put at once (6 in a row: 2.4 s)
    assert raised.value.statuses == {} and sorted(raised.value.errors) == list(range(6))
    assert committed_task_ids(store) == set()
    assert len(list(store.list("trees/data/"))) == 1  # kept: a failed put may yet have landed
