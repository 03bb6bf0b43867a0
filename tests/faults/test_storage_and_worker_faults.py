"""Faults on the way to storage: the worker killed mid-shard, S3 down for 20 s, S3 throttling
(with a data file per tree, and with several trees to a file).

Each sweep is a real `thicket run` child process writing to a real S3 server process; after
each fault: every task committed exactly once, and the trees and datasets are those of an
undisturbed run with the same seed.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.harness import (
    NAME,
    assert_each_task_committed_once,
    dataset_fingerprint,
    run_with_fault,
    start_thicket,
    sweep_spec,
    thicket,
    tree_fingerprint,
    undisturbed,
    wait_until,
)
from tests.support.s3_server import Fault, use_endpoint
from thicket.shards.storage import committed_task_ids, iter_shards
from thicket.storage import open_store
from thicket.storage.store import Store

pytestmark = pytest.mark.slow  # the slow tier: `make test-slow` (and CI)

TASKS = list(range(6))


def stored_tasks(store: Store) -> list[int]:
    """The tasks whose trees some data file holds, committed or not."""
    return sorted({t for key in store.list("trees/data/")
                   for t in pq.read_table(pa.BufferReader(store.get(key)), columns=["task"]).column("task").to_pylist()})


@pytest.mark.parametrize("trees_per_shard", [1, 3], ids=["a-file-per-tree", "three-trees-to-a-file"])
def test_worker_killed_mid_shard_leaves_nothing_visible_and_a_rerun_completes(
    tmp_path, s3_server, fault_proxy, aws_env, trees_per_shard
):
    spec = sweep_spec(tmp_path, policy={"latency_s": 0.01}, run={"trees_per_shard": trees_per_shard})
    reference = undisturbed(tmp_path, spec)
    uri = f"s3://{s3_server.make_bucket()}/x/{NAME}"
    release = threading.Event()
    # The second commit marker is held in the proxy: its shard's data is written, its commit is not.
    held = Fault(500, "InternalError", match=lambda method, path: method == "PUT" and "/trees/commits/" in path,
                 every=2, limit=1, hold=release)
    fault_proxy.faults.append(held)
    run = start_thicket("run", str(spec), "--no-aggregate", "--output", uri.removesuffix(f"/{NAME}"),
                        env={**aws_env, "AWS_ENDPOINT_URL": fault_proxy.endpoint})
    try:
        wait_until(lambda: held.injected == 1, 120, "a held commit", run)
        run.kill()  # SIGKILL between the shard's data and its commit marker
        run.wait(timeout=30)
    finally:
        release.set()
        run.kill()
    store = open_store(uri)
    committed = committed_task_ids(store)
    assert set(stored_tasks(store)) > committed  # a shard was half written...
    assert {marker.task for marker, _ in iter_shards(store)} == committed  # ...and no reader sees it
    assert len(committed) < len(TASKS)

    rerun = thicket("run", str(spec), "--no-aggregate", "--output", uri.removesuffix(f"/{NAME}"), env=aws_env)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(TASKS) - len(committed)} grown, {len(committed)} already committed, 0 failed" in rerun.stdout
    assert_each_task_committed_once(uri, TASKS)
    assert (tree_fingerprint(uri), dataset_fingerprint(uri, aws_env)) == reference


@pytest.mark.parametrize("trees_per_shard", [1, 2], ids=["a-file-per-tree", "two-trees-to-a-file"])
def test_s3_down_for_20_s_mid_upload_loses_nothing(tmp_path, persistent_s3, monkeypatch, trees_per_shard):
    aws = use_endpoint(monkeypatch, persistent_s3.endpoint)
    spec = sweep_spec(tmp_path, policy={"latency_s": 0.01}, run={"trees_per_shard": trees_per_shard})
    reference = undisturbed(tmp_path, spec)
    uri = f"s3://{persistent_s3.make_bucket()}/x/{NAME}"

    def down_for_20_s() -> None:
        persistent_s3.kill()
        time.sleep(20)
        persistent_s3.start()

    result = run_with_fault(spec, uri.removesuffix(f"/{NAME}"), down_for_20_s, env=aws)
    assert result.returncode == 0, result.stderr
    assert "0 failed" in result.stdout
    assert "S3 " in result.stderr and "retry" in result.stderr  # the outage is named in the log
    assert_each_task_committed_once(uri, TASKS)
    assert (tree_fingerprint(uri), dataset_fingerprint(uri, aws)) == reference


def test_s3_answering_503_slowdown_loses_nothing(tmp_path, s3_server, fault_proxy, aws_env):
    spec = sweep_spec(tmp_path)
    reference = undisturbed(tmp_path, spec)
    uri = f"s3://{s3_server.make_bucket()}/x/{NAME}"
    fault_proxy.faults.append(Fault(503, "SlowDown", every=3))
    result = thicket("run", str(spec), "--no-aggregate", "--output", uri.removesuffix(f"/{NAME}"),
                     env={**aws_env, "AWS_ENDPOINT_URL": fault_proxy.endpoint})
    assert result.returncode == 0, result.stderr
    assert fault_proxy.injected >= 5
    assert "SlowDown" in result.stderr  # named in the retry log line
    assert_each_task_committed_once(uri, TASKS)
    assert (tree_fingerprint(uri), dataset_fingerprint(uri, aws_env)) == reference
