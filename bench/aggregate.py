"""Aggregation throughput and memory: synthetic committed shards -> `thicket aggregate`.

    .venv/bin/python bench/aggregate.py                       # 5M nodes (~10k trees of ~500)
    .venv/bin/python bench/aggregate.py --nodes 500000 --keep /tmp/shards
    .venv/bin/python bench/aggregate.py --nodes 500000 --keep /tmp/shards --stages 200
    .venv/bin/python bench/aggregate.py --nodes 500000 --keep /tmp/shards --repeat 5   # the median of 5
    .venv/bin/python bench/aggregate.py --nodes 500000 --from out/demo-textcraft-mcts  # real trees (make demo's)
    .venv/bin/python bench/aggregate.py --nodes 500000 --trees-per-shard 1   # a data file per tree
    .venv/bin/python bench/aggregate.py --nodes 50000 --nodes-per-tree 80 --s3 --reads-in-flight 1

Trees are generated with numpy in TREE_SCHEMA (random shapes, sampled ids with consistent
compressed contexts, some cut by a token, rewards, values, visits, texts) and committed
with write_shards, --trees-per-shard (32, the worker's default) to a data file. The aggregation runs in a child process so its peak RSS is its own.
--stages N adds the CPU time of each stage over the first N trees (in the batches the
aggregation builds at once), on one thread: decoding and the part writer (Parquet encoding,
per dataset) run on background threads in an aggregation, building rows on the main
thread; on 2 cores the rate is bounded by half their sum, and by the largest of the three.
--s3 copies the shards into a local S3 server (moto_server) and aggregates the s3:// URI:
every commit marker and shard is a GET there; --reads-in-flight sets how many the store
keeps in flight (S3Store's default otherwise).
--from SWEEP commits a real sweep's trees again and again under new task ids instead: real
texts, prompts and shapes (make demo's TextCraft trees have ~85 nodes and ~870-token prompts,
where the synthetic ones have 48-token prompts), at scale.
--repeat N aggregates N times and prints the median: on a shared 2-core VM one run's speed
drifts by up to half between minutes.
Goals: >= 200,000 nodes/s on 2 cores, peak RSS < 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from thicket.aggregate.source import BATCH_NODES
from thicket.shards.storage import TREE_SCHEMA, write_shards
from thicket.storage.store import LocalStore


@dataclass(frozen=True)
class Shape:
    nodes_per_tree: int = 500
    max_depth: int = 12
    prompt_tokens: int = 48
    reply_tokens: tuple[int, int] = (6, 16)
    observation_tokens: tuple[int, int] = (6, 16)
    success_share: float = 0.15  # of done leaves


def tree_shape(rng: np.random.Generator, n: int, max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents and depths of a random tree in breadth-first order (1-4 children a node)."""
    parents, depths = [np.array([-1])], [np.array([0])]
    level, size = np.array([0]), 1
    while size < n and len(level):
        depth = depths[-1][0] + 1
        if depth > max_depth:
            break
        kids = rng.choice([0, 1, 2, 3, 4], size=len(level), p=[0.3, 0.15, 0.2, 0.2, 0.15])
        if depth <= 2:
            kids = np.maximum(kids, 2)
        new_parents = np.repeat(level, kids)[: n - size]
        if len(new_parents) == 0:
            break
        parents.append(new_parents)
        depths.append(np.full(len(new_parents), depth))
        level = np.arange(size, size + len(new_parents))
        size += len(new_parents)
    return np.concatenate(parents), np.concatenate(depths)


def lists(values: np.ndarray, lengths: np.ndarray, type_: pa.DataType) -> pa.Array:
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=type_.value_type))


def synthetic_tree(rng: np.random.Generator, task: int, shape: Shape) -> pa.Table:
    parent, depth = tree_shape(rng, shape.nodes_per_tree, shape.max_depth)
    n = len(parent)
    has_kids = np.bincount(parent[1:], minlength=n) > 0
    leaf = ~has_kids
    leaf[0] = False
    reply_len = rng.integers(*shape.reply_tokens, size=n)
    reply_len[0] = 0
    suffix_len = np.where(has_kids, rng.integers(*shape.observation_tokens, size=n), 0)
    suffix_len[0] = shape.prompt_tokens if has_kids[0] else 0
    kept = reply_len - (rng.random(n) < 0.3)  # the template re-renders the last token
    kept[0] = 0
    ctx_len = np.zeros(n, dtype=np.int64)
    prefix = np.full(n, -1, dtype=np.int64)
    prefix[0] = 0
    ctx_len[0] = suffix_len[0]
    for d in range(1, int(depth.max()) + 1):
        at = np.flatnonzero((depth == d) & has_kids)
        prefix[at] = ctx_len[parent[at]] + kept[at]
        ctx_len[at] = prefix[at] + suffix_len[at]
    tokens = rng.integers(0, 150_000, size=int(reply_len.sum()), dtype=np.int32)
    logprobs = -rng.exponential(1.0, size=len(tokens)).astype(np.float32)
    suffix = rng.integers(0, 150_000, size=int(suffix_len.sum()), dtype=np.int32)

    stop = np.where(has_kids, "expanded", np.where(rng.random(n) < 0.8, "done", "depth_limit"))
    done = stop == "done"
    success = done & (rng.random(n) < shape.success_share)
    reward = success.astype(np.float32)
    value = reward.astype(np.float64)
    visits = leaf.astype(np.int64)
    for d in range(int(depth.max()), 0, -1):  # mean of children, bottom up
        at = np.flatnonzero(depth == d)
        sums, counts = np.zeros(n), np.zeros(n)
        np.add.at(sums, parent[at], value[at])
        np.add.at(counts, parent[at], 1)
        np.add.at(visits, parent[at], visits[at])
        up = np.flatnonzero(counts)
        up = up[depth[up] == d - 1]
        value[up] = sums[up] / counts[up]
    actions = np.array(["craft stick", "get 2 planks", "inventory", "craft table", "get 1 log"])
    action = actions[rng.integers(0, len(actions), size=n)]
    reply = [f"Thought: step {i} looks useful.\nAction: {a}" if i else "" for i, a in enumerate(action.tolist())]
    observation = [
        f"Observation: node {i} at depth {d}; you see a crafting table and some logs." for i, d in enumerate(depth.tolist())
    ]
    columns = {
        "sweep": pa.array(["bench"] * n),
        "env": pa.array(["textcraft"] * n),
        "algorithm": pa.array(["mcts"] * n),
        "model": pa.array(["bench-model"] * n),
        "seed": np.zeros(n, np.int64),
        "task": np.full(n, task, np.int64),
        "tree": np.full(n, task, np.int64),
        "node": np.arange(n, dtype=np.int32),
        "parent": parent.astype(np.int32),
        "depth": depth.astype(np.int32),
        "child_index": np.zeros(n, np.int32),
        "label": np.full(n, -1, np.int16),
        "system_prompt": pa.array(["Craft the goal item.\n\nAnswer every turn in exactly this format: ..."] * n),
        "observation": pa.array(observation),
        "user_message": pa.array(observation),
        "num_valid_actions": np.full(n, 5, np.int32),
        "thought": pa.array([""] * n),
        "action": pa.array(np.where(np.arange(n) > 0, action, "").tolist()),
        "reply": pa.array(reply),
        "token_ids": lists(tokens, reply_len, TREE_SCHEMA.field("token_ids").type),
        "logprobs": lists(logprobs, reply_len, TREE_SCHEMA.field("logprobs").type),
        "action_token_start": np.full(n, -1, np.int32),
        "context_prefix_len": prefix.astype(np.int32),
        "context_suffix_ids": lists(suffix, suffix_len, TREE_SCHEMA.field("context_suffix_ids").type),
        "prompt_tokens": ctx_len.astype(np.int32),
        "cached_tokens": (ctx_len * 0.8).astype(np.int32),
        "finish_reason": pa.array(["stop"] * n),
        "constrained": rng.random(n) < 0.1,
        "temperature": np.ones(n, np.float32),
        "sample_seed": np.arange(n, dtype=np.int64),
        "reward": reward,
        "done": done,
        "success": success,
        "terminal": leaf,
        "stop_reason": pa.array(stop.tolist()),
        "value": value.astype(np.float32),
        "visits": visits.astype(np.int32),
        "llm_ms": np.zeros(n, np.float32),
        "env_ms": np.zeros(n, np.float32),
        "llm_calls": np.bincount(parent[1:], minlength=n).astype(np.int32),  # a call per child
        "llm_tokens": np.bincount(parent[1:], weights=reply_len[1:], minlength=n).astype(np.int32),
    }
    return pa.table(columns, schema=TREE_SCHEMA)


def commit_trees(folder: str, tree: Callable[[int], pa.Table], total_nodes: int, per_shard: int) -> tuple[int, int]:
    """Trees tree(0), tree(1), ... committed until they hold total_nodes, per_shard to a data file."""
    store = LocalStore(folder)
    nodes = trees = 0
    batch: list[tuple[int, pa.Table]] = []
    while nodes < total_nodes:
        batch.append((trees, tree(trees)))
        nodes += batch[-1][1].num_rows
        trees += 1
        if len(batch) == per_shard or nodes >= total_nodes:
            write_shards(store, batch, "bench")
            batch = []
    return trees, nodes


def generate(folder: str, total_nodes: int, shape: Shape, per_shard: int = 1, seed: int = 0) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    return commit_trees(folder, lambda task: synthetic_tree(rng, task, shape), total_nodes, per_shard)


def replicate(source: str, folder: str, total_nodes: int, per_shard: int = 1) -> tuple[int, int]:
    """A sweep's committed trees, committed again under new task ids (its spec copied),
    over and over until they hold total_nodes: the aggregation of real trees at scale."""
    from thicket.shards.storage import iter_shards

    origin = LocalStore(source)
    tables = [table for _, table in iter_shards(origin)]
    if not tables:
        raise SystemExit(f"{source}: no committed trees there (expected the folder of a sweep that ran)")
    if origin.exists("spec.yaml"):
        LocalStore(folder).put("spec.yaml", origin.get("spec.yaml"))

    def tree(task: int) -> pa.Table:
        table = tables[task % len(tables)]
        ids = pa.array(np.full(table.num_rows, task, np.int64))
        for name in ("task", "tree"):
            table = table.set_column(table.schema.get_field_index(name), name, ids)
        return table

    return commit_trees(folder, tree, total_nodes, per_shard)


def aggregate_only(folder: str, workers: int | None, batch_nodes: int, reads_in_flight: int) -> None:
    from thicket.aggregate.driver import aggregate
    from thicket.storage.s3 import S3Store

    if reads_in_flight > 0:
        S3Store.reads_in_flight = reads_in_flight

    started = time.perf_counter()
    result = aggregate(folder, workers=workers, batch_nodes=batch_nodes)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "rows": result.rows, "nodes": result.stats["nodes"]}))


def stages(folder: str, trees: int) -> None:
    """CPU microseconds per node of each aggregation stage over the first `trees` trees."""
    from thicket.aggregate import dpo, revision, sft, stats, tokens
    from thicket.aggregate.chats import Chats
    from thicket.aggregate.driver import DATASET_SCHEMAS, Job, build_forest
    from thicket.aggregate.params import DatasetsSpec
    from thicket.aggregate.source import batches, decode, fetch
    from thicket.aggregate.writer import DatasetWriter
    from thicket.shards.storage import committed_shards

    class Unwritten(ThreadPoolExecutor):  # the writers' parts are encoded below, on their own
        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            done: Future[Any] = Future()
            done.set_result(None)
            return done

    store = LocalStore(folder)
    groups = list(fetch(store, batches(committed_shards(store)[:trees])))
    nodes = sum(marker.rows for shards in groups for marker, _ in shards)
    params = DatasetsSpec()
    spent: dict[str, float] = {}

    def timed(stage: str, fn: Callable[..., Any], *args: Any) -> Any:
        started = time.thread_time()
        out = fn(*args)
        spent[stage] = spent.get(stage, 0.0) + time.thread_time() - started
        return out

    forests = [timed("decode (background)", decode, shards) for shards in groups]
    for forest in forests:
        timed("stats", stats.SweepStats().add, forest)
        chats = Chats(forest)
        timed("sft", sft.sft_tables, forest, params.sft, chats)
        timed("dpo", dpo.dpo_tables, forest, params.dpo, chats)
        timed("revision", revision.revision_table, forest, params.revision, None, chats)
        timed("tokens", tokens.token_rows, forest)
    outputs = [build_forest(Job(params), decode(shards)) for shards in groups]
    unwritten = Unwritten()
    writers = {name: DatasetWriter(store, name, s, e, pool=unwritten) for name, (s, e) in DATASET_SCHEMAS.items()}
    for output in outputs:
        for name, table in output.tables.items():
            timed("add rows (background)", writers[name].add, table)
    for name, (_, encoding) in DATASET_SCHEMAS.items():
        tables = [o.tables[name] for o in outputs if name in o.tables]
        if tables:
            table = pa.concat_tables(tables).combine_chunks()
            for start in range(0, table.num_rows, writers[name].max_rows):
                timed(f"encode {name} (background)", encoding.parquet, table.slice(start, writers[name].max_rows))
    building = sum(t for stage, t in spent.items() if "background" not in stage)
    print(f"stages over {nodes:,} nodes ({sum(map(len, groups))} trees), CPU us per node on one thread:")
    for stage, seconds in [*spent.items(), ("building rows, all", building), ("all", sum(spent.values()))]:
        print(f"  {stage:<32}{seconds / nodes * 1e6:7.2f}")


def copy_to_s3(folder: str, endpoint: str) -> str:
    """The sweep folder's spec and trees in a new bucket of the S3 server at `endpoint`."""
    from thicket.storage.s3 import S3Store
    from thicket.storage.store import StorageSettings

    uri = "s3://bench-aggregate/sweep"
    S3Store(uri, StorageSettings(endpoint_url=endpoint)).client.create_bucket(Bucket="bench-aggregate")
    store = S3Store(uri, StorageSettings(endpoint_url=endpoint))
    keys = [os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(os.path.join(folder, "trees")) for f in fs]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: store.put(key, open(os.path.join(folder, key), "rb").read()), keys))
    return uri


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (Linux /proc)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def run_measured(command: list[str]) -> tuple[str, int, float]:
    """Run `command`; return its stdout, the peak RSS of its process tree, its CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_rss(child.pid))
        time.sleep(0.05)
    out = child.stdout.read() if child.stdout else ""
    if child.returncode:
        raise SystemExit(f"aggregation failed with exit code {child.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out, peak, cpu


@dataclass(frozen=True)
class Run:
    report: dict[str, Any]
    peak: int
    cpu: float

    @property
    def rate(self) -> float:
        return self.report["nodes"] / self.report["seconds"]


def measured_run(command: list[str]) -> Run:
    """One aggregation in a child process, its figures printed."""
    out, peak, cpu = run_measured(command)
    run = Run(json.loads(out.strip().splitlines()[-1]), peak, cpu)
    nodes = run.report["nodes"]
    print(f"aggregated {nodes:,} nodes in {run.report['seconds']:.1f} s: {run.rate:,.0f} nodes/s "
          f"(goal >= 200,000 on 2 cores); peak RSS {peak / 2**20:,.0f} MB, all processes (goal < 1,024 MB); "
          f"{cpu:.1f} CPU s ({nodes / cpu:,.0f} nodes per CPU s); load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5_000_000, help="total nodes to generate")
    parser.add_argument("--nodes-per-tree", type=int, default=500)
    parser.add_argument("--keep", help="generate into (or reuse) this folder instead of a temp dir")
    parser.add_argument("--workers", type=int, default=-1, help="aggregation processes (-1: automatic, 0: inline)")
    parser.add_argument("--stages", type=int, default=0, help="also time each stage over this many trees")
    parser.add_argument("--batch-nodes", type=int, default=BATCH_NODES, help="nodes of the trees built at once")
    parser.add_argument("--s3", action="store_true", help="aggregate from a local S3 server (moto_server)")
    parser.add_argument("--reads-in-flight", type=int, default=0, help="S3 gets in flight (0: the store's default)")
    parser.add_argument("--from", dest="source", metavar="SWEEP",
                        help="replicate this sweep folder's trees (e.g. out/demo-textcraft-mcts) instead of synthetic ones")
    parser.add_argument("--trees-per-shard", type=int, default=32,
                        help="trees committed to one data file (the worker's run.trees_per_shard; 1: a file each)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="aggregate this many times; prints each run and the median (this machine's speed drifts)")
    parser.add_argument("--aggregate-only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.aggregate_only:
        workers = None if args.workers < 0 else args.workers
        return aggregate_only(args.aggregate_only, workers, args.batch_nodes, args.reads_in_flight)

    folder = args.keep or tempfile.mkdtemp(prefix="thicket-bench-")
    try:
        if os.path.isdir(os.path.join(folder, "trees")):
            print(f"reusing shards in {folder}")
        else:
            started = time.perf_counter()
            if args.source:
                trees, nodes = replicate(args.source, folder, args.nodes, args.trees_per_shard)
            else:
                trees, nodes = generate(folder, args.nodes, Shape(nodes_per_tree=args.nodes_per_tree),
                                        args.trees_per_shard)
            print(f"{'replicated' if args.source else 'generated'} {trees} trees, {nodes:,} nodes in {time.perf_counter() - started:.1f} s -> {folder}")
        source, server = folder, None
        if args.s3:
            from s3_upload import CREDENTIALS, start_moto

            server, endpoint = start_moto()
            os.environ.update(CREDENTIALS | {"AWS_ENDPOINT_URL": endpoint})
            started = time.perf_counter()
            source = copy_to_s3(folder, endpoint)
            print(f"copied the shards to {source} at {endpoint} in {time.perf_counter() - started:.1f} s")
        command = [sys.executable, __file__, "--aggregate-only", source, "--workers", str(args.workers),
                   "--batch-nodes", str(args.batch_nodes), "--reads-in-flight", str(args.reads_in_flight)]
        try:
            runs = [measured_run(command) for _ in range(max(1, args.repeat))]
        finally:
            if server is not None:
                server.kill()
                server.wait()
        report = runs[-1].report
        if len(runs) > 1:
            rates = sorted(run.rate for run in runs)
            print(f"median of {len(runs)} runs: {statistics.median(rates):,.0f} nodes/s "
                  f"(slowest {rates[0]:,.0f}, fastest {rates[-1]:,.0f}); "
                  f"peak RSS at most {max(run.peak for run in runs) / 2**20:,.0f} MB")
        print("rows: " + ", ".join(f"{k} {v:,}" for k, v in sorted(report["rows"].items())))
        if not args.s3:
            out = os.path.join(folder, "datasets")
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
            print(f"datasets: {size / 1e6:,.0f} MB under {out}")
        if args.stages:
            stages(folder, args.stages)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
