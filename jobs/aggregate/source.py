"""Committed trees, one at a time, reading only the columns aggregation needs.

The same checks as thicket.storage.shards.read_shard (SHA-256 and row count against the
commit marker). Bytes are fetched through the Store on a background thread; decoding
happens where the tree is processed (possibly a worker process), and the text columns
are decoded only when a tree yields chats.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from thicket.aggregate.view import TEXT_COLUMNS, MalformedShard, TreeView
from thicket.errors import BadInput
from thicket.storage.shards import CommitMarker, committed_tasks
from thicket.storage.store import Store, StoreError

STRUCTURE_COLUMNS = (
    "env",
    "algorithm",
    "task",
    "tree",
    "node",
    "parent",
    "depth",
    "token_ids",
    "logprobs",
    "context_prefix_len",
    "context_suffix_ids",
    "prompt_tokens",
    "cached_tokens",
    "constrained",
    "reward",
    "success",
    "stop_reason",
    "value",
    "visits",
)


def committed(store: Store) -> list[CommitMarker]:
    """Commit markers in task order."""
    return [marker for _, marker in sorted(committed_tasks(store).items())]


def fetch(store: Store, markers: list[CommitMarker], prefetch: int = 4) -> Iterator[tuple[CommitMarker, bytes]]:
    """Each shard's bytes, in order; the next `prefetch` are fetched on a background thread."""
    with ThreadPoolExecutor(1, thread_name_prefix="fetch-shards") as pool:
        pending: deque[tuple[CommitMarker, Future[bytes]]] = deque()
        for marker in markers:
            pending.append((marker, pool.submit(store.get, marker.data_key)))
            if len(pending) > prefetch:
                done, data = pending.popleft()
                yield done, data.result()
        while pending:
            done, data = pending.popleft()
            yield done, data.result()


def decode(marker: CommitMarker, data: bytes) -> TreeView:
    digest = hashlib.sha256(data).hexdigest()
    if digest != marker.sha256:
        raise StoreError(f"shard {marker.data_key} is corrupt: sha256 {digest[:12]} != committed {marker.sha256[:12]}")
    shard = pq.ParquetFile(pa.BufferReader(data))
    if shard.metadata.num_rows != marker.rows:
        raise StoreError(f"shard {marker.data_key} has {shard.metadata.num_rows} rows, committed {marker.rows}")
    try:
        table = shard.read(columns=list(STRUCTURE_COLUMNS), use_threads=False)
        return TreeView.of(table, lambda: shard.read(columns=list(TEXT_COLUMNS), use_threads=False))
    except (MalformedShard, KeyError, pa.ArrowInvalid) as err:
        raise BadInput(f"shard {marker.data_key}: {err}") from None
