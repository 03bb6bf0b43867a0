"""`thicket run` and `thicket worker`: serve the policy, run the worker, summarise."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import thicket.metrics as metrics
from thicket.errors import DeadlineExceeded, ThicketError, Unavailable
from thicket.rollout.envs import open_envs
from thicket.rollout.served_policy import serve_policy
from thicket.rollout.spec_record import record_spec
from thicket.rollout.worker import TaskOutcome, TaskStatus, Worker, WorkerReport
from thicket.shards.storage import committed_task_ids
from thicket.spec import SweepSpec
from thicket.storage import open_store
from thicket.storage.store import Store
from thicket.vllm_server import prefix_cache_counters


@dataclass(frozen=True)
class RunSummary:
    sweep_uri: str
    report: WorkerReport
    cache_hit_rate: float | None  # share of prompt tokens served from vLLM's prefix cache
    mean_in_flight: float = 0.0  # policy requests in flight, averaged over the run
    in_flight_limit: int = 0  # the requests-in-flight limit at the end (tuned with concurrency: auto)
    nothing_to_grow: bool = False  # every task was committed before: no server was started
    llm: bool = True  # the policy asks an LLM (the uniform baseline does not: no in-flight line)

    def lines(self) -> list[str]:
        r = self.report
        if self.nothing_to_grow:
            return [f"sweep        {self.sweep_uri}",
                    ("tasks        the task's tree is already committed" if len(r.outcomes) == 1 else
                     f"tasks        all {len(r.outcomes)} trees already committed")
                    + ": nothing to grow (no server started)"]
        grown = r.grown
        nodes = sum(o.nodes for o in grown)
        solved = sum(o.solved for o in grown)
        tokens = sum(o.generated_tokens for o in grown)
        cache = f"{self.cache_hit_rate:.1%} of prompt tokens" if self.cache_hit_rate is not None else "n/a (no vLLM)"
        out = [
            f"sweep        {self.sweep_uri}",
            f"tasks        {len(r.outcomes)} ({len(grown)} grown, {r.count(TaskStatus.SKIPPED)} already committed, "
            f"{len(r.failed)} failed, {r.count(TaskStatus.TIMED_OUT)} timed out, {len(r.not_run)} not run)",
            f"trees        {len(grown)} grown in this run (nodes, successes and tokens below count these)",
            f"nodes        {nodes}",
            f"successes    {solved} of {len(grown)} {'tree' if len(grown) == 1 else 'trees'} solved their task",
            f"tokens       {tokens} generated",
            f"prefix cache {cache}",
        ]
        if resumed := r.resumed:
            out.insert(3, f"resumed      {len(resumed)} {'tree' if len(resumed) == 1 else 'trees'} from checkpoints: "
                          f"{sum(o.resumed_nodes for o in resumed)} nodes and {sum(o.resumed_calls for o in resumed)} "
                          "LLM calls brought back (not asked again)")
        if self.llm:
            out.append(f"in flight    {self.mean_in_flight:.1f} LLM requests on average "
                       f"(limit at the end {self.in_flight_limit})")
        out.append(f"time         {r.seconds:.1f} s")
        out += [f"failed task  {o.task}: {o.error}" for o in r.failed]
        return out


def checked_store(spec: SweepSpec, allow_spec_change: bool = False) -> Store:
    """The sweep's store, its bucket and credentials checked (before any model or LLM work), and
    `spec` checked against its stored spec.yaml (written on the first run): see record_spec."""
    store = open_store(spec.sweep_uri, spec.storage.settings())
    store.check()
    record_spec(store, spec, allow_spec_change)
    return store


async def run_tasks(spec: SweepSpec, tasks: list[int], progress: bool = True, store: Store | None = None,
                    allow_spec_change: bool = False) -> RunSummary:
    """Grow and commit `tasks`; `store`: the sweep's store from checked_store (default: open and
    check it here, with `allow_spec_change`)."""
    store = store or checked_store(spec, allow_spec_change)
    done_before = committed_task_ids(store)
    if tasks and set(tasks) <= done_before:  # a rerun of a finished sweep: no vLLM, no env server
        metrics.TASKS_DONE.labels(TaskStatus.SKIPPED.value).inc(len(tasks))
        return RunSummary(store.uri, WorkerReport([TaskOutcome(t, TaskStatus.SKIPPED) for t in sorted(tasks)]), None,
                          nothing_to_grow=True)
    async with open_envs(spec.tasks) as new_env, serve_policy(spec.policy) as served:
        before = await cache_counters(served.base_url)
        worker = Worker(spec, served.policy, store, served.model_name, progress=progress and spec.run.progress,
                        new_env=new_env)
        served.policy.meter.reset()
        async with cache_hit_rate_gauge(served.base_url, before):
            report = await worker.run(tasks)
        in_flight, limit = served.policy.meter.mean_in_flight, served.policy.slots.limit
        after = await cache_counters(served.base_url)
    rate = hit_rate(before, after)
    if rate is not None:
        metrics.PREFIX_CACHE_HIT_RATIO.set(rate)
    return RunSummary(store.uri, report, rate, in_flight, limit, llm=spec.policy.kind != "uniform")


async def cache_counters(base_url: str | None) -> tuple[float, float] | None:
    """vLLM's prefix-cache counters; None without vLLM, or when it does not answer (a reading
    missed is no reason to fail a run, nor to hide why it failed)."""
    if not base_url:
        return None
    try:
        return await prefix_cache_counters(base_url)
    except Unavailable:
        return None


@contextlib.asynccontextmanager
async def cache_hit_rate_gauge(base_url: str | None, before: tuple[float, float] | None,
                               period_s: float = 15.0) -> AsyncIterator[None]:
    """Keep thicket_prefix_cache_hit_ratio current while the block runs (where vLLM serves)."""

    async def poll() -> None:
        assert base_url is not None
        while True:
            await asyncio.sleep(period_s)
            rate = hit_rate(before, await cache_counters(base_url))
            if rate is not None:
                metrics.PREFIX_CACHE_HIT_RATIO.set(rate)

    poller = asyncio.create_task(poll()) if base_url and before else None
    try:
        yield
    finally:
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)


def hit_rate(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    if before is None or after is None:
        return None
    hits, queries = after[0] - before[0], after[1] - before[1]
    return hits / queries if queries > 0 else None


def raise_for_failures(summary: RunSummary) -> None:
    report = summary.report
    failed, not_run, unavailable = report.failed, report.not_run, report.unavailable
    if not_run and not failed:
        raise DeadlineExceeded(f"the index deadline passed with {len(not_run)} task(s) not run "
                               f"(first: task {not_run[0].task}); rerun to finish them")
    if not failed:
        return
    left = f" and {len(not_run)} not run" if not_run else ""
    first = unavailable[0] if unavailable else failed[0]
    message = f"{len(failed)} task(s) failed{left} (first: task {first.task}: {first.error}); rerun to retry them"
    raise Unavailable(message) if unavailable else ThicketError(message)
