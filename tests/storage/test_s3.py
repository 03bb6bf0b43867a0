"""s3:// storage against real servers: moto_server, ministack killed and restarted, a proxy that
injects S3 errors; `thicket run` and `thicket pull` end to end."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest

from tests.support.s3_server import Fault, FaultProxy, S3Server, free_port, use_endpoint
from thicket.pull import pull_sweep
from thicket.shards.storage import (
    CommitStatus,
    committed_tasks,
    iter_shards,
    write_shard,
    write_shards,
)
from thicket.storage import open_store, s3
from thicket.storage.store import LocalStore, Store, StoreConfigError, StoreError

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")
DEMO = "sweeps/demo.yaml"
SWEEP = "demo-textcraft-mcts"
FAST = ("--policy", "uniform", "--no-aggregate", "--no-progress")
MiB = 2**20


def thicket(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [THICKET, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def objects(server: S3Server, bucket: str, prefix: str = "") -> dict[str, tuple[str, object]]:
    """key -> (ETag, LastModified): any rewrite shows."""
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: (o["ETag"], o["LastModified"]) for page in pages for o in page.get("Contents", [])}


def assert_one_copy_per_task(store: Store, tasks: list[int]) -> None:
    markers = committed_tasks(store)
    assert sorted(markers) == tasks
    assert set(store.list("trees/data/")) == {m.data_key for m in markers.values()}  # no orphans
    assert [m.task for m, _ in iter_shards(store)] == tasks  # checksums verified


def tiny_table(task: int, rows: int = 3) -> pa.Table:
    return pa.table({"task": [task] * rows, "node": list(range(rows)), "noise": [uuid.uuid4().hex] * rows})


# -- the store on a real server -----------------------------------------------------------


def test_put_get_list_and_put_if_absent(s3_server, aws_env):
    bucket = s3_server.make_bucket()
    store = open_store(f"s3://{bucket}/runs/a")
    store.check()
    assert store.put("x/1", b"one") is True
    assert store.put("x/1", b"two", if_absent=True) is False and store.get("x/1") == b"one"
    assert store.put("x/2", b"2", if_absent=True) is True
    store.put("y", b"")
    open_store(f"s3://{bucket}/runs/ab").put("x/9", b"a sibling prefix, not ours")
    store.list_page_size = 1  # every key on its own page
    assert list(store.list()) == ["x/1", "x/2", "y"]
    assert list(store.list("x/")) == ["x/1", "x/2"]
    assert store.exists("x/2") and not store.exists("x/3") and store.size("x/1") == 3
    store.delete("x/1")
    store.delete("x/1")
    with pytest.raises(StoreError, match="no object 'x/1'"):
        store.get("x/1")
    with pytest.raises(StoreError, match="escapes"):
        store.put("../z", b"")
    assert sorted(objects(s3_server, bucket)) == ["runs/a/x/2", "runs/a/y", "runs/ab/x/9"]


def test_get_many_keeps_the_order_of_its_keys_and_names_a_missing_one(s3_server, aws_env):
    bucket = s3_server.make_bucket()
    store = open_store(f"s3://{bucket}/many")
    assert store.reads_in_flight > 1
    keys = [f"k/{i:03d}" for i in range(40)]
    for i, key in enumerate(keys):
        store.put(key, str(i).encode() * (1 + i % 7))
    shuffled = random.Random(0).sample(keys, len(keys))
    assert store.get_many(shuffled) == [store.get(key) for key in shuffled]
    with pytest.raises(StoreError, match="no object 'k/nope'"):
        store.get_many([*keys[:20], "k/nope", *keys[20:]])


def test_racing_writers_commit_one_copy_and_leave_no_orphans(s3_server, aws_env):
    bucket = s3_server.make_bucket()
    writers = [open_store(f"s3://{bucket}/race") for _ in range(4)]  # one client each, like pods
    for task in range(3):
        barrier = threading.Barrier(len(writers))

        def write(i: int, task: int = task, barrier: threading.Barrier = barrier) -> CommitStatus:
            barrier.wait()
            return write_shard(writers[i], task, tiny_table(task), f"writer-{i}")

        with ThreadPoolExecutor(len(writers)) as pool:
            statuses = list(pool.map(write, range(len(writers))))
        assert statuses.count(CommitStatus.COMMITTED) == 1, statuses
    assert_one_copy_per_task(writers[0], [0, 1, 2])


def test_slowdown_and_5xx_answers_are_retried(s3_server, fault_proxy: FaultProxy, aws_env, monkeypatch):
    bucket = s3_server.make_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.endpoint)
    fault_proxy.faults += [Fault(503, "SlowDown", every=2), Fault(500, "InternalError", limit=2)]
    store = open_store(f"s3://{bucket}/r")
    assert store.put("a", b"A", if_absent=True) is True
    assert store.put("a", b"B", if_absent=True) is False
    store.put("b", b"B")
    assert store.get("a") == b"A" and list(store.list()) == ["a", "b"] and store.exists("b")
    assert fault_proxy.injected >= 5


def test_a_commit_whose_answer_was_lost_is_still_ours(s3_server, fault_proxy: FaultProxy, aws_env, monkeypatch):
    bucket = s3_server.make_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.endpoint)
    lost = Fault(503, "ServiceUnavailable", limit=2, lose_answer=True, match=lambda method, path: method == "PUT")
    fault_proxy.faults.append(lost)
    store = open_store(f"s3://{bucket}/r")
    assert store.put("marker", b"mine", if_absent=True) is True  # landed, answer lost, retried: 412 on our bytes
    assert store.put("marker", b"theirs", if_absent=True) is False
    assert fault_proxy.injected == 2


def test_a_lost_multipart_upload_sends_the_whole_object_again(s3_server, fault_proxy: FaultProxy, aws_env, monkeypatch):
    monkeypatch.setattr(s3, "MULTIPART_THRESHOLD", 8 * MiB)
    monkeypatch.setattr(s3, "PART_SIZE", 5 * MiB)
    bucket = s3_server.make_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL", fault_proxy.endpoint)
    fault_proxy.faults.append(Fault(404, "NoSuchUpload", limit=1, match=lambda m, p: m == "PUT" and "partNumber=" in p))
    store = open_store(f"s3://{bucket}/r")
    data = os.urandom(12 * MiB)
    store.put("big.bin", data)
    assert hashlib.sha256(store.get("big.bin")).digest() == hashlib.sha256(data).digest()
    starts = [p for m, p in fault_proxy.requests if m == "POST" and "uploads" in p and "uploadId" not in p]
    assert fault_proxy.injected == 1 and len(starts) == 2


# -- thicket run ----------------------------------------------------------------------------


def test_a_partial_run_a_full_run_then_a_rerun_that_writes_nothing(s3_server, aws_env):
    bucket = s3_server.make_bucket()
    out = f"s3://{bucket}/x"
    part = thicket("run", DEMO, *FAST, "--output", out, "--indices", "201-202,204", env=aws_env)
    assert part.returncode == 0 and "tasks        3 (3 grown" in part.stdout, part.stderr
    store = open_store(f"{out}/{SWEEP}")
    assert sorted(committed_tasks(store)) == [201, 202, 204]
    rest = thicket("run", DEMO, *FAST, "--output", out, env=aws_env)
    assert rest.returncode == 0 and "(3 grown, 3 already committed" in rest.stdout, rest.stderr
    assert f"sweep        {out}/{SWEEP}" in rest.stdout
    assert_one_copy_per_task(store, list(range(200, 206)))
    assert store.exists("spec.yaml")
    before = objects(s3_server, bucket)
    again = thicket("run", DEMO, *FAST, "--output", out, env=aws_env)
    assert again.returncode == 0 and "all 6 trees already committed: nothing to grow" in again.stdout, again.stderr
    assert objects(s3_server, bucket) == before


def test_a_run_through_slowdown_answers_completes(s3_server, fault_proxy: FaultProxy, aws_env):
    out = f"s3://{s3_server.make_bucket()}/x"
    fault_proxy.faults.append(Fault(503, "SlowDown", every=2))
    env = {**aws_env, "AWS_ENDPOINT_URL": fault_proxy.endpoint}
    result = thicket("run", DEMO, *FAST, "--output", out, "--indices", "200-202", env=env)
    assert result.returncode == 0 and "(3 grown, 0 already committed, 0 failed" in result.stdout, result.stderr
    assert fault_proxy.injected >= 5
    assert_one_copy_per_task(open_store(f"{out}/{SWEEP}"), [200, 201, 202])


def slow_spec(tmp_path: Path, tasks: int, latency_s: float) -> Path:
    """The demo with the uniform policy sleeping per request, two trees at a time, each
    committed as soon as it is grown (a file per tree), so that faults strike mid-run."""
    text = (ROOT / DEMO).read_text().replace("kind: vllm", f"kind: uniform\n  latency_s: {latency_s}")
    text = text.replace("max_depth: 12", "max_depth: 6")  # small trees: commits come often
    spec = tmp_path / "slow.yaml"
    spec.write_text(text.replace("stop: 206", f"stop: {200 + tasks}") + "run:\n  trees_in_flight: 2\n  trees_per_shard: 1\n")
    return spec


def test_the_server_killed_and_restarted_mid_run_loses_nothing(persistent_s3: S3Server, tmp_path, monkeypatch):
    env = use_endpoint(monkeypatch, persistent_s3.endpoint)
    bucket = persistent_s3.make_bucket()
    out = f"s3://{bucket}/x"
    command = [THICKET, "run", str(slow_spec(tmp_path, 6, 0.04)), *FAST, "--output", out]
    run = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_commits(persistent_s3, bucket, 1)
        persistent_s3.kill()
        time.sleep(1.5)
        persistent_s3.start()
        stdout, stderr = run.communicate(timeout=90)
    finally:
        run.kill()
    assert run.returncode == 0, stderr
    assert "tasks        6 (6 grown, 0 already committed, 0 failed" in stdout
    assert "retry" in stderr  # the outage was hit, and ridden out
    assert_one_copy_per_task(open_store(f"{out}/{SWEEP}"), list(range(200, 206)))


def wait_for_commits(server: S3Server, bucket: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len([k for k in objects(server, bucket) if "/trees/commits/" in k]) < count:
        assert time.monotonic() < deadline, "no commit appeared"
        time.sleep(0.05)


def test_missing_bucket_and_bad_credentials_exit_2_naming_the_bucket(s3_server, s3_auth_server, aws_env, tmp_path):
    missing = thicket("run", DEMO, *FAST, "--output", "s3://no-such-bucket/x", env=aws_env)
    assert missing.returncode == 2
    assert one_line(missing) == (
        f"error: bucket 'no-such-bucket' does not exist at {s3_server.endpoint}: create it or fix output"
    )
    auth_env = {**aws_env, "AWS_ENDPOINT_URL": s3_auth_server.endpoint}  # a server that knows no key
    denied = thicket("run", DEMO, *FAST, "--output", "s3://some-bucket/x", env=auth_env)
    assert denied.returncode == 2
    assert "bucket 'some-bucket'" in one_line(denied) and "InvalidAccessKeyId" in one_line(denied)
    with pytest.raises(StoreConfigError, match="bucket 'no-such-bucket' does not exist"):
        pull_sweep("s3://no-such-bucket/x", tmp_path / "d", progress=False)


def test_an_endpoint_where_nothing_listens_at_start_up_exits_2_naming_it(aws_env, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text((ROOT / DEMO).read_text() + "storage:\n  startup_connect_s: 1\n")
    dead = f"http://127.0.0.1:{free_port()}"
    result = thicket("run", str(spec), *FAST, "--output", "s3://some-bucket/x", env={**aws_env, "AWS_ENDPOINT_URL": dead})
    assert result.returncode == 2
    assert one_line(result).startswith(f"error: AWS_ENDPOINT_URL: nothing answers at {dead} (connection refused, for 1s)")


def test_an_endpoint_gone_mid_run_exits_3_after_the_retry_deadline(persistent_s3: S3Server, tmp_path, monkeypatch):
    env = use_endpoint(monkeypatch, persistent_s3.endpoint)
    bucket = persistent_s3.make_bucket()
    spec = slow_spec(tmp_path, 6, 0.04)
    spec.write_text(spec.read_text() + "storage:\n  retry_deadline_s: 1\n")
    command = [THICKET, "run", str(spec), *FAST, "--output", f"s3://{bucket}/x"]
    run = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_commits(persistent_s3, bucket, 1)
        persistent_s3.kill()  # and it stays down
        stdout, stderr = run.communicate(timeout=90)
    finally:
        run.kill()
    assert run.returncode == 3, stderr
    assert "retry" in stderr  # retried first, as any outage
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "unavailable" in last and "kept failing" in last, stderr


# -- thicket pull ---------------------------------------------------------------------------


@pytest.fixture
def sweep_on_s3(s3_server, aws_env) -> tuple[str, Store]:
    """Five committed shards, an uncommitted one, datasets/ and spec.yaml."""
    uri = f"s3://{s3_server.make_bucket()}/sweeps/one"
    store = open_store(uri)
    for task in range(5):
        write_shard(store, task, tiny_table(task, rows=50 + task), "w")
    store.put("trees/data/task-00000099.0123456789abcdef.parquet", b"never committed")
    store.put("datasets/sft.jsonl", b'{"id": 1}\n' * 100)
    store.put("datasets/report.html", b"<html></html>")
    store.put("spec.yaml", b"name: one\n")
    return uri, store


def local_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_pull_copies_the_committed_objects_verified(sweep_on_s3, aws_env, tmp_path):
    uri, store = sweep_on_s3
    dest = tmp_path / "local"
    result = thicket("pull", uri, str(dest), "--no-progress", env=aws_env)
    assert result.returncode == 0, result.stderr
    assert "pulled 8 objects" in result.stdout and "5 committed shards verified" in result.stdout
    expected = sorted(k for k in store.list() if "task-00000099" not in k)
    assert local_files(dest) == expected and len(expected) == 13
    assert all((dest / key).read_bytes() == store.get(key) for key in expected)
    assert [m.task for m, _ in iter_shards(LocalStore(dest))] == list(range(5))


def test_pull_resumes_and_repairs_what_is_missing_or_damaged(sweep_on_s3, tmp_path):
    uri, _ = sweep_on_s3
    dest = tmp_path / "local"
    assert pull_sweep(uri, dest, progress=False).copied == 8
    shards = sorted((dest / "trees" / "data").iterdir())
    shards[0].unlink()
    shards[1].write_bytes(shards[1].read_bytes()[:-10])
    shards[2].write_bytes(b"x" * shards[2].stat().st_size)  # right size, wrong bytes
    (dest / "datasets" / "sft.jsonl").unlink()
    (dest / "datasets" / ".sft.jsonl.123.tmp").write_bytes(b"left by a killed pull")
    again = pull_sweep(uri, dest, progress=False)
    assert (again.copied, again.skipped, again.shards) == (4, 4, 5)
    assert [m.task for m, _ in iter_shards(LocalStore(dest))] == list(range(5))
    assert pull_sweep(uri, dest, progress=False).copied == 0


def test_pull_refuses_a_corrupted_shard_loudly(sweep_on_s3, aws_env, tmp_path):
    uri, store = sweep_on_s3
    marker = committed_tasks(store)[3]
    data = bytearray(store.get(marker.data_key))
    data[len(data) // 2] ^= 0xFF
    store.put(marker.data_key, bytes(data))
    dest = tmp_path / "local"
    result = thicket("pull", uri, str(dest), "--no-progress", env=aws_env)
    assert result.returncode == 1
    line = one_line(result)
    assert "1 shard failed verification" in line and marker.data_key in line
    assert not (dest / marker.data_key).exists() and not (dest / "trees/commits/task-00000003.json").exists()
    assert sorted(committed_tasks(LocalStore(dest))) == [0, 1, 2, 4]


def test_batch_files_commit_on_s3_and_pull_once_with_all_their_markers(s3_server, aws_env, tmp_path):
    uri = f"s3://{s3_server.make_bucket()}/sweeps/batched"
    store = open_store(uri)
    tables = {task: tiny_table(task, rows=20 + task) for task in range(6)}
    assert write_shard(store, 1, tables[1], "single") is CommitStatus.COMMITTED
    statuses = write_shards(store, [(t, tables[t]) for t in range(5)], "batch")
    assert statuses == {t: CommitStatus.ALREADY_COMMITTED if t == 1 else CommitStatus.COMMITTED for t in range(5)}
    assert write_shards(store, [(1, tables[1]), (2, tables[2])], "late") == {
        1: CommitStatus.ALREADY_COMMITTED, 2: CommitStatus.ALREADY_COMMITTED}
    assert len(list(store.list("trees/data/"))) == 2  # the late batch held no committed tree: deleted
    dest = tmp_path / "local"
    report = pull_sweep(uri, dest, progress=False)
    assert report.copied == 2 and report.shards == 2  # two data files, five markers
    pulled = [(ref.task, table.equals(tables[ref.task])) for ref, table in iter_shards(LocalStore(dest))]
    assert pulled == [(t, True) for t in range(5)]
    assert pull_sweep(uri, dest, progress=False).copied == 0
