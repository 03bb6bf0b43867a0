"""Committed trees, one at a time, reading only the columns aggregation needs.

The same checks as thicket.storage.shards.read_shard (SHA-256 and row count against the
commit marker). Bytes are fetched through the Store on a background thread. Inline, the
trees are decoded on another, text columns included (off the thread that builds rows,
which holds the GIL most); in a worker process, where the tree is processed, and the
text columns only when the tree yields chats.
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


def decoded(store: Store, markers: list[CommitMarker], ahead: int = 4) -> Iterator[TreeView]:
    """Each shard as a TreeView with its texts, in order. Checks and Parquet decoding (which
    release the GIL) run on a background thread, up to `ahead` shards ahead of the caller."""
    with ThreadPoolExecutor(1, thread_name_prefix="decode-shards") as pool:
        pending: deque[Future[TreeView]] = deque()
        for marker, data in fetch(store, markers):
            pending.append(pool.submit(decode, marker, data, with_text=True))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def decode(marker: CommitMarker, data: bytes, with_text: bool = False) -> TreeView:
    """The shard's tree; its text columns read now or (with_text False) when first needed."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != marker.sha256:
        raise StoreError(f"shard {marker.data_key} is corrupt: sha256 {digest[:12]} != committed {marker.sha256[:12]}")
    shard = pq.ParquetFile(pa.BufferReader(data))
    if shard.metadata.num_rows != marker.rows:
        raise StoreError(f"shard {marker.data_key} has {shard.metadata.num_rows} rows, committed {marker.rows}")
    try:
        if with_text:
            return TreeView.of(shard.read(columns=[*STRUCTURE_COLUMNS, *TEXT_COLUMNS], use_threads=False))
        table = shard.read(columns=list(STRUCTURE_COLUMNS), use_threads=False)
        return TreeView.of(table, lambda: shard.read(columns=list(TEXT_COLUMNS), use_threads=False))
    except (MalformedShard, KeyError, pa.ArrowInvalid) as err:
        raise BadInput(f"shard {marker.data_key}: {err}") from None
