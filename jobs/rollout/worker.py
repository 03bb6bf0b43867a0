"""The worker: grow one tree per task, many at once, and commit each as a shard (several
finished trees to a data file, see thicket.shards.batcher).

Tasks already committed in the store are skipped, so a rerun resumes; a tree that was still
growing (or waiting for its batch) when its worker died resumes from its checkpoint
(thicket.rollout.checkpoint) without asking the LLM again for what it had.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

import pyarrow as pa

import thicket.metrics as metrics
from thicket.envs import make_env
from thicket.envs.protocol import Env
from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.policy.base import Policy
from thicket.policy.inflight import AdjustableLimit
from thicket.progress import TaskProgress
from thicket.rollout.checkpoint import GrowingTrees, TreeCheckpoint
from thicket.search import grow, settle
from thicket.search.expand import Expander
from thicket.search.guard import ContentGuard
from thicket.search.tree import StopReason
from thicket.shards.batcher import ShardBatcher
from thicket.shards.storage import CommitStatus, committed_task_ids
from thicket.shards.table import TreeMeta, tree_table
from thicket.spec import SweepSpec
from thicket.storage.store import Store

log = logging.getLogger("thicket.worker")


UNAVAILABLE = "unavailable"  # how a failed task's error starts when a server could not be reached


class TaskStatus(StrEnum):
    COMMITTED = "committed"
    TIMED_OUT = "timed_out"  # committed, with the unfinished leaves marked timeout
    SKIPPED = "skipped"  # committed before (by an earlier run or another writer)
    FAILED = "failed"  # nothing committed: a rerun will try again
    NOT_RUN = "not_run"  # the index's deadline passed before it started: a rerun will run it


for _status in TaskStatus:
    metrics.TASKS_DONE.labels(_status.value)  # every outcome shows up, at 0, from the start


@dataclass(frozen=True)
class TaskOutcome:
    task: int
    status: TaskStatus
    nodes: int = 0
    solved: bool = False
    generated_tokens: int = 0
    llm_requests: int = 0
    seconds: float = 0.0
    error: str = ""
    resumed_nodes: int = 0  # nodes a checkpoint brought back (their replies not sampled again)
    resumed_calls: int = 0  # LLM calls a checkpoint saved

    def log_fields(self) -> dict[str, object]:
        fields = {"task": self.task, "tree": self.task, "status": self.status.value, "nodes": self.nodes,
                  "solved": self.solved, "generated_tokens": self.generated_tokens,
                  "llm_requests": self.llm_requests, "seconds": round(self.seconds, 3)}
        if self.resumed_calls:
            fields |= {"resumed_nodes": self.resumed_nodes, "resumed_calls": self.resumed_calls}
        return fields | ({"error": self.error} if self.error else {})


@dataclass(frozen=True)
class GrownTree:
    outcome: TaskOutcome
    table: pa.Table | None = None  # the shard's rows; None when growing failed


@dataclass
class WorkerReport:
    outcomes: list[TaskOutcome] = field(default_factory=list)
    seconds: float = 0.0
    server_lost: TaskOutcome | None = None  # the first task failed because a server stayed unreachable

    def add(self, outcome: TaskOutcome) -> None:
        self.outcomes.append(outcome)
        if self.server_lost is None and outcome.status is TaskStatus.FAILED and outcome.error.startswith(UNAVAILABLE):
            self.server_lost = outcome

    def count(self, *statuses: TaskStatus) -> int:
        return sum(1 for o in self.outcomes if o.status in statuses)

    @property
    def grown(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status in (TaskStatus.COMMITTED, TaskStatus.TIMED_OUT)]

    @property
    def failed(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status is TaskStatus.FAILED]

    @property
    def unavailable(self) -> list[TaskOutcome]:
        """Failed because a server (LLM, env, storage) stayed unreachable past its deadline."""
        return [o for o in self.failed if o.error.startswith(UNAVAILABLE)]

    @property
    def not_run(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status is TaskStatus.NOT_RUN]

    @property
    def resumed(self) -> list[TaskOutcome]:
        """Grown trees that a checkpoint brought LLM calls back to."""
        return [o for o in self.grown if o.resumed_calls]


@dataclass
class Worker:
    spec: SweepSpec
    policy: Policy
    store: Store
    model_name: str
    progress: bool = True
    writer_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # Where each tree's env comes from (thicket.rollout.envs.open_envs); default: in process.
    new_env: Callable[[], Env] | None = None
    _index_deadline: float | None = field(default=None, init=False)  # event-loop time
    _growing: GrowingTrees = field(init=False)  # the checkpoints of the trees not committed yet

    def __post_init__(self) -> None:
        self._growing = GrowingTrees(self.store, self.spec)

    def tree_slots(self) -> AdjustableLimit:
        """Trees grown at once: the spec's number, else twice the requests in flight (while one
        tree steps its env or writes its shard, another has a request ready)."""
        if self.spec.run.trees_in_flight:
            return AdjustableLimit(self.spec.run.trees_in_flight)
        return AdjustableLimit(1).follow(self.policy.slots, 2)

    async def run(self, tasks: list[int]) -> WorkerReport:
        started = time.perf_counter()
        index_timeout = self.spec.run.index_timeout_s
        self._index_deadline = asyncio.get_running_loop().time() + index_timeout if index_timeout else None
        done_before = committed_task_ids(self.store)
        await asyncio.to_thread(self._growing.scan, done_before & set(tasks))
        report = WorkerReport([TaskOutcome(t, TaskStatus.SKIPPED) for t in tasks if t in done_before])
        metrics.TASKS_DONE.labels(TaskStatus.SKIPPED.value).inc(len(report.outcomes))
        todo = asyncio.Queue[int]()
        for task in tasks:
            if task not in done_before:
                todo.put_nowait(task)
        slots = self.tree_slots()
        batcher = ShardBatcher(self.store, self.writer_id, self.spec.run.trees_per_shard, self.spec.run.shard_wait_s)
        growing = 0

        def no_more() -> bool:
            return todo.empty() or self._past_index_deadline() or report.server_lost is not None

        with TaskProgress(total=len(tasks), done=len(report.outcomes), enabled=self.progress) as bar:

            async def drain() -> None:
                nonlocal growing
                while not no_more():
                    async with slots:
                        if no_more():
                            break
                        growing += 1
                        try:
                            grown = await self.grow_tree(todo.get_nowait())
                            commit = batcher.add(grown.outcome.task, grown.table) if grown.table is not None else None
                        finally:
                            growing -= 1
                    if no_more() and growing == 0:
                        batcher.flush()  # no other tree will come to share a data file
                    outcome = self._finished(await self._committed(grown, commit))
                    report.add(outcome)  # before any await: a lost server stops the other drains at once
                    bar.advance(outcome.nodes, outcome.solved)
                    await self._close_checkpoint(outcome.task, committed=outcome.status is not TaskStatus.FAILED)

            # A tree waiting for its batch holds no slot: more drains than slots keep them all busy.
            drains = min(slots.ceiling + batcher.max_trees, todo.qsize()) or 1
            try:
                with self._growing.saved_on_sigterm():
                    await asyncio.gather(*(drain() for _ in range(drains)))
            finally:
                self._growing.save_all()  # killed or failing: what the trees not committed have paid for
                await batcher.aclose()
        self._leave_unstarted(todo, report)
        report.outcomes.sort(key=lambda o: o.task)
        report.seconds = time.perf_counter() - started
        return report

    async def grow_tree(self, task: int) -> GrownTree:
        """Grow the task's tree and turn it into its shard's table; a failure's outcome has no
        table. The outcome's seconds are those spent growing, not those waiting for a batch."""
        started = time.perf_counter()
        log.info("task %d started", task, extra={"task": task, "tree": task, "status": "started"})
        env = self.new_env() if self.new_env else make_env(self.spec.tasks.env, **self.spec.tasks.env_args)
        try:
            checkpoint = await self._open_checkpoint(task)
            guard = ContentGuard(self.spec.tasks.max_observation_chars)
            expander = await Expander.open(
                env,
                task,
                self.policy,
                self.spec.seed,
                guard=guard,
                max_depth=self.spec.search.max_depth,
                max_nodes=self.spec.search.max_nodes,
                show_valid_actions=self.spec.policy.show_valid_actions,
                dedupe=self.spec.search.dedupe,
                max_llm_calls=self.spec.search.max_llm_calls,
                journal=checkpoint,
            )
            status = await self._grow_within_deadline(expander)
            if faults := guard.summary():
                log.warning("task %d: untrusted content handled: %s", task, faults, extra={"task": task, "tree": task})
            table = await asyncio.to_thread(tree_table, expander.tree, self._meta(expander))
        except (BadInput, asyncio.CancelledError):
            raise
        except Exception as err:  # one task's failure must not stop the others
            return GrownTree(self._failed(task, err, time.perf_counter() - started))
        finally:
            await env.close()
        tree = expander.tree
        outcome = TaskOutcome(
            task,
            status,
            nodes=tree.size,
            solved=tree.solved,
            generated_tokens=sum(len(node.reply.token_ids) for node in tree.nodes() if node.reply),
            llm_requests=expander.llm_requests,
            seconds=time.perf_counter() - started,
            resumed_nodes=expander.resumed_nodes,
            resumed_calls=expander.resumed_calls,
        )
        return GrownTree(outcome, table)

    async def _open_checkpoint(self, task: int) -> TreeCheckpoint | None:
        return await asyncio.to_thread(self._growing.open, task)

    async def _close_checkpoint(self, task: int, committed: bool) -> None:
        await asyncio.to_thread(self._growing.close, task, committed)

    async def _committed(self, grown: GrownTree, commit: asyncio.Future[CommitStatus] | None) -> TaskOutcome:
        """The outcome once the tree's batch is written (at once for a tree that failed)."""
        outcome = grown.outcome
        if commit is None:
            return outcome
        try:
            status = await commit
        except (BadInput, asyncio.CancelledError):
            raise
        except Exception as err:
            return self._failed(outcome.task, err, outcome.seconds)
        fields = {"task": outcome.task, "tree": outcome.task, "nodes": outcome.nodes, "commit": status.value,
                  "writer": self.writer_id}
        if status is CommitStatus.COMMITTED:
            log.info("task %d: shard committed (%d nodes)", outcome.task, outcome.nodes, extra=fields)
            return outcome
        log.info("task %d: another writer committed it first; ours is dropped", outcome.task, extra=fields)
        return replace(outcome, status=TaskStatus.SKIPPED)

    def _failed(self, task: int, err: Exception, seconds: float) -> TaskOutcome:
        message = err.args[0] if isinstance(err, ThicketError) and err.args else repr(err)
        kind = UNAVAILABLE if isinstance(err, Unavailable) else "error"
        failed = TaskOutcome(task, TaskStatus.FAILED, seconds=seconds, error=f"{kind}: {message}")
        log.error("task %d failed: %s", task, message, extra=failed.log_fields())
        return failed

    def _leave_unstarted(self, todo: asyncio.Queue[int], report: WorkerReport) -> None:
        """Tasks never started (a server stayed unreachable, or the index deadline passed)
        are reported as not run; nothing of them was stored, so a rerun runs them."""
        if todo.empty():
            return
        why = (f"a server stayed unreachable ({report.server_lost.error})" if report.server_lost
               else f"the index deadline of {self.spec.run.index_timeout_s:.0f} s passed")
        log.error("%s: %d task(s) not started", why, todo.qsize(),
                  extra={"status": TaskStatus.NOT_RUN.value, "tasks": todo.qsize()})
        while not todo.empty():
            report.add(TaskOutcome(todo.get_nowait(), TaskStatus.NOT_RUN))
            metrics.TASKS_DONE.labels(TaskStatus.NOT_RUN.value).inc()

    def _past_index_deadline(self) -> bool:
        return self._index_deadline is not None and asyncio.get_running_loop().time() >= self._index_deadline

    async def _grow_within_deadline(self, expander: Expander) -> TaskStatus:
        deadline = asyncio.get_running_loop().time() + self.spec.run.task_timeout_s
        if self._index_deadline is not None:
            deadline = min(deadline, self._index_deadline)
        try:
            async with asyncio.timeout_at(deadline):
                await grow(expander, self.spec.search)
            return TaskStatus.COMMITTED
        except TimeoutError:
            which = "index deadline" if self._past_index_deadline() else f"task timeout ({self.spec.run.task_timeout_s:g} s)"
            task = expander.tree.task
            log.warning("task %d: %s reached; storing what was grown as timed out", task, which,
                        extra={"task": task, "tree": task, "status": TaskStatus.TIMED_OUT.value,
                               "nodes": expander.tree.size, "llm_requests": expander.llm_requests})
            settle(expander, self.spec.search, StopReason.TIMEOUT)
            return TaskStatus.TIMED_OUT

    def _meta(self, expander: Expander) -> TreeMeta:
        return TreeMeta(
            sweep=self.spec.name,
            env=self.spec.tasks.env,
            algorithm=self.spec.search.algorithm,
            model=self.model_name,
            seed=self.spec.seed,
            instructions=expander.instructions,
            show_valid_actions=expander.show_valid_actions,
        )

    @property
    def _requests_are(self) -> str:
        """What the policy's requests are, in the words of the run's summary."""
        return "policy samples (no LLM)" if self.spec.policy.kind == "uniform" else "LLM requests"

    def _finished(self, outcome: TaskOutcome) -> TaskOutcome:
        """Count and log a task that is done with (failures logged their own line)."""
        metrics.TASKS_DONE.labels(outcome.status.value).inc()
        metrics.NODES_GROWN.inc(outcome.nodes)
        if outcome.status is not TaskStatus.FAILED:
            log.info("task %d finished: %s, %d nodes, %d %s in %.1f s", outcome.task, outcome.status.value,
                     outcome.nodes, outcome.llm_requests, self._requests_are, outcome.seconds,
                     extra=outcome.log_fields())
        return outcome
