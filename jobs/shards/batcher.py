"""Finished trees committed a batch at a time: several trees to a data file (see
thicket.shards.storage.write_shards), each still committed by its own marker.

A batch is written once `max_trees` trees wait, once the oldest has waited `max_wait_s`,
or when flush() says no more trees are coming. A tree counts as committed only when its
batch's data file is written and then its own marker put (a marker the store fails leaves
that tree alone uncommitted); trees still waiting when the process dies were never committed,
so a rerun grows them again (nothing half-written is ever visible).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import pyarrow as pa

from thicket.shards.storage import CommitStatus, PartlyCommitted, write_shards
from thicket.storage.store import Store

log = logging.getLogger("thicket.rollout.worker")


@dataclass(frozen=True)
class _Waiting:
    task: int
    table: pa.Table
    committed: asyncio.Future[CommitStatus]


class ShardBatcher:
    def __init__(self, store: Store, writer: str, max_trees: int = 1, max_wait_s: float = 60.0) -> None:
        self.store = store
        self.writer = writer
        self.max_trees = max_trees
        self.max_wait_s = max_wait_s
        self._waiting: list[_Waiting] = []
        self._timer: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Task[None]] = set()

    def add(self, task: int, table: pa.Table) -> asyncio.Future[CommitStatus]:
        """Queue a tree; the future gets its commit status once its batch is written (or the
        error that left it uncommitted: the data file's, or its own marker's)."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(task, table, loop.create_future())
        self._waiting.append(waiting)
        if len(self._waiting) >= self.max_trees:
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self.flush)
        return waiting.committed

    def flush(self) -> None:
        """Write the trees waiting now as one batch (on a thread)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting:
            return
        batch, self._waiting = self._waiting, []
        write = asyncio.ensure_future(self._write(batch))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    async def aclose(self) -> None:
        """Write what waits and wait for every write."""
        self.flush()
        while self._writes:
            await asyncio.gather(*self._writes)

    async def _write(self, batch: list[_Waiting]) -> None:
        started = time.perf_counter()
        trees = [(w.task, w.table) for w in batch]
        errors: dict[int, Exception] = {}
        try:
            statuses = await asyncio.to_thread(write_shards, self.store, trees, self.writer)
        except PartlyCommitted as partly:  # each tree its own outcome: committed, or its marker's error
            statuses, errors = partly.statuses, partly.errors
            log.warning("%s", partly, extra={"trees": len(batch), "failed": len(errors), "writer": self.writer})
        except Exception as err:  # the data file was not written: each waiting tree's task reports it
            for w in batch:
                if not w.committed.done():
                    w.committed.set_exception(err)
            return
        else:
            log.debug("%d tree(s) written in one data file in %.2f s", len(batch), time.perf_counter() - started,
                      extra={"trees": len(batch), "nodes": sum(t.num_rows for _, t in trees), "writer": self.writer})
        for w in batch:
            if w.committed.done():
                continue
            if w.task in errors:
                w.committed.set_exception(errors[w.task])
            else:
                w.committed.set_result(statuses[w.task])
