"""`thicket run` and `thicket worker`: serve the policy, run the worker, summarise."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from thicket.envs.sidecar import open_envs
from thicket.errors import ThicketError, Unavailable
from thicket.policies import serve_policy
from thicket.spec import SweepSpec
from thicket.storage.store import open_store
from thicket.vllm_server import prefix_cache_counters
from thicket.worker import TaskStatus, Worker, WorkerReport


@dataclass(frozen=True)
class RunSummary:
    sweep_uri: str
    report: WorkerReport
    cache_hit_rate: float | None  # share of prompt tokens served from vLLM's prefix cache
    mean_in_flight: float = 0.0  # policy requests in flight, averaged over the run

    def lines(self) -> list[str]:
        r = self.report
        grown = r.grown
        nodes = sum(o.nodes for o in grown)
        solved = sum(o.solved for o in grown)
        tokens = sum(o.generated_tokens for o in grown)
        cache = f"{self.cache_hit_rate:.1%} of prompt tokens" if self.cache_hit_rate is not None else "n/a (no vLLM)"
        out = [
            f"sweep        {self.sweep_uri}",
            f"tasks        {len(r.outcomes)} ({len(grown)} grown, {r.count(TaskStatus.SKIPPED)} already committed, "
            f"{len(r.failed)} failed, {r.count(TaskStatus.TIMED_OUT)} timed out)",
            f"trees        {len(grown)}",
            f"nodes        {nodes}",
            f"successes    {solved} of {len(grown)} trees solved their task",
            f"tokens       {tokens} generated",
            f"prefix cache {cache}",
            f"time         {r.seconds:.1f} s",
        ]
        out += [f"failed task  {o.task}: {o.error}" for o in r.failed]
        return out


async def run_tasks(spec: SweepSpec, tasks: list[int], progress: bool = True) -> RunSummary:
    store = open_store(spec.sweep_uri, spec.storage.settings())
    store.check()  # bucket and credentials, before any model or LLM work
    store.put("spec.yaml", yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False).encode(), if_absent=True)
    async with open_envs(spec.tasks) as new_env, serve_policy(spec.policy) as served:
        before = await prefix_cache_counters(served.base_url) if served.base_url else None
        worker = Worker(spec, served.policy, store, served.model_name, progress=progress and spec.run.progress,
                        new_env=new_env)
        served.policy.meter.reset()
        report = await worker.run(tasks)
        in_flight = served.policy.meter.mean_in_flight
        after = await prefix_cache_counters(served.base_url) if served.base_url else None
    return RunSummary(store.uri, report, hit_rate(before, after), in_flight)


def hit_rate(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    if before is None or after is None:
        return None
    hits, queries = after[0] - before[0], after[1] - before[1]
    return hits / queries if queries > 0 else None


def raise_for_failures(summary: RunSummary) -> None:
    failed = summary.report.failed
    if not failed:
        return
    unavailable = [o for o in failed if o.error.startswith("unavailable")]
    message = f"{len(failed)} task(s) failed (first: task {failed[0].task}: {failed[0].error}); rerun to retry them"
    if unavailable:
        raise Unavailable(message)
    raise ThicketError(message)
