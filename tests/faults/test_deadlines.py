"""Deadlines per task and per index: what was grown is stored with the stop reason `timeout`,
never as a finished tree, and a rerun finishes what the index deadline left."""

from __future__ import annotations

import pytest

import time

import pyarrow.compute as pc

from tests.support.harness import (
    NAME,
    assert_each_task_committed_once,
    sweep_spec,
    thicket,
    trees,
)
from thicket.shards.storage import committed_task_ids
from thicket.storage import open_store

pytestmark = pytest.mark.slow  # the slow tier: `make test-slow` (and CI)

SLOW = {"latency_s": 0.05, "concurrency": 2}
BIG = {"iterations": 400, "expansions": 3, "max_depth": 12, "max_nodes": 100_000}


def test_a_task_past_its_deadline_is_stored_as_timed_out(tmp_path):
    spec = sweep_spec(tmp_path, count=2, policy=SLOW, search=BIG, run={"task_timeout_s": 1.5})
    result = thicket("run", str(spec), "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "2 timed out" in result.stdout and "task timeout (1.5 s) reached" in result.stderr
    uri = str(tmp_path / "out" / NAME)
    assert_each_task_committed_once(uri, [0, 1])
    table = trees(uri)
    leaves = table.filter(pc.equal(table.column("terminal"), True))
    assert "timeout" in leaves.column("stop_reason").to_pylist()
    timed_out = leaves.filter(pc.equal(leaves.column("stop_reason"), "timeout"))
    assert not any(timed_out.column("success").to_pylist())


def test_the_index_deadline_stores_growing_trees_leaves_the_rest_and_exits_4(tmp_path):
    spec = sweep_spec(tmp_path, count=6, policy=SLOW, search=BIG, run={"index_timeout_s": 2, "trees_in_flight": 2})
    out = tmp_path / "out"
    started = time.monotonic()
    result = thicket("run", str(spec), "--output", str(out))
    assert time.monotonic() - started < 60
    assert result.returncode == 4, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the index deadline passed with 4 task(s) not run")
    assert "2 timed out, 4 not run" in result.stdout
    uri = str(out / NAME)
    assert committed_task_ids(open_store(uri)) == {0, 1}  # the two growing at the deadline, stored

    quick = sweep_spec(tmp_path, count=6, policy=SLOW, search={"iterations": 4})
    rerun = thicket("run", str(quick), "--output", str(out), "--allow-spec-change")  # a smaller search to finish
    assert rerun.returncode == 0, rerun.stderr
    assert "4 grown, 2 already committed" in rerun.stdout
    assert_each_task_committed_once(uri, list(range(6)))
