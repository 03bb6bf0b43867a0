"""The worker: grow one tree per task, many at once, and commit each as a shard.

Tasks already committed in the store are skipped, so a rerun resumes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from thicket.envs import make_env
from thicket.envs.protocol import Env
from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.policy.base import Policy
from thicket.progress import TaskProgress
from thicket.search import grow, settle
from thicket.search.expand import Expander
from thicket.search.tree import StopReason
from thicket.shard import TreeMeta, tree_table
from thicket.spec import SweepSpec
from thicket.storage.shards import CommitStatus, committed_task_ids, write_shard
from thicket.storage.store import Store

log = logging.getLogger("thicket.worker")


class TaskStatus(StrEnum):
    COMMITTED = "committed"
    TIMED_OUT = "timed_out"  # committed, with the unfinished leaves marked timeout
    SKIPPED = "skipped"  # committed before (by an earlier run or another writer)
    FAILED = "failed"  # nothing committed: a rerun will try again


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


@dataclass
class WorkerReport:
    outcomes: list[TaskOutcome] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, *statuses: TaskStatus) -> int:
        return sum(1 for o in self.outcomes if o.status in statuses)

    @property
    def grown(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status in (TaskStatus.COMMITTED, TaskStatus.TIMED_OUT)]

    @property
    def failed(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status is TaskStatus.FAILED]


@dataclass
class Worker:
    spec: SweepSpec
    policy: Policy
    store: Store
    model_name: str
    progress: bool = True
    writer_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # Where each tree's env comes from (thicket.envs.sidecar.open_envs); default: in process.
    new_env: Callable[[], Env] | None = None

    @property
    def trees_in_flight(self) -> int:
        # Twice the request slots: while one tree steps its env or writes its shard,
        # another has a request ready, so the server's batch stays full.
        return self.spec.run.trees_in_flight or 2 * self.spec.policy.concurrency

    async def run(self, tasks: list[int]) -> WorkerReport:
        started = time.perf_counter()
        done_before = committed_task_ids(self.store)
        report = WorkerReport([TaskOutcome(t, TaskStatus.SKIPPED) for t in tasks if t in done_before])
        todo = asyncio.Queue[int]()
        for task in tasks:
            if task not in done_before:
                todo.put_nowait(task)
        with TaskProgress(total=len(tasks), done=len(report.outcomes), enabled=self.progress) as bar:

            async def drain() -> None:
                while not todo.empty():
                    outcome = await self.grow_task(todo.get_nowait())
                    report.outcomes.append(outcome)
                    bar.advance(outcome.nodes, outcome.solved)

            await asyncio.gather(*(drain() for _ in range(min(self.trees_in_flight, todo.qsize()) or 1)))
        report.outcomes.sort(key=lambda o: o.task)
        report.seconds = time.perf_counter() - started
        return report

    async def grow_task(self, task: int) -> TaskOutcome:
        started = time.perf_counter()
        env = self.new_env() if self.new_env else make_env(self.spec.tasks.env, **self.spec.tasks.env_args)
        try:
            x = await Expander.open(
                env,
                task,
                self.policy,
                self.spec.seed,
                max_depth=self.spec.search.max_depth,
                max_nodes=self.spec.search.max_nodes,
                show_valid_actions=self.spec.policy.show_valid_actions,
                dedupe=self.spec.search.dedupe,
            )
            status = await self._grow_within_deadline(x)
            commit = await asyncio.to_thread(self._commit, x)
        except (BadInput, asyncio.CancelledError):
            raise
        except Exception as err:  # one task's failure must not stop the others
            message = err.args[0] if isinstance(err, ThicketError) and err.args else repr(err)
            log.error("task %d failed: %s", task, message)
            kind = "unavailable" if isinstance(err, Unavailable) else "error"
            return TaskOutcome(task, TaskStatus.FAILED, seconds=time.perf_counter() - started, error=f"{kind}: {message}")
        finally:
            await env.close()
        if commit is CommitStatus.ALREADY_COMMITTED:
            status = TaskStatus.SKIPPED
        return TaskOutcome(
            task,
            status,
            nodes=x.tree.size,
            solved=x.tree.solved,
            generated_tokens=sum(len(n.reply.token_ids) for n in x.tree.nodes() if n.reply),
            llm_requests=x.llm_requests,
            seconds=time.perf_counter() - started,
        )

    async def _grow_within_deadline(self, x: Expander) -> TaskStatus:
        try:
            async with asyncio.timeout(self.spec.run.task_timeout_s):
                await grow(x, self.spec.search)
            return TaskStatus.COMMITTED
        except TimeoutError:
            log.warning("task %d timed out after %.0f s; storing what was grown", x.tree.task, self.spec.run.task_timeout_s)
            settle(x, self.spec.search, StopReason.TIMEOUT)
            return TaskStatus.TIMED_OUT

    def _commit(self, x: Expander) -> CommitStatus:
        meta = TreeMeta(
            sweep=self.spec.name,
            env=self.spec.tasks.env,
            algorithm=self.spec.search.algorithm,
            model=self.model_name,
            seed=self.spec.seed,
            instructions=x.instructions,
            show_valid_actions=x.show_valid_actions,
        )
        return write_shard(self.store, x.tree.task, tree_table(x.tree, meta), self.writer_id)
