"""Tree shards' Parquet encodings: read (as aggregation reads them), write and size.

    .venv/bin/python bench/shard_encoding.py                         # synthetic trees (bench/aggregate.py's)
    .venv/bin/python bench/shard_encoding.py --nodes-per-tree 80
    .venv/bin/python bench/shard_encoding.py --shards 'out/demo-textcraft-mcts/trees/data/*.parquet'

Each encoding rewrites the same trees; the best of --repeats rounds is printed, in CPU
microseconds per node on one thread. A shard holds one tree, so the fixed cost per file
and per column chunk weighs more the smaller the trees are.
"""

from __future__ import annotations

import argparse
import glob
import io
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from aggregate import Shape, synthetic_tree

from thicket.aggregate.source import COLUMNS
from thicket.shards.storage import DICTIONARY_COLUMNS, to_parquet

ENCODINGS: dict[str, dict[str, Any]] = {
    "zstd, every dictionary, statistics (before)": {"compression": "zstd"},
    "zstd, some dictionaries, no statistics": {
        "compression": "zstd", "use_dictionary": list(DICTIONARY_COLUMNS), "write_statistics": False},
    "snappy, some dictionaries, no statistics": {
        "compression": "snappy", "use_dictionary": list(DICTIONARY_COLUMNS), "write_statistics": False},
    "uncompressed, some dictionaries, no statistics": {
        "compression": "none", "use_dictionary": list(DICTIONARY_COLUMNS), "write_statistics": False},
    "lz4, some dictionaries, no statistics, Arrow schema stored": {
        "compression": "lz4", "use_dictionary": list(DICTIONARY_COLUMNS), "write_statistics": False},
}


def best_of(repeats: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.thread_time()
        fn()
        best = min(best, time.thread_time() - started)
    return best


def encode(tables: list[pa.Table], options: dict[str, Any] | None) -> list[bytes]:
    if options is None:
        return [to_parquet(t) for t in tables]
    out = []
    for table in tables:
        sink = io.BytesIO()
        pq.write_table(table, sink, **options)
        out.append(sink.getvalue())
    return out


def read_all(files: list[bytes]) -> None:
    for data in files:
        pq.ParquetFile(pa.BufferReader(data)).read(columns=list(COLUMNS), use_threads=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", help="a glob of shard files (default: synthetic trees)")
    parser.add_argument("--trees", type=int, default=200, help="synthetic trees")
    parser.add_argument("--nodes-per-tree", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.shards:
        tables = [pq.read_table(path) for path in sorted(glob.glob(args.shards))]
        if not tables:
            raise SystemExit(f"--shards: no file matches {args.shards}")
    else:
        rng = np.random.default_rng(0)
        tables = [synthetic_tree(rng, task, Shape(nodes_per_tree=args.nodes_per_tree)) for task in range(args.trees)]
    nodes = sum(t.num_rows for t in tables)
    print(f"{len(tables)} trees, {nodes:,} nodes ({nodes / len(tables):.0f} a tree); CPU us per node, best of "
          f"{args.repeats}")
    print(f"  {'encoding':<58}{'read':>7}{'write':>8}{'kB a file':>11}")
    for name, options in [("thicket's (to_parquet)", None), *ENCODINGS.items()]:
        written = best_of(args.repeats, lambda: encode(tables, options))
        files = encode(tables, options)
        read = best_of(args.repeats, lambda: read_all(files))
        size = sum(map(len, files)) / len(files) / 1e3
        print(f"  {name:<58}{read / nodes * 1e6:7.2f}{written / nodes * 1e6:8.2f}{size:11.1f}")


if __name__ == "__main__":
    main()
