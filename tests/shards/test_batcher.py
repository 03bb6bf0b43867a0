"""The worker's batches of finished trees: written when full, when the oldest has waited
long enough, or when flushed; a write's failure reaches every tree of the batch."""

from __future__ import annotations

import asyncio
import time

import pyarrow as pa
import pytest

from thicket.shards.batcher import ShardBatcher
from thicket.shards.storage import CommitStatus, committed_shards, read_shard
from thicket.storage.store import LocalStore, StoreUnavailable


def tree(task: int, rows: int = 4) -> pa.Table:
    return pa.table({"task": [task] * rows, "node": list(range(rows))})


async def test_a_full_batch_is_written_at_once_as_one_file(tmp_path):
    store = LocalStore(tmp_path)
    batcher = ShardBatcher(store, "w", max_trees=3, max_wait_s=60)
    waiting = [batcher.add(task, tree(task, rows=task + 2)) for task in (4, 1, 7)]
    assert await asyncio.wait_for(asyncio.gather(*waiting), 10) == [CommitStatus.COMMITTED] * 3
    [key] = list(store.list("trees/data/"))
    assert key.startswith("trees/data/batch-00000001-00000007.")
    assert [(r.task, read_shard(store, r).num_rows) for r in committed_shards(store)] == [(1, 3), (4, 6), (7, 9)]
    await batcher.aclose()


async def test_a_tree_waits_at_most_max_wait_s_for_others(tmp_path):
    store = LocalStore(tmp_path)
    batcher = ShardBatcher(store, "w", max_trees=10, max_wait_s=0.3)
    started = time.monotonic()
    # Both added before the loop runs again: no timing decides whether they share the batch (a
    # sleep between them once let a loaded machine's timer fire first, giving two shards).
    first = batcher.add(0, tree(0))
    second = batcher.add(1, tree(1))
    assert await asyncio.wait_for(asyncio.gather(first, second), 10) == [CommitStatus.COMMITTED] * 2
    assert 0.25 < time.monotonic() - started < 5  # held for max_wait_s (2 of max_trees 10), then written
    assert len(list(store.list("trees/data/"))) == 1
    third = batcher.add(2, tree(2))
    batcher.flush()  # no more trees coming: written now, alone
    assert await asyncio.wait_for(third, 10) is CommitStatus.COMMITTED
    assert any(k.startswith("trees/data/task-00000002.") for k in store.list("trees/data/"))
    await batcher.aclose()


class FailingStore(LocalStore):
    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        raise StoreUnavailable(f"storage down while putting {key}")


async def test_a_failed_write_fails_every_tree_of_its_batch(tmp_path):
    batcher = ShardBatcher(FailingStore(tmp_path), "w", max_trees=2, max_wait_s=60)
    waiting = [batcher.add(task, tree(task)) for task in (0, 1)]
    for future in waiting:
        with pytest.raises(StoreUnavailable, match="storage down"):
            await asyncio.wait_for(future, 10)
    await batcher.aclose()
    assert not list(LocalStore(tmp_path).list("trees/"))

