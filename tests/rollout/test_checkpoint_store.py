"""A tree's checkpoint in storage: what is read back, and what is refused (another spec, another
version, a gap, a broken segment) with a warning and never mixed in."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time

import pytest

from tests.support.s3_server import free_port, use_endpoint
from thicket.policy.base import Reply
from thicket.rollout.checkpoint import (
    CHECKPOINTS,
    GrowingTrees,
    TreeCheckpoint,
    checkpointed_tasks,
    segment_key,
    spec_fingerprint,
)
from thicket.spec import CheckpointSpec, parse_spec
from thicket.storage import open_store
from thicket.storage.store import LocalStore

SETTINGS = CheckpointSpec(every_calls=2)


def reply(i: int) -> Reply:
    return Reply(text=f"Thought: t{i}\nAction: a{i}", thought=f"t{i}", action=f"a{i}", token_ids=[i, i + 1],
                 logprobs=[-0.5, -0.25], seed=i, temperature=0.7)


def grown(store: LocalStore, fingerprint: str = "spec-a", proposes: int = 6) -> TreeCheckpoint:
    """A checkpoint with `proposes` proposes of one reply each, saved every 2 calls."""
    checkpoint = TreeCheckpoint.load(store, 3, fingerprint, SETTINGS)
    for i in range(proposes):
        asyncio.run(checkpoint.record(f"k{i}", [reply(i)]))
    return checkpoint


def test_replies_come_back_in_the_order_recorded_each_once(tmp_path):
    store = LocalStore(tmp_path)
    grown(store)
    assert sorted(store.list(CHECKPOINTS)) == [segment_key(3, n) for n in range(3)]
    back = TreeCheckpoint.load(store, 3, "spec-a", SETTINGS)
    assert back.loaded_calls == 6 and back.segments == 3
    assert back.take("k4") == [reply(4)]
    assert back.take("k4") is None  # served once
    assert back.unused_calls == 5
    assert {t: sorted(keys) for t, keys in checkpointed_tasks(store).items()} == {3: [segment_key(3, n) for n in range(3)]}


def test_the_same_propose_twice_is_served_in_order(tmp_path):
    store = LocalStore(tmp_path)
    checkpoint = TreeCheckpoint.load(store, 3, "spec-a", SETTINGS)
    asyncio.run(checkpoint.record("same", [reply(1)]))
    asyncio.run(checkpoint.record("same", [reply(2)]))
    back = TreeCheckpoint.load(store, 3, "spec-a", SETTINGS)
    assert [back.take("same"), back.take("same"), back.take("same")] == [[reply(1)], [reply(2)], None]


def test_another_spec_s_checkpoint_is_ignored_with_a_warning_and_deleted(tmp_path, caplog):
    store = LocalStore(tmp_path)
    grown(store, "spec-a")
    with caplog.at_level(logging.WARNING, "thicket.checkpoint"):
        back = TreeCheckpoint.load(store, 3, "spec-b", SETTINGS)
    assert back.loaded_calls == 0 and back.take("k0") is None
    assert "written for another spec" in caplog.text
    assert list(store.list(CHECKPOINTS)) == []  # the next save starts at segment 0


def test_another_version_s_checkpoint_is_ignored(tmp_path, caplog, monkeypatch):
    store = LocalStore(tmp_path)
    monkeypatch.setattr("thicket.rollout.checkpoint.__version__", "0.0.1")
    grown(store)
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, "thicket.checkpoint"):
        assert TreeCheckpoint.load(store, 3, "spec-a", SETTINGS).loaded_calls == 0
    assert "written for another thicket" in caplog.text


@pytest.mark.parametrize("damage", ["garbage", "gap", "another task"])
def test_a_damaged_segment_ends_the_checkpoint_there(tmp_path, caplog, damage):
    store = LocalStore(tmp_path)
    grown(store)
    if damage == "garbage":
        store.put(segment_key(3, 1), b"\x1f\x8b not gzip")
    elif damage == "gap":
        store.delete(segment_key(3, 1))
    else:
        store.put(segment_key(3, 1), _segment_of_task(tmp_path, 7))
    with caplog.at_level(logging.WARNING, "thicket.checkpoint"):
        back = TreeCheckpoint.load(store, 3, "spec-a", SETTINGS)
    assert back.loaded_calls == 2 and back.segments == 1  # segment 0 only
    assert sorted(store.list(CHECKPOINTS)) == [segment_key(3, 0)]
    assert "ignored from there on" in caplog.text
    asyncio.run(back.record("k9", [reply(9)]))
    asyncio.run(back.record("k10", [reply(10)]))
    assert sorted(store.list(CHECKPOINTS)) == [segment_key(3, 0), segment_key(3, 1)]


def _segment_of_task(tmp_path, task: int) -> bytes:
    other = LocalStore(tmp_path / "other")
    checkpoint = TreeCheckpoint.load(other, task, "spec-a", SETTINGS)
    asyncio.run(checkpoint.record("x", [reply(1)]))
    asyncio.run(checkpoint.record("y", [reply(2)]))
    return other.get(segment_key(task, 0))


def test_a_failed_save_keeps_its_replies_for_the_next(tmp_path):
    store = LocalStore(tmp_path)
    checkpoint = TreeCheckpoint.load(store, 3, "spec-a", SETTINGS)
    real_put, attempts = store.put, []

    def failing_put(*args, **kwargs):
        attempts.append(args[0])
        raise OSError("disk full")

    store.put = failing_put  # type: ignore[method-assign]
    for i in range(6):
        asyncio.run(checkpoint.record(f"k{i}", [reply(i)]))
    assert checkpoint.unsaved_calls == 6 and checkpoint.segments == 0
    assert len(attempts) == 1  # tried again every_s later, not at each reply: the tree does not wait on storage
    store.put = real_put  # type: ignore[method-assign]
    assert checkpoint.save()
    back = TreeCheckpoint.load(store, 3, "spec-a", SETTINGS)
    assert [back.take(f"k{i}") for i in range(6)] == [[reply(i)] for i in range(6)]


def test_a_committed_tree_s_segments_are_deleted_those_loaded_and_those_saved_since(tmp_path):
    store = LocalStore(tmp_path)
    grown(store, proposes=4)  # an interrupted run's 2 segments
    resumed = TreeCheckpoint.load(store, 3, "spec-a", SETTINGS)
    asyncio.run(resumed.record("k9", [reply(9)]))
    asyncio.run(resumed.record("k10", [reply(10)]))
    assert resumed.segments == 3
    resumed.discard()
    assert list(store.list(CHECKPOINTS)) == []


def test_storage_down_when_a_committed_tree_s_segments_are_deleted_is_a_warning(tmp_path, caplog):
    store = LocalStore(tmp_path)
    checkpoint = grown(store, proposes=4)

    def down(*args, **kwargs):
        raise OSError("endpoint gone")

    store.list = store.delete = down  # type: ignore[method-assign]
    checkpoint.discard()  # the tree is committed: its leftovers are the next run's scan's to delete
    assert caplog.text.count("could not delete checkpoint") == 2


def test_a_segment_is_a_header_line_and_one_line_per_propose(tmp_path):
    store = LocalStore(tmp_path)
    grown(store, proposes=2)
    lines = gzip.decompress(store.get(segment_key(3, 0))).decode().splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "thicket-checkpoint/1" and header["task"] == 3 and header["segment"] == 0
    assert [json.loads(line)["key"] for line in lines[1:]] == ["k0", "k1"]


def test_the_fingerprint_follows_what_shapes_a_tree_and_nothing_else():
    base = {"name": "fp", "tasks": {"env": "frozenlake", "start": 0, "stop": 4}, "search": {"algorithm": "mcts"},
            "policy": {"kind": "uniform"}, "output": "out"}
    fingerprint = spec_fingerprint(parse_spec(base))
    same = [{**base, "tasks": {**base["tasks"], "stop": 400}}, {**base, "run": {"trees_in_flight": 3}},
            {**base, "policy": {"kind": "uniform", "latency_s": 0.5}}]
    other = [{**base, "seed": 1}, {**base, "search": {"algorithm": "mcts", "iterations": 3}},
             {**base, "tasks": {**base["tasks"], "env_args": {"size": 8}}},
             {**base, "policy": {"kind": "uniform", "temperature": 0.5}}]
    assert all(spec_fingerprint(parse_spec(s)) == fingerprint for s in same)
    assert all(spec_fingerprint(parse_spec(s)) != fingerprint for s in other)


def test_a_stopping_worker_s_saves_give_up_within_its_grace_period(monkeypatch, caplog):
    # Storage down when the pod is preempted: nothing listens at the endpoint. Its calls retry for
    # retry_deadline_s (300 s), past any grace period; a stopping save gives up when it ends.
    use_endpoint(monkeypatch, f"http://127.0.0.1:{free_port()}")
    store = open_store("s3://thicket/sweeps/stopping")
    spec = parse_spec({"name": "stopping", "tasks": {"env": "frozenlake", "start": 0, "stop": 4},
                       "search": {"algorithm": "mcts"}, "policy": {"kind": "uniform"}, "output": "out"})
    growing = GrowingTrees(store, spec)
    checkpoint = growing.trees[3] = TreeCheckpoint(store, 3, growing.fingerprint, CheckpointSpec(every_calls=100))
    asyncio.run(checkpoint.record("k0", [reply(0)]))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        growing.save_all(within_s=2)
    assert time.monotonic() - started < 12
    assert "stopping: saved the checkpoints of 0 of 1 tree(s)" in caplog.text
    assert checkpoint.unsaved_calls == 1  # kept, as any failed save keeps its replies
