"""The canary (`thicket submit`, unless --no-canary): a rollout Job that submit creates starts with
parallelism 1, and scales to the spec's only once index 0's worker committed its first shard (or the
index succeeded); when index 0 fails, or its worker has not started by cluster.start_allowance_s, the
Job is stopped (suspended, or its Kueue Workload deactivated: thicket.k8s.kueue) and submit fails
naming the reason (thicket.k8s.pod_reasons). A fault in every pod so costs one pod's one attempt
(thicket.k8s.fault_price)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.index_sets import parse_index_set
from thicket.k8s.client import Forbidden, Kube
from thicket.k8s.job_wait import finished, job_state
from thicket.k8s.kueue import scale, stop
from thicket.k8s.names import WORKER
from thicket.k8s.pod_reasons import (
    FATAL_WAITING,
    ended_reason,
    index_row,
    latest_warnings,
    phase,
    pod_index,
    stuck_container,
    worker_exit,
)
from thicket.k8s.start_watch import JOB_NAME_LABEL, StartWatch, disrupted, worker_started
from thicket.k8s.status_view import format_duration
from thicket.k8s.storage_class import claim_check
from thicket.shards.storage import CommitStatus
from thicket.spec import SweepSpec

Obj = dict[str, Any]

CANARY_POLL_S = 10.0
COMMITTED = '"commit"'  # the JSON field of the worker's "shard committed" line


def canary_job(kube: Kube, job: Obj, echo: Callable[[str], None]) -> tuple[Obj, int | None]:
    """The rollout Job to create for a canary (parallelism 1) and the parallelism to scale to; the Job
    unchanged (and None) when it exists already or has nothing to scale."""
    meta, want = job["metadata"], int(job["spec"].get("parallelism") or 1)
    if kube.get("Job", meta["namespace"], meta["name"]) is not None:
        echo(f"note: job/{meta['name']} exists: the canary applies to a rollout Job that submit creates; no canary run")
        return job, None
    if want <= 1 or int(job["spec"].get("completions") or 1) <= 1:
        return job, None  # one pod at a time anyway
    first = copy.deepcopy(job)
    first["spec"]["parallelism"] = 1  # parallelism can be patched later; completions cannot
    return first, want


def canary_timeout(spec: SweepSpec, job: Obj) -> float:
    """How long the canary waits for index 0's first committed shard: what its first tree may take
    (start allowance, --wait-ready-timeout, one task's deadline, the shard's wait and its commit's
    retries), at most the pod's activeDeadlineSeconds, after which the pod is gone anyway."""
    from thicket.k8s.fault_price import job_shape

    run, shape = spec.run, job_shape(job)
    task = min(run.task_timeout_s, run.index_timeout_s or run.task_timeout_s)
    first = spec.cluster.start_allowance_s + shape.wait_ready_s + task + run.shard_wait_s + spec.storage.retry_deadline_s
    return float(min(shape.active_deadline_s, first))


def run_canary(kube: Kube, spec: SweepSpec, job: Obj, parallelism: int, echo: Callable[[str], None],
               timeout_s: float | None = None, interval_s: float = CANARY_POLL_S,
               sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None) -> None:
    """Wait for the canary, index 0 of a rollout Job created with parallelism 1: once its worker logged
    its first committed shard (or the index succeeded), scale the Job to `parallelism`
    (thicket.k8s.kueue). When it fails (a failed pod, a failed index or Job, a container that cannot
    start, no worker by cluster.start_allowance_s, a model cache that cannot bind) or times out (by
    default canary_timeout), stop the Job (suspend it, or deactivate its Kueue Workload: no more pods;
    the failed pod stays for `thicket logs`) and raise, naming the reason (thicket.k8s.pod_reasons). A
    pod with the DisruptionTarget condition (preempted, evicted, drained) is no failure: the Job's
    Ignore rule replaces it and the canary waits for the new one."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    sleep, clock = sleep or time.sleep, clock or time.monotonic  # looked up now: tests patch time
    timeout_s = timeout_s if timeout_s is not None else canary_timeout(spec, job)
    start = clock()
    check = claim_check(kube, spec)
    watch = StartWatch(spec.cluster.start_allowance_s, clock)
    echo(f"job/{name}: canary: index 0 runs alone until its first committed shard (up to {format_duration(timeout_s)}) "
         f"before scaling to parallelism {parallelism}")
    last = None
    while True:
        live = kube.get("Job", ns, name)
        if live is None:
            raise Unavailable(f"job/{name} was deleted during the canary: nothing scaled")
        status = live.get("status") or {}
        completed, failed = parse_index_set(status.get("completedIndexes")), parse_index_set(status.get("failedIndexes"))
        pods = sorted((p for p in kube.list("Pod", ns, f"{JOB_NAME_LABEL}={name}") if pod_index(p) == 0),
                      key=lambda p: p["metadata"].get("creationTimestamp") or "")
        if 0 in completed or committed_shard(kube, ns, pods[-1:]):
            what = "succeeded" if 0 in completed else "committed its first shard"
            scale(kube, live, parallelism, echo, sleep=sleep, clock=clock)
            echo(f"job/{name}: canary index 0 {what} in {format_duration(clock() - start)}: parallelism 1 -> {parallelism}")
            return
        warnings = _pod_warnings(kube, ns, pods[-1:])
        ended = next((p for p in pods if phase(p) == "Failed" and not disrupted(p)), None)
        stuck = next((r for p in pods[-1:] if (r := stuck_container(p)) and r.text.split(": ")[-1] in FATAL_WAITING), None)
        late = watch.late(pods[-1:])
        if ended is not None or stuck is not None or late is not None or 0 in failed or finished(live):
            if ended is not None:
                why = ended_reason(ended, warnings.get(ended["metadata"]["name"]), worker_exit(ended))
                text, detail = why.text, why.detail
            elif stuck is not None:
                text, detail = stuck.text, stuck.detail
            elif late is not None:
                text, detail = late, index_row(0, completed, failed, pods, warnings, "no pod yet").reason
            else:
                row = index_row(0, completed, failed, pods, warnings, f"the job is {job_state(live)}")
                text, detail = row.reason, row.detail
            how = stop(kube, live)
            raise ThicketError(
                f"canary failed: job/{name} index 0: {text}" + (f": {detail}" if detail else "") +
                f"; {how}, nothing scaled and no aggregation Job created (logs: `thicket logs {spec.name} "
                f"--index 0`); fix it, then `thicket cancel {spec.name}` and submit again"
            )
        if check is not None:
            try:
                check()
            except BadInput:
                stop(kube, live)
                raise
        if clock() - start >= timeout_s:
            row = index_row(0, completed, failed, pods, warnings, "no pod yet")
            how = stop(kube, live)
            raise Unavailable(
                f"canary: job/{name} index 0 committed no shard within {format_duration(timeout_s)} ({row.reason}"
                + (f": {row.detail}" if row.detail else "") + f"); {how}, nothing scaled: "
                f"see `thicket status {spec.name}`, then `thicket cancel {spec.name}` and submit again"
            )
        line = index_row(0, completed, failed, pods, warnings, "no pod yet").reason
        if line != last:
            echo(f"job/{name}: canary index 0: {line}")
            last = line
        sleep(interval_s)


def committed_shard(kube: Kube, namespace: str, pods: list[Obj]) -> bool:
    """Whether the worker's log (JSON lines) says it committed a shard: a line with "commit":
    "committed" (thicket.rollout.worker), read through the pods/log API."""
    for pod in (p for p in pods if worker_started(p)):
        text = b"".join(kube.logs(namespace, pod["metadata"]["name"], WORKER, False, None)).decode(errors="replace")
        for line in text.splitlines():
            if COMMITTED in line and _committed(line):
                return True
    return False


def _committed(line: str) -> bool:
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    return isinstance(entry, dict) and entry.get("commit") == CommitStatus.COMMITTED.value


def _pod_warnings(kube: Kube, namespace: str, pods: list[Obj]) -> dict[str, Obj]:
    """Pod name -> its latest Warning Event, read per pod (fieldSelector involvedObject.name)."""
    events: list[Obj] = []
    for pod in pods:
        try:
            events += kube.list("Event", namespace, "", fields=f"involvedObject.name={pod['metadata']['name']},type=Warning")
        except Forbidden:
            return {}
    return latest_warnings(events)
