"""Checkpoints of growing trees in the sweep's storage: the replies a tree has paid for, so that
a rerun after a kill or a preemption resumes it without asking the LLM again (how a tree is
resumed from its replies: thicket.search.journal).

Layout: `checkpoints/task-00000012/000000.jsonl.gz`, `000001.jsonl.gz`, ...: numbered segments,
each holding the replies recorded since the one before, written whole (a store's put is
atomic: a segment is there entirely or not at all). A segment's first line is its header: the
format, thicket's version, the fingerprint of what shapes the tree in the spec, the task and
the segment's number. Readers of the sweep's trees and datasets never look under
`checkpoints/`; a tree's segments are deleted once the tree is committed (with the folders
they leave empty).

A segment that cannot be read, or whose header is not this spec's, version's and task's, ends
the checkpoint there: it and every later segment are deleted with a warning, and the tree
grows on from the segments before it. A foreign reply is never mixed in.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from thicket.version import __version__
from thicket.policy.base import Reply
from thicket.rollout.spec_record import tree_fields
from thicket.spec import CheckpointSpec, SweepSpec
from thicket.storage.store import Store

log = logging.getLogger("thicket.checkpoint")

CHECKPOINTS = "checkpoints/"
FORMAT = "thicket-checkpoint/1"
UNWIND_S = 5.0  # of the grace period, left after the SIGTERM saves for the run to unwind


def checkpoint_prefix(task: int) -> str:
    return f"{CHECKPOINTS}task-{task:08d}/"


def segment_key(task: int, number: int) -> str:
    return f"{checkpoint_prefix(task)}{number:06d}.jsonl.gz"


def spec_fingerprint(spec: SweepSpec) -> str:
    """A digest of what shapes a task's tree (the fields a rerun may not change: spec_record's
    tree_fields) and thicket's version."""
    what = {"format": FORMAT, "thicket": __version__, "tree": tree_fields(spec.model_dump(mode="json"))}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass
class TreeCheckpoint:
    """One growing tree's replies: those a checkpoint brought back (served once each, in the
    order they were recorded) and those sampled since, saved on the spec's cadence."""

    store: Store
    task: int
    fingerprint: str
    settings: CheckpointSpec
    recorded: dict[str, deque[list[Reply]]] = field(default_factory=dict)
    segments: int = 0  # segments in storage (the next one's number)
    loaded_calls: int = 0  # replies the checkpoint brought back
    _pending: list[tuple[str, list[Reply]]] = field(default_factory=list)
    _pending_calls: int = 0
    _last_save: float = field(default_factory=time.monotonic)
    _not_before: float = 0.0  # after a failed save: the next is tried every_s later, not at each reply
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, store: Store, task: int, fingerprint: str, settings: CheckpointSpec) -> TreeCheckpoint:
        """The task's checkpoint as stored (empty where there is none)."""
        checkpoint = cls(store, task, fingerprint, settings)
        keys = sorted(store.list(checkpoint_prefix(task)))
        for number, key in enumerate(keys):
            problem = checkpoint._read(key, number)
            if problem:
                log.warning("task %d: checkpoint %s ignored from there on: %s", task, key, problem,
                            extra={"task": task, "tree": task})
                delete_segments(store, task, keys[number:])
                break
            checkpoint.segments = number + 1
        return checkpoint

    def _read(self, key: str, number: int) -> str:
        """Add one segment's replies; the problem that makes it unusable, else ''."""
        if key != segment_key(self.task, number):
            return f"expected segment {segment_key(self.task, number)} here (a segment is missing)"
        try:
            lines = gzip.decompress(self.store.get(key)).decode().splitlines()
            header = json.loads(lines[0])
            expected = self._header(number)
            if header != expected:
                differs = sorted(k for k in expected if header.get(k) != expected[k])
                return f"written for another {', '.join(differs)}"
            entries = [json.loads(line) for line in lines[1:]]
            batch = [(entry["key"], [Reply(**reply) for reply in entry["replies"]]) for entry in entries]
        except Exception as err:  # whatever is wrong with it, it is not ours to use
            return f"unreadable ({type(err).__name__}: {err})"[:300]
        for propose, replies in batch:
            self.recorded.setdefault(propose, deque()).append(replies)
            self.loaded_calls += len(replies)
        return ""

    def _header(self, number: int) -> dict[str, object]:
        return {"format": FORMAT, "thicket": __version__, "spec": self.fingerprint, "task": self.task,
                "segment": number}

    # ReplyJournal (thicket.search.journal)
    def take(self, key: str) -> list[Reply] | None:
        queue = self.recorded.get(key)
        if not queue:
            return None
        replies = queue.popleft()
        if not queue:
            del self.recorded[key]
        return replies

    async def record(self, key: str, replies: list[Reply]) -> None:
        self._pending.append((key, replies))
        self._pending_calls += len(replies)
        if self._due():
            await asyncio.to_thread(self.save)

    def _due(self) -> bool:
        if time.monotonic() < self._not_before:  # storage failing: a tree must not wait on it at each reply
            return False
        return self._pending_calls >= self.settings.every_calls or (
            bool(self._pending) and time.monotonic() - self._last_save >= self.settings.every_s)

    @property
    def unsaved_calls(self) -> int:
        return self._pending_calls

    @property
    def unused_calls(self) -> int:
        """Replies brought back that no propose asked for (the tree grew otherwise)."""
        return sum(len(replies) for queue in self.recorded.values() for replies in queue)

    def save(self) -> bool:
        """Write the replies recorded since the last save as the next segment. A failed write
        keeps them for the next save and is logged: a checkpoint never fails its tree."""
        with self._lock:
            if not self._pending:
                return True
            batch, calls = self._pending, self._pending_calls
            self._pending, self._pending_calls = [], 0
            try:
                self.store.put(segment_key(self.task, self.segments), self._encode(batch))
            except Exception as err:
                self._pending, self._pending_calls = batch + self._pending, calls + self._pending_calls
                self._not_before = time.monotonic() + self.settings.every_s
                log.warning("task %d: checkpoint not saved (%s); kept for the next save", self.task, err,
                            extra={"task": self.task, "tree": self.task})
                return False
            self.segments += 1
            self._last_save = time.monotonic()
            return True

    def _encode(self, batch: list[tuple[str, list[Reply]]]) -> bytes:
        lines = [json.dumps(self._header(self.segments))]
        lines += [json.dumps({"key": key, "replies": [asdict(r) for r in replies]}, ensure_ascii=False)
                  for key, replies in batch]
        return gzip.compress("\n".join(lines).encode(), compresslevel=1)

    def discard(self) -> None:
        """Delete the tree's segments (it is committed: they are done with). It knows their keys,
        so nothing is listed; one not deleted (storage down) is logged and left to the next run's
        scan: the tree is committed either way."""
        with self._lock:
            self._pending, self._pending_calls = [], 0
            delete_segments(self.store, self.task, [segment_key(self.task, n) for n in range(self.segments)])
            self.segments = 0


def delete_segments(store: Store, task: int, keys: list[str]) -> None:
    """Delete these segments of the task's checkpoint; one that fails is logged, not raised. The
    folders left empty go too (the task's, then checkpoints/): a local sweep keeps no empty ones."""
    for key in keys:
        try:
            store.delete(key)
        except Exception as err:
            log.warning("task %d: could not delete checkpoint %s (%s)", task, key, err,
                        extra={"task": task, "tree": task})
    for folder in (checkpoint_prefix(task), CHECKPOINTS):
        store.remove_empty_folder(folder)


def checkpointed_tasks(store: Store) -> dict[int, list[str]]:
    """Tasks with a checkpoint in storage, with their keys."""
    tasks: dict[int, list[str]] = {}
    for key in store.list(CHECKPOINTS):
        name = key[len(CHECKPOINTS):].split("/", 1)[0]
        if name.startswith("task-") and name[5:].isdigit():
            tasks.setdefault(int(name[5:]), []).append(key)
    return tasks


@dataclass
class GrowingTrees:
    """One worker's checkpoints of the trees it has not committed yet."""

    store: Store
    spec: SweepSpec
    trees: dict[int, TreeCheckpoint] = field(default_factory=dict)
    _stored: set[int] | None = None  # tasks with a checkpoint in storage (None: not listed yet)
    _stopped: bool = False

    def __post_init__(self) -> None:
        self.fingerprint = spec_fingerprint(self.spec)

    def open(self, task: int) -> TreeCheckpoint | None:
        """The task's checkpoint (what an interrupted run paid for); None where they are off."""
        settings = self.spec.run.checkpoint
        if not settings.enabled:
            return None
        if self._stored is not None and task not in self._stored:  # nothing to read: no list call
            checkpoint = self.trees[task] = TreeCheckpoint(self.store, task, self.fingerprint, settings)
            return checkpoint
        checkpoint = self.trees[task] = TreeCheckpoint.load(self.store, task, self.fingerprint, settings)
        if checkpoint.loaded_calls:
            log.info("task %d: resuming from its checkpoint (%d LLM replies)", task, checkpoint.loaded_calls,
                     extra={"task": task, "tree": task, "status": "resuming"})
        return checkpoint

    def close(self, task: int, committed: bool) -> None:
        """A committed tree's checkpoint is deleted; another's saved for the rerun."""
        checkpoint = self.trees.pop(task, None)
        if checkpoint is None:
            return
        if committed and checkpoint.unused_calls:
            log.warning("task %d: %d replies of its checkpoint were not asked for again (the env or the policy "
                        "answered otherwise than in the interrupted run)", task, checkpoint.unused_calls,
                        extra={"task": task, "tree": task})
        checkpoint.discard() if committed else checkpoint.save()

    def save_all(self, within_s: float | None = None) -> None:
        """Save every tree not committed yet: the worker is stopping (once; synchronous). With
        `within_s`, storage gives up retrying then: a save that cannot land in the grace period
        is logged as not saved, rather than cut off by the SIGKILL that ends it."""
        if self._stopped or not self.trees:
            return
        self._stopped = True
        if within_s is not None:
            self.store.retry_until(time.monotonic() + within_s)
        unsaved = sum(c.unsaved_calls for c in self.trees.values())
        saved = sum(c.save() for c in list(self.trees.values()))
        log.warning("stopping: saved the checkpoints of %d of %d tree(s) not committed (%d LLM replies since "
                    "their last save)", saved, len(self.trees), unsaved, extra={"trees": saved})

    def scan(self, committed: set[int]) -> None:
        """List the stored checkpoints once; delete those of these committed trees (left by a run
        that stopped before deleting them)."""
        stored = checkpointed_tasks(self.store)
        for task in stored.keys() & committed:
            delete_segments(self.store, task, stored[task])
        self._stored = stored.keys() - committed

    @contextlib.contextmanager
    def saved_on_sigterm(self) -> Iterator[None]:
        """SIGTERM (Kubernetes' preemption and drain signal) saves every growing tree at once, then
        goes on to the handler that was there (which unwinds the run): unwinding first could outlast
        the grace period (closing env clients whose sidecar is stopping too)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: object) -> None:
            self.save_all(within_s=max(1.0, self.spec.run.checkpoint.grace_s - UNWIND_S))
            signal.signal(signal.SIGTERM, previous)
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
        try:
            yield
        finally:
            if signal.getsignal(signal.SIGTERM) is on_sigterm:
                signal.signal(signal.SIGTERM, previous)
