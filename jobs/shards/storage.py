"""Tree shards: Parquet files of one row per node, each tree committed atomically.

Layout under a sweep's URI:
    trees/data/task-00000042.<sha256>.<rows>.parquet   one tree's data, written first
    trees/data/batch-00000040-00000071.<sha256>.<rows>.parquet   or several trees' (tasks 40 to 71 at most)
    trees/commits/task-00000042.json                    the commit marker, put-if-absent
Readers only see committed tasks, so a half-written or losing shard is never seen; the
marker holds the data key, its SHA-256, the tree's rows and where they start in the file.
A one-tree data key says the same, so a reader of many shards needs two listings and no
marker reads, except for a task with more than one data object (see committed_shards);
the markers of trees in batch files are read. On make demo's trees, 32 trees to a file
took a quarter of the bytes of a file per tree, and 50 decoded 5x faster per node (the
fixed costs of a Parquet file: its footer, a reader per column chunk, the system
prompt's dictionary). Earlier sweeps
named data task-00000042.<sha16>.parquet; their markers are read.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum

import numpy as np
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
        # token_ids[prefill_start:prefill_start + prefill_len] were prefilled, not sampled (logprob
        # 0.0); prefill_len -1: ids of a prefill not known exactly. Null in older shards
        ("prefill_start", pa.int32()),
        ("prefill_len", pa.int32()),
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
        # the root-to-node path's return by the env's reward semantics (increment: the sum of
        # rewards; running: this node's reward, the score so far); null in older shards
        ("path_return", pa.float32()),
        ("reward_semantics", pa.string()),  # increment | running (the env family's)
        ("data_source", pa.string()),  # where the env's tasks came from; null: its family's own (and older shards)
        ("deterministic", pa.bool_()),  # the env declared its transitions deterministic; null in older shards
        ("done", pa.bool_()),
        ("success", pa.bool_()),
        ("terminal", pa.bool_()),
        ("stop_reason", pa.string()),
        ("value", pa.float32()),
        ("visits", pa.int32()),
        ("llm_ms", pa.float32()),
        ("env_ms", pa.float32()),
        # LLM calls made from this node's prompt (one per sampled reply: its children and the
        # duplicates the search dropped) and the tokens they generated; null in older shards
        ("llm_calls", pa.int32()),
        ("llm_tokens", pa.int32()),
        # a resumed tree (thicket.rollout.checkpoint): of llm_calls, those a checkpoint brought back,
        # and whether this node's reply was one of them (not sampled again); null in older shards
        ("resumed_llm_calls", pa.int32()),
        ("resumed", pa.bool_()),
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
    row_start: int = 0  # the tree's first row in the data file (batch files hold several)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CommitMarker:
        return cls(**json.loads(data))

    @property
    def ref(self) -> ShardRef:
        return ShardRef(self.task, self.data_key, self.sha256, self.rows, self.row_start)


@dataclass(frozen=True)
class ShardRef:
    """What a reader needs of a committed tree: its data file (which may hold other trees:
    the tree is rows row_start:row_start + rows there)."""

    task: int
    data_key: str
    sha256: str  # of the whole file
    rows: int
    row_start: int = 0


def commit_key(task: int) -> str:
    return f"{COMMITS}task-{task:08d}.json"


def data_key(task: int, sha256: str, rows: int) -> str:
    return f"{DATA}task-{task:08d}.{sha256}.{rows}.parquet"


def batch_key(tasks: Sequence[int], sha256: str, rows: int) -> str:
    return f"{DATA}batch-{min(tasks):08d}-{max(tasks):08d}.{sha256}.{rows}.parquet"


_TASK_OF_DATA = re.compile(rf"^{DATA}task-(\d+)\.")
_TASKS_OF_BATCH = re.compile(rf"^{DATA}batch-(\d+)-(\d+)\.")  # the lowest and highest task it holds
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


class PartlyCommitted(Exception):
    """Some markers of a batch could not be put (the store failed them after its retries):
    `statuses` holds the trees whose markers were put (or another writer's found), `errors` the
    others, which are not committed (a rerun grows them)."""

    def __init__(self, statuses: dict[int, CommitStatus], errors: dict[int, Exception]) -> None:
        failed = ", ".join(f"{task} ({type(err).__name__}: {err})" for task, err in sorted(errors.items()))
        super().__init__(f"{len(errors)} of {len(statuses) + len(errors)} commit markers not put: tasks {failed}")
        self.statuses = statuses
        self.errors = errors


def write_shards(store: Store, trees: Sequence[tuple[int, pa.Table]], writer: str) -> dict[int, CommitStatus]:
    """Several trees in one data file (in task order), each committed by its own marker
    (put-if-absent); each task's status. One tree: write_shard. A tree that another writer
    committed first stays in the file, unread; a file holding no committed tree is deleted.
    The markers are put at once, each on its own: if the store fails some, PartlyCommitted says
    which trees were committed and which were not (a failure to put the data file fails them all)."""
    from concurrent.futures import ThreadPoolExecutor

    if len(trees) == 1:
        return {trees[0][0]: write_shard(store, *trees[0], writer)}
    trees = sorted(trees, key=lambda item: item[0])
    tasks = [task for task, _ in trees]
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"a batch holds each task once: {tasks}")
    table = pa.concat_tables([t for _, t in trees]).combine_chunks()
    data = to_parquet(table)
    digest = hashlib.sha256(data).hexdigest()
    key = batch_key(tasks, digest, table.num_rows)
    store.put(key, data)
    markers, start, now = [], 0, time.time()
    for task, tree in trees:
        markers.append(CommitMarker(task, key, digest, tree.num_rows, len(data), writer, now, row_start=start))
        start += tree.num_rows

    def put_marker(marker: CommitMarker) -> bool | Exception:
        try:
            return store.put(commit_key(marker.task), marker.to_json(), if_absent=True)
        except Exception as err:  # this tree is not committed; the others go on
            return err

    # At once: a store that fails every put costs its retry deadline once, not once per tree.
    with ThreadPoolExecutor(min(len(markers), 16), thread_name_prefix="store-commit") as pool:
        results = dict(zip(tasks, pool.map(put_marker, markers), strict=True))
    errors = {task: won for task, won in results.items() if isinstance(won, Exception)}
    statuses = {task: CommitStatus.COMMITTED if won else CommitStatus.ALREADY_COMMITTED
                for task, won in results.items() if not isinstance(won, Exception)}
    if errors:  # the data file stays: a marker whose put failed may yet have landed
        raise PartlyCommitted(statuses, errors)
    if CommitStatus.COMMITTED not in statuses.values():
        winners = [read_marker(store, task) for task in tasks]
        if all(w is None or w.data_key != key for w in winners):  # identical bytes share one key
            store.delete(key)
    return statuses


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
    """Every committed tree, in task order, from a listing of the commit markers and one
    of the data. A committed task with exactly one data object, named in the current
    format and holding that task alone, is that object: a writer puts its data before its
    marker (so the data of every task the first listing holds is in the second), and a
    loser deletes its own. Any other committed task (in a batch file's task range, a
    crashed attempt's or a racer's data beside the committed one, an earlier sweep's key
    format, no data at all) has its marker read."""
    tasks = sorted(committed_task_ids(store))  # first: their data was put before, so is listed below
    candidates: dict[int, list[str]] = {}
    batched = np.zeros(len(tasks), dtype=bool)  # in the task range of some batch file
    for key in store.list(DATA):
        if found := _TASK_OF_DATA.match(key):
            candidates.setdefault(int(found[1]), []).append(key)
        elif found := _TASKS_OF_BATCH.match(key):
            batched[bisect_left(tasks, int(found[1])) : bisect_right(tasks, int(found[2]))] = True
    refs: dict[int, ShardRef] = {}
    for task, in_batch in zip(tasks, batched.tolist()):
        keys = candidates.get(task, [])
        if not in_batch and len(keys) == 1 and (named := _SHA_AND_ROWS.search(keys[0])):
            refs[task] = ShardRef(task, keys[0], named[1], int(named[2]))
    unresolved = [commit_key(task) for task in tasks if task not in refs]
    refs.update((m.task, m.ref) for m in map(CommitMarker.from_json, store.get_many(unresolved)))
    return [refs[task] for task in sorted(refs)]


def mismatch(data: bytes, sha256: str) -> str | None:
    """How `data` differs from what was committed with `sha256` (None: it does not)."""
    digest = hashlib.sha256(data).hexdigest()
    return None if digest == sha256 else f"sha256 {digest[:12]} != committed {sha256[:12]}"


def read_shard(store: Store, marker: CommitMarker | ShardRef) -> pa.Table:
    """A committed tree's rows."""
    return tree_rows(read_data(store, marker), marker)


def read_data(store: Store, marker: CommitMarker | ShardRef) -> pa.Table:
    """A committed tree's whole data file (other trees too, in a batch file), checksum verified."""
    return decode_data(marker, store.get(marker.data_key))


def decode_data(
    ref: CommitMarker | ShardRef,
    data: bytes,
    columns: Sequence[str] | None = None,
    dictionaries: Sequence[str] = (),
) -> pa.Table:
    """A data file's bytes, checked against the commit's SHA-256, as a table (these columns;
    `dictionaries` of them as Arrow dictionary arrays, their repeated values kept once)."""
    if wrong := mismatch(data, ref.sha256):
        raise StoreError(f"shard {ref.data_key} is corrupt: {wrong}")
    # One thread: a tree is small, and pyarrow 26's threaded reads can abort the interpreter
    # at exit ("terminate called without an active exception", apache/arrow#34314).
    columns = None if columns is None else list(columns)
    file = pq.ParquetFile(pa.BufferReader(data), read_dictionary=list(dictionaries) or None)
    return file.read(columns=columns, use_threads=False)


def tree_rows(table: pa.Table, ref: CommitMarker | ShardRef) -> pa.Table:
    """The committed tree's rows of its data file's table, checked against the commit: all
    of the file's rows, or (a batch file) exactly the rows of its task, from row_start."""
    if ref.row_start == 0 and table.num_rows == ref.rows:
        return table
    start, end = ref.row_start, ref.row_start + ref.rows
    tasks = table.column("task").to_numpy() if "task" in table.column_names else None
    if tasks is None or end > len(tasks) or (tasks[start:end] != ref.task).any() or (
        start > 0 and tasks[start - 1] == ref.task) or (end < len(tasks) and tasks[end] == ref.task):
        raise StoreError(f"shard {ref.data_key} does not hold task {ref.task}'s {ref.rows} rows from row "
                         f"{start} as committed ({table.num_rows} rows there)")
    return table.slice(start, ref.rows)


def iter_shards(store: Store) -> Iterator[tuple[ShardRef, pa.Table]]:
    """Every committed tree, in task order, checksums verified (a batch file read once for
    its consecutive trees)."""
    file: tuple[str, pa.Table] | None = None
    for ref in committed_shards(store):
        if file is None or file[0] != ref.data_key:
            file = (ref.data_key, read_data(store, ref))
        yield ref, tree_rows(file[1], ref)
