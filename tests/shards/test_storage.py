"""Tree shards on a store (thicket.shards.storage): atomic commit, resume, races, checksums, the
listings that find committed shards, and batch files of several trees."""

from __future__ import annotations

import threading
from dataclasses import replace

import pyarrow as pa
import pytest

from tests.support.scripted import META, small_tree
from thicket.shards.storage import (
    CommitStatus,
    ShardRef,
    commit_key,
    committed_shards,
    committed_tasks,
    data_key,
    iter_shards,
    read_marker,
    read_shard,
    to_parquet,
    write_shard,
    write_shards,
)
from thicket.shards.table import TreeMeta, tree_table
from thicket.storage.store import LocalStore, StoreError


async def test_commit_is_visible_once_and_a_rerun_is_a_no_op(tmp_path):
    store = LocalStore(tmp_path)
    table = tree_table(await small_tree(), META)
    assert write_shard(store, 7, table, "w1") is CommitStatus.COMMITTED
    assert write_shard(store, 7, table, "w2") is CommitStatus.ALREADY_COMMITTED
    assert list(committed_tasks(store)) == [7]
    assert read_marker(store, 7).writer == "w1"
    [(marker, read)] = list(iter_shards(store))
    assert read.equals(table) and marker.rows == 15
    assert len(list(store.list("trees/data/"))) == 1  # identical bytes share one data object


async def test_racing_writers_commit_exactly_one_copy_and_leave_no_orphans(tmp_path):
    store = LocalStore(tmp_path)
    tables = []
    for seed in range(8):  # different contents, so different data keys
        tree = await small_tree()
        tree.seed = seed
        tables.append(tree_table(tree, TreeMeta("s", "word", "mcts", f"m{seed}", seed)))
    results: list[CommitStatus] = []
    barrier = threading.Barrier(len(tables))

    def race(i: int) -> None:
        barrier.wait()
        results.append(write_shard(store, 3, tables[i], f"w{i}"))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(tables))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(CommitStatus.COMMITTED) == 1
    marker = read_marker(store, 3)
    assert list(store.list("trees/data/")) == [marker.data_key]
    assert read_shard(store, marker).num_rows == 15


async def test_a_corrupt_shard_is_refused(tmp_path):
    store = LocalStore(tmp_path)
    write_shard(store, 1, tree_table(await small_tree(), META), "w")
    marker = read_marker(store, 1)
    (tmp_path / marker.data_key).write_bytes(b"garbage")
    with pytest.raises(StoreError, match="corrupt"):
        read_shard(store, marker)


def test_data_without_a_marker_is_invisible(tmp_path):
    store = LocalStore(tmp_path)
    store.put("trees/data/task-00000005.deadbeef.parquet", b"half written")
    assert committed_tasks(store) == {}
    assert not store.exists(commit_key(5))


class CountingStore(LocalStore):
    def __init__(self, root) -> None:
        super().__init__(root)
        self.gets: list[str] = []

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return super().get(key)


async def test_committed_shards_come_from_two_listings_and_markers_only_where_ambiguous(tmp_path):
    store = CountingStore(tmp_path)
    tables = {}
    for task in range(8):
        tree = await small_tree(task)
        tree.seed = task
        tables[task] = tree_table(tree, TreeMeta("s", "word", "mcts", "m", task))
    for task in range(6):
        write_shard(store, task, tables[task], "w")
    # Task 3: a crashed attempt left its data beside the committed shard.
    store.put(data_key(3, "0" * 64, 15), to_parquet(tables[7]))
    # Task 4: committed by an earlier thicket, whose data keys had a 16-digit digest only.
    marker = read_marker(store, 4)
    store.delete(commit_key(4))
    store.delete(marker.data_key)
    earlier = f"trees/data/task-00000004.{marker.sha256[:16]}.parquet"
    store.put(earlier, to_parquet(tables[4]))
    store.put(commit_key(4), replace(marker, data_key=earlier).to_json())
    # Task 6: data put, marker never written (a crash in between): not committed.
    store.put(data_key(6, "f" * 64, 15), to_parquet(tables[6]))

    store.gets.clear()
    refs = committed_shards(store)
    assert [r.task for r in refs] == list(range(6))
    assert sorted(store.gets) == [commit_key(3), commit_key(4)]  # the ambiguous and the earlier one
    markers = committed_tasks(store)
    assert all(ref == ShardRef(ref.task, markers[ref.task].data_key, markers[ref.task].sha256,
                               markers[ref.task].rows) for ref in refs)
    assert [read_shard(store, ref).equals(tables[ref.task]) for ref in refs] == [True] * 6


# -- batch files: several trees in one data file, each committed by its own marker ------------


async def distinct_tables(tasks: list[int], model: str = "m") -> dict[int, pa.Table]:
    tables = {}
    for task in tasks:
        tree = await small_tree(task)
        tree.seed = task
        tables[task] = tree_table(tree, TreeMeta("s", "word", "mcts", model, task))
    return tables


async def test_a_batch_commits_each_tree_and_reads_back_its_rows(tmp_path):
    store = CountingStore(tmp_path)
    tables = await distinct_tables([9, 2, 5])
    statuses = write_shards(store, list(tables.items()), "w")
    assert statuses == {2: CommitStatus.COMMITTED, 5: CommitStatus.COMMITTED, 9: CommitStatus.COMMITTED}
    [key] = list(store.list("trees/data/"))
    assert key.startswith("trees/data/batch-00000002-00000009.")
    refs = committed_shards(store)
    assert [(r.task, r.row_start, r.rows) for r in refs] == [(2, 0, 15), (5, 15, 15), (9, 30, 15)]
    assert all(read_shard(store, ref).equals(tables[ref.task]) for ref in refs)
    store.gets.clear()
    assert [(ref.task, table.equals(tables[ref.task])) for ref, table in iter_shards(store)] == [
        (2, True), (5, True), (9, True)]
    assert store.gets.count(key) == 1  # one read of the file for its three trees
    assert write_shards(store, [(5, tables[5]), (9, tables[9])], "w2") == {
        5: CommitStatus.ALREADY_COMMITTED, 9: CommitStatus.ALREADY_COMMITTED}
    assert list(store.list("trees/data/")) == [key]  # the rerun's file held no committed tree: deleted


async def test_a_batch_beside_single_tree_shards_reads_each_task_from_its_marker(tmp_path):
    store = CountingStore(tmp_path)
    tables = await distinct_tables([1, 2, 3, 4])
    other = (await distinct_tables([2], model="other"))[2]
    write_shard(store, 2, other, "first")  # won task 2 before the batch came
    write_shard(store, 4, tables[4], "w")  # outside the batch's task range: no marker read
    assert write_shards(store, [(t, tables[t]) for t in (1, 2, 3)], "w") == {
        1: CommitStatus.COMMITTED, 2: CommitStatus.ALREADY_COMMITTED, 3: CommitStatus.COMMITTED}
    store.gets.clear()
    refs = committed_shards(store)
    assert sorted(store.gets) == [commit_key(1), commit_key(2), commit_key(3)]
    assert read_shard(store, refs[1]).equals(other)  # task 2's data: the single-tree shard
    assert [read_shard(store, r).equals(t) for r, t in zip(refs, [tables[1], other, tables[3], tables[4]])] == [
        True] * 4


async def test_racing_batches_commit_each_task_exactly_once(tmp_path):
    store = LocalStore(tmp_path)
    batches = [[0, 1, 2], [1, 2, 3], [2, 3, 4], [4, 5]]
    contents = [await distinct_tables(tasks, model=f"m{i}") for i, tasks in enumerate(batches)]
    results: list[dict[int, CommitStatus]] = [{} for _ in batches]
    barrier = threading.Barrier(len(batches))

    def race(i: int) -> None:
        barrier.wait()
        results[i] = write_shards(store, list(contents[i].items()), f"w{i}")

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for task in range(6):
        assert sum(r.get(task) is CommitStatus.COMMITTED for r in results) == 1
    refs = committed_shards(store)
    assert [r.task for r in refs] == list(range(6))
    for ref in refs:
        winner = next(i for i, r in enumerate(results) if r.get(ref.task) is CommitStatus.COMMITTED)
        assert read_shard(store, ref).equals(contents[winner][ref.task])
    kept = {r.data_key for r in refs}
    assert set(store.list("trees/data/")) == kept  # every file left holds a committed tree


async def test_a_marker_that_misplaces_its_tree_in_a_batch_is_refused(tmp_path):
    store = LocalStore(tmp_path)
    tables = await distinct_tables([1, 2])
    write_shards(store, list(tables.items()), "w")
    marker = read_marker(store, 2)
    for wrong in (replace(marker, row_start=14), replace(marker, rows=14), replace(marker, rows=16)):
        with pytest.raises(StoreError, match="does not hold task 2's"):
            read_shard(store, wrong)
    with pytest.raises(ValueError, match="each task once"):
        write_shards(store, [(3, tables[1]), (3, tables[2])], "w")
