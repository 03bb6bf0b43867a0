"""Datasets as Parquet parts of bounded size, put through the Store interface.

Tables are buffered; a part is cut once the buffer holds `max_rows` rows or `max_bytes`
of Arrow data, so memory stays bounded whatever the sweep's size and each part stays a
comfortable size for HF datasets. Part boundaries depend only on the rows, so a rerun
writes the same bytes. `Datasets` feeds every dataset's writer on a background thread
(buffering, byte accounting and cutting parts), and encoding and the put run on two more
(Parquet encoding releases the GIL), at most two parts of each dataset in flight: encoding
the token rows (their prompt ids repeat on every row) is the largest cost of real trees,
and a second encoder took make demo's trees replicated to 500k nodes from 38,000-52,000 to
64,000-68,000 nodes/s (trees 32 to a shard file, 2 cores), for ~130 MB more peak memory.
"""

from __future__ import annotations

import hashlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from thicket.storage.store import Store

DATASETS = "datasets/"
MAX_ROWS = 50_000
MAX_BYTES = 64 << 20  # of Arrow data in memory per dataset; parts compress to well under this
COMPACT_AFTER = 256  # buffered tables (one per forest) merged into one past this many
PARTS_IN_FLIGHT = 2  # per dataset, encoded and put at once (by as many threads)
CONTENT_DIGITS = 16  # of a part's SHA-256 in its name


@dataclass(frozen=True)
class WrittenFile:
    path: str  # relative to datasets/
    sha256: str
    bytes: int
    rows: int | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}
        if self.rows is not None:
            out["rows"] = self.rows
        return out


def put_file(store: Store, path: str, data: bytes, rows: int | None = None) -> WrittenFile:
    store.put(DATASETS + path, data)
    return WrittenFile(path, hashlib.sha256(data).hexdigest(), len(data), rows)


def part_path(dataset: str, index: int, data: bytes) -> str:
    """A part's path, named by its content: `sft/part-00000-<sha256 prefix>.parquet`. The dataset
    card lists these exact paths, and HF `datasets` keys its cache on the card's data files, so
    two sweeps' (or two aggregations') different rows never share a cache entry."""
    return f"{dataset}/part-{index:05d}-{hashlib.sha256(data).hexdigest()[:CONTENT_DIGITS]}.parquet"


def put_part(store: Store, dataset: str, index: int, data: bytes, rows: int) -> WrittenFile:
    return put_file(store, part_path(dataset, index, data), data, rows)


def keep_rows(store: Store, files: list[WrittenFile], keep: np.ndarray, encoding: Encoding) -> list[WrittenFile]:
    """A dataset's parts (in row order) rewritten without the rows `keep` says to drop (a
    rewritten part gets its new content's name; a part left with no rows is deleted); parts
    that lose no row stay as they are."""
    out: list[WrittenFile] = []
    start = 0
    for index, part in enumerate(files):
        rows = int(part.rows or 0)
        mask = keep[start : start + rows]
        start += rows
        if mask.all():
            out.append(part)
            continue
        if not mask.any():
            store.delete(DATASETS + part.path)
            continue
        table = pq.read_table(pa.BufferReader(store.get(DATASETS + part.path))).filter(pa.array(mask))
        out.append(put_part(store, part.path.split("/")[0], index, encoding.parquet(table), table.num_rows))
        store.delete(DATASETS + part.path)
    if start != len(keep):
        raise ValueError(f"keep_rows: {len(keep)} flags for {start} rows of parts")
    return out


@dataclass(frozen=True)
class Encoding:
    """How a dataset's parts are written: Parquet dictionary encoding (every column, or
    these) and the codec. Columns of repeated texts take dictionaries; token ids don't."""

    dictionary: bool | tuple[str, ...] = True
    compression: str = "zstd"

    def parquet(self, table: pa.Table) -> bytes:
        """The table in Parquet (into an Arrow buffer: no GIL taken while encoding)."""
        sink = pa.BufferOutputStream()
        dictionary = self.dictionary if isinstance(self.dictionary, bool) else list(self.dictionary)
        pq.write_table(
            table,
            sink,
            row_group_size=MAX_ROWS,
            compression=self.compression,
            use_dictionary=dictionary,
            write_statistics=False,
        )
        return sink.getvalue().to_pybytes()


@dataclass
class DatasetWriter:
    store: Store
    name: str
    schema: pa.Schema
    encoding: Encoding = Encoding()
    max_rows: int = MAX_ROWS
    max_bytes: int = MAX_BYTES
    pool: ThreadPoolExecutor | None = None  # where parts are encoded and put (None: inline)
    in_flight: int = PARTS_IN_FLIGHT
    rows: int = 0
    parts: int = 0
    _written: list[Future[WrittenFile]] = field(default_factory=list)
    _tables: list[pa.Table] = field(default_factory=list)
    _buffered_rows: int = 0
    _buffered_bytes: int = 0

    def add(self, table: pa.Table | None) -> None:
        if table is None or table.num_rows == 0:
            return
        if table.schema != self.schema:
            raise ValueError(f"{self.name}: rows do not match the dataset's schema")
        self._tables.append(table)
        self._buffered_rows += table.num_rows
        self._buffered_bytes += table.nbytes
        if len(self._tables) >= COMPACT_AFTER:  # many small tables cost far more memory than their rows
            self._tables = [pa.concat_tables(self._tables).combine_chunks()]
        self._drain(final=False)

    def close(self) -> list[WrittenFile]:
        self._drain(final=True)
        return [f.result() for f in self._written]

    def _drain(self, final: bool) -> None:
        while self._buffered_rows and (
            final or self._buffered_rows >= self.max_rows or self._buffered_bytes >= self.max_bytes
        ):
            buffered = pa.concat_tables(self._tables)
            take = self._part_rows(buffered)
            self._write(buffered.slice(0, take))
            rest = buffered.slice(take)
            self._tables = [rest] if rest.num_rows else []
            self._buffered_rows = rest.num_rows
            self._buffered_bytes = rest.nbytes if rest.num_rows else 0

    def _part_rows(self, buffered: pa.Table) -> int:
        """Rows of the next part: max_rows at most, fewer if they hold more than max_bytes."""
        take = min(self.max_rows, buffered.num_rows)
        if buffered.nbytes <= self.max_bytes:
            return take
        return max(1, min(take, int(self.max_bytes * buffered.num_rows / buffered.nbytes)))

    def _write(self, table: pa.Table) -> None:
        index = self.parts
        self.parts += 1
        self.rows += table.num_rows
        if self.pool is None:
            done: Future[WrittenFile] = Future()
            done.set_result(self._encode_and_put(index, table))
            self._written.append(done)
            return
        if len(self._written) >= self.in_flight:
            self._written[-self.in_flight].result()  # at most in_flight parts of this dataset at once
        self._written.append(self.pool.submit(self._encode_and_put, index, table))

    def _encode_and_put(self, index: int, table: pa.Table) -> WrittenFile:
        return put_part(self.store, self.name, index, self.encoding.parquet(table), table.num_rows)


class Datasets:
    """One DatasetWriter per dataset, fed a tree's tables at a time on a background thread,
    at most `ahead` trees behind the caller. Use as a context manager; close() once done."""

    def __init__(
        self,
        store: Store,
        schemas: dict[str, tuple[pa.Schema, Encoding]],
        max_rows: int = MAX_ROWS,
        max_bytes: int = MAX_BYTES,
        ahead: int = 2,
    ) -> None:
        self._parts = ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="write-parts")
        self._adder = ThreadPoolExecutor(1, thread_name_prefix="add-rows")
        self.writers = {
            name: DatasetWriter(store, name, schema, encoding, max_rows, max_bytes, self._parts)
            for name, (schema, encoding) in schemas.items()
        }
        self._ahead = ahead
        self._pending: deque[Future[None]] = deque()

    def add(self, tables: dict[str, pa.Table]) -> None:
        self._pending.append(self._adder.submit(self._add, tables))
        while len(self._pending) > self._ahead:
            self._pending.popleft().result()

    def close(self) -> dict[str, list[WrittenFile]]:
        """Every dataset's parts, once all are written."""
        while self._pending:
            self._pending.popleft().result()
        return {name: w.close() for name, w in self.writers.items()}

    @property
    def rows(self) -> dict[str, int]:
        return {name: w.rows for name, w in self.writers.items()}

    def _add(self, tables: dict[str, pa.Table]) -> None:
        for name, table in tables.items():
            self.writers[name].add(table)

    def __enter__(self) -> Datasets:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        for future in self._pending:
            future.cancel()
        self._adder.shutdown()
        self._parts.shutdown()
