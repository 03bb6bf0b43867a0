"""Stopping and scaling a rollout Job, the Kueue way when it is queued (the queue label).

A Job of a Kueue LocalQueue is created suspended, and Kueue unsuspends it once it admits the Job's
Workload (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/). Kueue, not its owner, then decides
`spec.suspend`: a Job suspended by hand while its Workload is admitted is unsuspended again. To stop
one, deactivate its Workload (`spec.active: false`, the Workload API): Kueue evicts it, suspends the
Job (its pods are deleted; suspension is not a failure the Job counts) and does not admit it again
until it is activated. Changing `parallelism` of a running admitted Job makes Kueue recreate its
Workload, which suspends and requeues the Job; without Kueue's elastic-job support, thicket changes
it only while the Job is stopped: deactivate, wait for its pods to go, patch, activate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from thicket.errors import Unavailable
from thicket.k8s.client import Kube
from thicket.k8s.names import QUEUE_LABEL

Obj = dict[str, Any]

STOP_WAIT_S = 600.0  # for a stopped Job's pods to go (their grace period: the worker saves its trees)


def queued(job: Obj) -> bool:
    return QUEUE_LABEL in (job["metadata"].get("labels") or {})


JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # Kueue labels a Job's Workload with the Job's UID


def workloads(kube: Kube, job: Obj) -> list[Obj]:
    """The Kueue Workloads of the Job: by Kueue's job-uid label, else by their owner reference
    (Kueue sets the Job as their controller owner)."""
    meta = job["metadata"]
    uid = meta.get("uid") or ""
    found = kube.list("Workload", meta["namespace"], f"{JOB_UID_LABEL}={uid}") if uid else []
    return found or [w for w in kube.list("Workload", meta["namespace"], "")
                     if any(ref.get("uid") == uid for ref in w["metadata"].get("ownerReferences") or [])]


def set_active(kube: Kube, job: Obj, active: bool) -> int:
    """Set spec.active of the Job's Workloads; how many it changed."""
    changed = 0
    for workload in workloads(kube, job):
        if (workload.get("spec") or {}).get("active", True) != active:
            kube.patch("Workload", workload["metadata"]["namespace"], workload["metadata"]["name"],
                       {"spec": {"active": active}})
            changed += 1
    return changed


def stop(kube: Kube, job: Obj) -> str:
    """Stop the Job's pods and keep it stopped: deactivate its Workload (queued), else suspend it.
    Returns what was done, for the message."""
    meta = job["metadata"]
    if queued(job):
        set_active(kube, job, False)
        # Not admitted yet (no Workload yet): a suspended Job stays suspended until Kueue admits it.
        kube.patch("Job", meta["namespace"], meta["name"], {"spec": {"suspend": True}})
        return "its Kueue Workload is deactivated (spec.active: false)"
    kube.patch("Job", meta["namespace"], meta["name"], {"spec": {"suspend": True}})
    return "the Job is suspended"


def scale(kube: Kube, job: Obj, parallelism: int, echo: Callable[[str], None],
          sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
    """Set the Job's parallelism: a plain patch, or for a queued Job stop, patch and activate again."""
    meta = job["metadata"]
    ns, name = meta["namespace"], meta["name"]
    if not queued(job):
        kube.patch("Job", ns, name, {"spec": {"parallelism": parallelism}})
        return
    set_active(kube, job, False)
    echo(f"job/{name}: Kueue Workload deactivated to change parallelism (index 0 resumes from its checkpoint)")
    _wait_no_pods(kube, ns, name, sleep, clock)
    kube.patch("Job", ns, name, {"spec": {"parallelism": parallelism}})
    live = kube.get("Job", ns, name) or job
    set_active(kube, live, True)  # a Workload Kueue recreated for the new parallelism is active already


def _wait_no_pods(kube: Kube, ns: str, name: str, sleep: Callable[[float], None], clock: Callable[[], float]) -> None:
    start = clock()
    while True:
        live = kube.get("Job", ns, name)
        if live is None:
            raise Unavailable(f"job/{name} was deleted while it was scaled")
        if not (live.get("status") or {}).get("active"):
            return
        if clock() - start > STOP_WAIT_S:
            raise Unavailable(f"job/{name}: its pods did not stop within {STOP_WAIT_S:g} s of its Workload's "
                              "deactivation; is Kueue running?")
        sleep(5.0)
