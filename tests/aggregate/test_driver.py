"""`thicket aggregate`'s driver: bounded parts, a manifest written last, idempotence (also with
worker processes, from S3), shards of an earlier encoding or in batch files, spec parameters."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import thicket.shards.storage as shards
from tests.support.random_trees import dataset_rows, files_under, synthetic_sweep
from thicket.aggregate.driver import TreeOutput, aggregate
from thicket.aggregate.params import DatasetsSpec, SFTParams
from thicket.aggregate.report import TaskRow
from thicket.aggregate.stats import SweepStats
from thicket.errors import BadInput
from thicket.shards.storage import CommitStatus, commit_key, iter_shards, read_marker, write_shard, write_shards
from thicket.spec import parse_spec
from thicket.storage import open_store
from thicket.storage.store import LocalStore


# ---- the driver: parts, manifest, idempotence, spec parameters ------------------------------


def test_aggregation_writes_bounded_parts_a_manifest_last_and_is_idempotent(tmp_path):
    sweep = synthetic_sweep(tmp_path, datasets={"dpo": {"max_trajectory_pairs_per_task": 1}})
    (sweep / "datasets" / "old").mkdir(parents=True)
    (sweep / "datasets" / "old" / "part-00000.parquet").write_bytes(b"stale")
    result = aggregate(str(sweep), max_rows=7)
    out = sweep / "datasets"
    assert not (out / "old" / "part-00000.parquet").exists()
    manifest = json.loads((out / "_SUCCESS.json").read_text())
    assert manifest["params"]["dpo"]["max_trajectory_pairs_per_task"] == 1
    listed = {f["path"] for f in manifest["files"]}
    assert listed == set(files_under(out)) - {"_SUCCESS.json"}
    for f in manifest["files"]:
        data = (out / f["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
        if f["path"].endswith(".parquet"):
            assert pq.read_metadata(out / f["path"]).num_rows == f["rows"] <= 7
    for name, rows in result.rows.items():
        assert rows == sum(f.get("rows", 0) for f in manifest["files"] if f["path"].startswith(name + "/"))
    assert result.rows["tokens"] > 7 and result.rows["dpo"] > 0 and result.rows["sft"] > 0
    dpo = [r for p in sorted(out.glob("dpo/*.parquet")) for r in pq.read_table(p).to_pylist()]
    per_task = {}
    for r in dpo:
        per_task[r["task"]] = per_task.get(r["task"], 0) + (r["kind"] == "trajectory")
    assert max(per_task.values()) <= 1
    stats = json.loads((out / "stats.json").read_text())
    assert stats["trees"] == 12 and stats["datasets"] == dict(sorted(result.rows.items()))
    page = (out / "report.html").read_text()
    assert "<svg" in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing to fetch
    first = files_under(out)
    aggregate(str(sweep), max_rows=7)
    assert files_under(out) == first
    aggregate(str(sweep), max_rows=7, workers=2)  # worker processes build the same rows
    assert files_under(out) == first
    rows = dataset_rows(out)
    small = {"max_rows": 50, "max_bytes": 3_000}  # parts cut by Arrow bytes, which depend on the layout
    aggregate(str(sweep), **small)
    inline = files_under(out)
    assert inline != first
    aggregate(str(sweep), **small, workers=1)
    assert files_under(out) == inline
    many = {**small, "batch_nodes": 100}  # many forests: each tree's rows in the same order
    aggregate(str(sweep), **many)
    inline = files_under(out)
    aggregate(str(sweep), **many, workers=2)
    assert files_under(out) == inline
    assert dataset_rows(out) == rows and json.loads((out / "stats.json").read_text()) == stats


def test_shards_of_an_earlier_encoding_aggregate_beside_current_ones(tmp_path, monkeypatch):
    """A sweep resumed after an upgrade holds shards of both encodings (the earlier: zstd,
    every column a dictionary, statistics and the Arrow schema stored)."""
    current = synthetic_sweep(tmp_path / "current")
    aggregate(str(current))

    def earlier_encoding(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue().to_pybytes()

    mixed = tmp_path / "mixed"
    shutil.copytree(current, mixed)
    shutil.rmtree(mixed / "datasets")
    store = LocalStore(mixed)
    monkeypatch.setattr(shards, "to_parquet", earlier_encoding)
    for task in range(0, 12, 2):  # every other task rewritten the earlier way
        marker = read_marker(store, task)
        table = shards.read_shard(store, marker)
        store.delete(commit_key(task))
        store.delete(marker.data_key)
        write_shard(store, task, table, "earlier")
        assert read_marker(store, task).data_key != marker.data_key  # other bytes
    monkeypatch.undo()
    aggregate(str(mixed))
    assert dataset_rows(mixed / "datasets") == dataset_rows(current / "datasets")


def test_trees_in_batch_files_aggregate_as_trees_in_their_own_files(tmp_path):
    """The same trees, one data file each or several to a file (in batches whose tasks
    interleave across the aggregation's forests), give the same datasets."""
    single = synthetic_sweep(tmp_path / "single")
    batched = tmp_path / "batched"
    store = LocalStore(batched)
    store.put("spec.yaml", (single / "spec.yaml").read_bytes())
    trees = [(ref.task, table) for ref, table in iter_shards(LocalStore(single))]
    for batch in ([0, 5, 11], [1, 2, 3, 4], [6], [7, 8, 9, 10]):
        assert set(write_shards(store, [trees[t] for t in batch], "w").values()) == {CommitStatus.COMMITTED}
    assert len(list(store.list("trees/data/"))) == 4
    for options in ({}, {"batch_nodes": 100}, {"batch_nodes": 100, "workers": 2}):
        aggregate(str(single), **options)
        aggregate(str(batched), **options)
        parts = {k: v for k, v in files_under(single / "datasets").items() if k.endswith(".parquet")}
        assert parts == {k: v for k, v in files_under(batched / "datasets").items() if k.endswith(".parquet")}
        assert len(parts) >= 5


def test_worker_processes_fetch_their_own_shards_from_s3(tmp_path, s3_server, aws_env):
    """S3Store pickles as its URI and settings: each worker process opens its own client."""
    local = synthetic_sweep(tmp_path)
    aggregate(str(local))
    uri = f"s3://{s3_server.make_bucket('agg')}/synthetic"
    store = open_store(uri)
    for path in sorted(local.rglob("*")):
        key = path.relative_to(local).as_posix()
        if path.is_file() and not key.startswith("datasets/"):
            store.put(key, path.read_bytes())
    aggregate(uri, workers=2, batch_nodes=100)  # many forests, each fetched by a worker
    parts = {key: store.get(key) for key in store.list("datasets/") if key.endswith(".parquet")}
    expected = {f"datasets/{k}": v for k, v in files_under(local / "datasets").items() if k.endswith(".parquet")}
    assert len(parts) >= 5 and parts == expected


def test_tables_from_worker_processes_keep_their_arrow_layout():
    texts = pa.array(["a", None, "ccc"]).take(pa.array([2, 0, 0]))  # a bitmap without nulls
    messages = pa.ListArray.from_arrays(pa.array([0, 1, 3], pa.int32()), pa.StructArray.from_arrays([texts], ["c"]))
    table = pa.table({"messages": messages, "texts": texts.take(pa.array([1, 2])), "n": [1, 2]})
    rows = [TaskRow(7, 3, 1, 0.5, 12)]
    sent = TreeOutput({"x": table}, SweepStats(), {}, rows)
    received = pickle.loads(pickle.dumps(sent))
    back = received.tables["x"]
    assert received.tasks == rows
    assert back.equals(table) and back.schema == table.schema
    assert back.nbytes == table.nbytes != pickle.loads(pickle.dumps(table)).nbytes
    assert pa.concat_tables([back, back]).combine_chunks().nbytes == pa.concat_tables([table, table]).combine_chunks().nbytes


def test_cli_flags_override_the_spec_and_bad_parameters_are_one_line_errors(tmp_path):
    sweep = synthetic_sweep(tmp_path, tasks=3, datasets={"revision": {"alpha": 0.9}})
    result = aggregate(str(sweep), {"revision": {"alpha": 0.1, "beta": None}})
    manifest = json.loads((sweep / "datasets" / "_SUCCESS.json").read_text())
    assert manifest["params"]["revision"] == {"alpha": 0.1, "beta": 0.5, "max_per_task": 4}
    assert result.stats["trees"] == 3
    with pytest.raises(BadInput, match="datasets.dpo.beta"):
        aggregate(str(sweep), {"dpo": {"beta": -1}})
    with pytest.raises(BadInput, match="no committed trees"):
        aggregate(str(tmp_path / "nothing"))
    spec = {"name": "a", "tasks": {"env": "frozenlake", "stop": 2}, "search": {"algorithm": "mcts"},
            "policy": {"kind": "uniform"}, "output": "o"}
    assert parse_spec({**spec, "datasets": {"sft": {"min_reward": 1.0}}}).datasets == DatasetsSpec(sft=SFTParams(min_reward=1.0))
    with pytest.raises(BadInput, match="datasets.sft.typo"):
        parse_spec({**spec, "datasets": {"sft": {"typo": 1}}})
