"""Tree shards: one Parquet file per tree, one row per node, committed atomically.

Layout under a sweep's URI:
    trees/data/task-00000042.<sha256>.<rows>.parquet   the data, written first
    trees/commits/task-00000042.json                    the commit marker, put-if-absent
Readers only see committed tasks, so a half-written or losing shard is never seen; the
marker holds the data key, its SHA-256 and its row count. The data key says the same,
so a reader of many shards needs two listings and no marker reads, except for a
task with more than one data object (see committed_shards). Earlier sweeps named data
task-00000042.<sha16>.parquet; their markers are read.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from enum import StrEnum

import pyarrow as pa
import pyarrow.parquet as pq

from thicket.storage.store import Store, StoreError

COMMITS = "trees/commits/"
DATA = "trees/data/"

TREE_SCHEMA = pa.schema(
    [
        ("sweep", pa.string()),
        ("env", pa.string()),
        ("algorithm", pa.string()),
        ("model", pa.string()),
        ("seed", pa.int64()),
        ("task", pa.int64()),
        ("tree", pa.int64()),
        ("node", pa.int32()),
        ("parent", pa.int32()),  # -1 at the root
        ("depth", pa.int32()),
        ("child_index", pa.int32()),
        ("label", pa.int16()),  # dense search's child label, else -1
        ("system_prompt", pa.string()),  # the system message (same on every row of a tree)
        ("observation", pa.string()),
        ("user_message", pa.string()),  # the observation as the model saw it (a user turn)
        ("num_valid_actions", pa.int32()),  # -1: the env has no list
        ("thought", pa.string()),
        ("action", pa.string()),
        ("reply", pa.string()),  # the assistant message as it entered the history
        ("token_ids", pa.list_(pa.int32())),  # sampled ids of the reply
        ("logprobs", pa.list_(pa.float32())),  # aligned with token_ids
        ("action_token_start", pa.int32()),
        # The prompt this node's children are sampled from, as token ids:
        # ctx(node) = (ctx(parent) + token_ids(node))[:context_prefix_len] + context_suffix_ids
        ("context_prefix_len", pa.int32()),  # -1: never sent (a leaf)
        ("context_suffix_ids", pa.list_(pa.int32())),
        ("prompt_tokens", pa.int32()),
        ("cached_tokens", pa.int32()),  # null: the server did not say
        ("finish_reason", pa.string()),
        ("constrained", pa.bool_()),
        ("temperature", pa.float32()),
        ("sample_seed", pa.int64()),
        ("reward", pa.float32()),
        ("done", pa.bool_()),
        ("success", pa.bool_()),
        ("terminal", pa.bool_()),
        ("stop_reason", pa.string()),
        ("value", pa.float32()),
        ("visits", pa.int32()),
        ("llm_ms", pa.float32()),
        ("env_ms", pa.float32()),
    ]
)


class CommitStatus(StrEnum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"  # another writer (or an earlier run) won


@dataclass(frozen=True)
class CommitMarker:
    task: int
    data_key: str
    sha256: str
    rows: int
    bytes: int
    writer: str
    committed_at: float

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CommitMarker:
        return cls(**json.loads(data))

    @property
    def ref(self) -> ShardRef:
        return ShardRef(self.task, self.data_key, self.sha256, self.rows)


@dataclass(frozen=True)
class ShardRef:
    """What a reader needs of a committed shard."""

    task: int
    data_key: str
    sha256: str
    rows: int


def commit_key(task: int) -> str:
    return f"{COMMITS}task-{task:08d}.json"


def data_key(task: int, sha256: str, rows: int) -> str:
    return f"{DATA}task-{task:08d}.{sha256}.{rows}.parquet"


_TASK_OF_DATA = re.compile(rf"^{DATA}task-(\d+)\.")
_SHA_AND_ROWS = re.compile(r"\.([0-9a-f]{64})\.(\d+)\.parquet$")  # after the task, in current data keys


# Columns whose values repeat within a tree; token ids and free texts hardly do, and
# dictionary pages on them cost reading time for nothing.
DICTIONARY_COLUMNS = ("sweep", "env", "algorithm", "model", "system_prompt", "action", "finish_reason", "stop_reason")


def to_parquet(table: pa.Table) -> bytes:
    """A tree's Parquet file. A shard is small (one tree), so a reader's fixed costs per
    file and per column chunk dominate: lz4 rather than zstd (which sets up a decoder per
    page), dictionaries only on repeated columns, no statistics (nothing filters shards)
    and no stored Arrow schema more than halve aggregation's decoding and the worker's
    encoding, at about the same bytes (bench/shard_encoding.py)."""
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression="lz4",
        use_dictionary=list(DICTIONARY_COLUMNS),
        write_statistics=False,
        store_schema=False,  # TREE_SCHEMA maps 1:1 onto Parquet types; parsing it cost a third of opening
    )
    return sink.getvalue()


def write_shard(store: Store, task: int, table: pa.Table, writer: str) -> CommitStatus:
    """Data first, then the commit marker (put-if-absent): exactly one copy is committed."""
    data = to_parquet(table)
    digest = hashlib.sha256(data).hexdigest()
    key = data_key(task, digest, table.num_rows)
    store.put(key, data)
    marker = CommitMarker(task, key, digest, table.num_rows, len(data), writer, time.time())
    if store.put(commit_key(task), marker.to_json(), if_absent=True):
        return CommitStatus.COMMITTED
    winner = read_marker(store, task)
    if winner is not None and winner.data_key != key:
        store.delete(key)  # ours lost the race: leave no orphan behind
    return CommitStatus.ALREADY_COMMITTED


def read_marker(store: Store, task: int) -> CommitMarker | None:
    key = commit_key(task)
    return CommitMarker.from_json(store.get(key)) if store.exists(key) else None


def committed_task_ids(store: Store) -> set[int]:
    """Committed tasks from the marker keys alone (one listing, no reads): for resume."""
    prefix = f"{COMMITS}task-"
    return {int(key[len(prefix) : -len(".json")]) for key in store.list(COMMITS) if key.startswith(prefix) and key.endswith(".json")}


def committed_tasks(store: Store) -> dict[int, CommitMarker]:
    """Every commit marker, by task (one listing, then the markers' gets in flight together)."""
    keys = [key for key in store.list(COMMITS) if key.endswith(".json")]
    markers = (CommitMarker.from_json(data) for data in store.get_many(keys))
    return {m.task: m for m in markers}


def committed_shards(store: Store) -> list[ShardRef]:
    """Every committed shard, in task order, from a listing of the commit markers and one
    of the data. A committed task with exactly one data object, named in the current
    format, is that object: a writer puts its data before its marker (so the data of
    every task the first listing holds is in the second), and a loser deletes its own.
    Any other committed task (a crashed attempt's or a racer's data beside the committed
    one, an earlier sweep's key format, no data at all) has its marker read."""
    tasks = sorted(committed_task_ids(store))  # first: their data was put before, so is listed below
    candidates: dict[int, list[str]] = {}
    for key in store.list(DATA):
        if found := _TASK_OF_DATA.match(key):
            candidates.setdefault(int(found[1]), []).append(key)
    refs: dict[int, ShardRef] = {}
    for task in tasks:
        keys = candidates.get(task, [])
        if len(keys) == 1 and (named := _SHA_AND_ROWS.search(keys[0])):
            refs[task] = ShardRef(task, keys[0], named[1], int(named[2]))
    unresolved = [commit_key(task) for task in tasks if task not in refs]
    refs.update((m.task, m.ref) for m in map(CommitMarker.from_json, store.get_many(unresolved)))
    return [refs[task] for task in sorted(refs)]


def mismatch(data: bytes, sha256: str) -> str | None:
    """How `data` differs from what was committed with `sha256` (None: it does not)."""
    digest = hashlib.sha256(data).hexdigest()
    return None if digest == sha256 else f"sha256 {digest[:12]} != committed {sha256[:12]}"


def read_shard(store: Store, marker: CommitMarker | ShardRef) -> pa.Table:
    data = store.get(marker.data_key)
    if wrong := mismatch(data, marker.sha256):
        raise StoreError(f"shard {marker.data_key} is corrupt: {wrong}")
    # One thread: a tree is small, and pyarrow 26's threaded read_table can abort the
    # interpreter at exit ("terminate called without an active exception", apache/arrow#34314).
    table = pq.read_table(pa.BufferReader(data), use_threads=False)
    if table.num_rows != marker.rows:
        raise StoreError(f"shard {marker.data_key} has {table.num_rows} rows, committed {marker.rows}")
    return table


def iter_shards(store: Store) -> Iterator[tuple[ShardRef, pa.Table]]:
    """Every committed shard, in task order, checksums verified."""
    for ref in committed_shards(store):
        yield ref, read_shard(store, ref)
