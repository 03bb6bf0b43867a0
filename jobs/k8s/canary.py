"""The canary (`thicket submit --canary`): a rollout Job that submit creates starts with parallelism
1, and scales to the spec's only once index 0 succeeded; when index 0 fails, the Job is suspended
and submit fails naming the reason (thicket.k8s.pod_reasons)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.index_sets import parse_index_set
from thicket.k8s.client import Forbidden, Kube
from thicket.k8s.job_wait import finished, job_state
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
from thicket.k8s.status_view import format_duration
from thicket.k8s.storage_class import claim_check
from thicket.spec import SweepSpec

Obj = dict[str, Any]

CANARY_POLL_S = 10.0
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def canary_job(kube: Kube, job: Obj, echo: Callable[[str], None]) -> tuple[Obj, int | None]:
    """The rollout Job to create for a canary (parallelism 1) and the parallelism to scale to; the Job
    unchanged (and None) when it exists already or has nothing to scale."""
    meta, want = job["metadata"], int(job["spec"].get("parallelism") or 1)
    if kube.get("Job", meta["namespace"], meta["name"]) is not None:
        echo(f"note: job/{meta['name']} exists: --canary applies to a rollout Job that submit creates; no canary run")
        return job, None
    if want <= 1 or int(job["spec"].get("completions") or 1) <= 1:
        return job, None  # one pod at a time anyway
    first = copy.deepcopy(job)
    first["spec"]["parallelism"] = 1  # parallelism can be patched later; completions cannot
    return first, want


def run_canary(kube: Kube, spec: SweepSpec, job: Obj, parallelism: int, echo: Callable[[str], None],
               timeout_s: float = 3600, interval_s: float = CANARY_POLL_S,
               sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None) -> None:
    """Wait for the canary, index 0 of a rollout Job created with parallelism 1: once it succeeds, patch
    the Job's parallelism to `parallelism`. When it fails (a failed pod, a failed index or Job, a
    container that cannot start, a model cache that cannot bind) or times out, suspend the Job (no more
    pods; the failed pod stays for `thicket logs`) and raise, naming the reason (thicket.k8s.pod_reasons)."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    sleep, clock = sleep or time.sleep, clock or time.monotonic  # looked up now: tests patch time
    start = clock()
    check = claim_check(kube, spec)
    echo(f"job/{name}: canary: index 0 runs alone (up to {format_duration(timeout_s)}) before scaling to parallelism {parallelism}")
    last = None
    while True:
        live = kube.get("Job", ns, name)
        if live is None:
            raise Unavailable(f"job/{name} was deleted during the canary: nothing scaled")
        status = live.get("status") or {}
        completed, failed = parse_index_set(status.get("completedIndexes")), parse_index_set(status.get("failedIndexes"))
        if 0 in completed:
            kube.patch("Job", ns, name, {"spec": {"parallelism": parallelism}})
            echo(f"job/{name}: canary index 0 succeeded in {format_duration(clock() - start)}: "
                 f"parallelism 1 -> {parallelism}")
            return
        pods = sorted((p for p in kube.list("Pod", ns, f"{JOB_NAME_LABEL}={name}") if pod_index(p) == 0),
                      key=lambda p: p["metadata"].get("creationTimestamp") or "")
        warnings = _pod_warnings(kube, ns, pods[-1:])
        ended = next((p for p in pods if phase(p) == "Failed"), None)
        stuck = next((r for p in pods[-1:] if (r := stuck_container(p)) and r.text.split(": ")[-1] in FATAL_WAITING), None)
        if ended is not None or stuck is not None or 0 in failed or finished(live):
            if ended is not None:
                why = ended_reason(ended, warnings.get(ended["metadata"]["name"]), worker_exit(ended))
                text, detail = why.text, why.detail
            elif stuck is not None:
                text, detail = stuck.text, stuck.detail
            else:
                row = index_row(0, completed, failed, pods, warnings, f"the job is {job_state(live)}")
                text, detail = row.reason, row.detail
            _stop_canary(kube, ns, name)
            raise ThicketError(
                f"canary failed: job/{name} index 0: {text}" + (f": {detail}" if detail else "") +
                f"; the Job is suspended, nothing scaled and no aggregation Job created (logs: `thicket logs {spec.name} "
                f"--index 0`); fix it, then `thicket cancel {spec.name}` and submit again"
            )
        if check is not None:
            try:
                check()
            except BadInput:
                _stop_canary(kube, ns, name)
                raise
        if clock() - start >= timeout_s:
            row = index_row(0, completed, failed, pods, warnings, "no pod yet")
            _stop_canary(kube, ns, name)
            raise Unavailable(
                f"canary: job/{name} index 0 did not succeed within {format_duration(timeout_s)} ({row.reason}"
                + (f": {row.detail}" if row.detail else "") + f"); the Job is suspended, nothing scaled: "
                f"see `thicket status {spec.name}`, then `thicket cancel {spec.name}` and submit again"
            )
        line = index_row(0, completed, failed, pods, warnings, "no pod yet").reason
        if line != last:
            echo(f"job/{name}: canary index 0: {line}")
            last = line
        sleep(interval_s)


def _pod_warnings(kube: Kube, namespace: str, pods: list[Obj]) -> dict[str, Obj]:
    """Pod name -> its latest Warning Event, read per pod (fieldSelector involvedObject.name)."""
    events: list[Obj] = []
    for pod in pods:
        try:
            events += kube.list("Event", namespace, "", fields=f"involvedObject.name={pod['metadata']['name']},type=Warning")
        except Forbidden:
            return {}
    return latest_warnings(events)


def _stop_canary(kube: Kube, namespace: str, name: str) -> None:
    """Suspend the rollout Job: its running pods stop, no new ones start, its failed pods stay."""
    kube.patch("Job", namespace, name, {"spec": {"suspend": True}})
