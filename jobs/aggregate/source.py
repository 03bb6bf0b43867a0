"""Committed trees, in batches of consecutive trees (forests), reading only the columns
aggregation needs.

The same checks as thicket.shards.storage.read_shard (SHA-256 and the tree's rows against
what was committed). Bytes are fetched through the Store on a background thread; checks,
Parquet decoding and a batch's concatenation (which mostly release the GIL) run on
another (inline), or in the worker process that builds the batch's rows.
Batches depend only on the committed shards (their row counts), so every run cuts the same ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from thicket.aggregate.forest import Forest, MalformedShard
from thicket.errors import BadInput
from thicket.shards.storage import TREE_SCHEMA, ShardRef, decode_data, tree_rows
from thicket.storage.store import Store

COLUMNS = (
    "env",
    "algorithm",
    "task",
    "tree",
    "node",
    "parent",
    "depth",
    "system_prompt",
    "user_message",
    "reply",
    "token_ids",
    "logprobs",
    "context_prefix_len",
    "context_suffix_ids",
    "prompt_tokens",
    "cached_tokens",
    "constrained",
    "temperature",
    "prefill_start",
    "prefill_len",
    "reward",
    "path_return",
    "reward_semantics",
    "data_source",
    "deterministic",
    "success",
    "stop_reason",
    "value",
    "visits",
    "action",
    "llm_calls",
    "llm_tokens",
    "resumed_llm_calls",
    "resumed",
)
LATER_COLUMNS = ("llm_calls", "llm_tokens", "path_return", "reward_semantics", "data_source", "deterministic",
                 "prefill_start", "prefill_len", "resumed_llm_calls", "resumed")  # absent from older shards: read as nulls
# Read as dictionaries: the system prompt is the same long text on every row of a tree, and
# decoding it to plain strings (then concatenating them into a forest) was most of the
# reading time of real trees.
DICTIONARIES = ("system_prompt",)
BATCH_NODES = 8_192  # nodes per forest at most (a tree larger than that: alone)

Shard = tuple[ShardRef, bytes]


def batches(refs: list[ShardRef], max_nodes: int = BATCH_NODES) -> list[list[ShardRef]]:
    """Consecutive shards, as many as hold max_nodes rows (at least one)."""
    out: list[list[ShardRef]] = []
    rows = max_nodes
    for ref in refs:
        if rows + ref.rows > max_nodes:
            out.append([])
            rows = 0
        out[-1].append(ref)
        rows += ref.rows
    return out


def fetch(store: Store, groups: list[list[ShardRef]], prefetch: int = 2) -> Iterator[list[Shard]]:
    """Each batch's shards' bytes, in order; the next `prefetch` batches are fetched on a
    background thread (a batch's shards with the store's reads in flight together)."""

    with ThreadPoolExecutor(1, thread_name_prefix="fetch-shards") as pool:
        pending: deque[Future[list[Shard]]] = deque()
        for group in groups:
            pending.append(pool.submit(shards_of, store, group))
            if len(pending) > prefetch:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def shards_of(store: Store, group: list[ShardRef]) -> list[Shard]:
    """The group's trees' data files' bytes, with the store's reads in flight together (a
    batch file once for all of its trees)."""
    keys = list(dict.fromkeys(ref.data_key for ref in group))
    files = dict(zip(keys, store.get_many(keys)))
    return [(ref, files[ref.data_key]) for ref in group]


def forests(store: Store, groups: list[list[ShardRef]], ahead: int = 2) -> Iterator[Forest]:
    """Every group of trees (see batches) as a Forest, in order, decoded on a background
    thread up to `ahead` forests ahead of the caller."""
    with ThreadPoolExecutor(1, thread_name_prefix="decode-shards") as pool:
        pending: deque[Future[Forest]] = deque()
        for shards in fetch(store, groups):
            pending.append(pool.submit(decode, shards))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def decode(shards: list[Shard]) -> Forest:
    """The shards' trees, checked, as one forest (each data file decoded once)."""
    files: dict[str, pa.Table] = {}
    tables = []
    for ref, data in shards:
        if ref.data_key not in files:
            files[ref.data_key] = read(ref, data)
        tables.append(tree_rows(files[ref.data_key], ref))
    try:
        return Forest.of(tables)
    except MalformedShard as err:
        raise BadInput(f"shard {shards[err.index][0].data_key}: {err}") from None


def read(ref: ShardRef, data: bytes) -> pa.Table:
    """The columns aggregation reads of a committed tree's data file (all its trees)."""
    try:
        table = decode_data(ref, data, COLUMNS, DICTIONARIES)
    except (KeyError, pa.ArrowInvalid) as err:
        raise BadInput(f"shard {ref.data_key}: {err}") from None
    for name in LATER_COLUMNS:  # a column the file lacks is left out of what pyarrow reads
        if name not in table.column_names:
            field = TREE_SCHEMA.field(name)
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table
