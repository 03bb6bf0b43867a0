"""Why a queued Job waits: its Kueue Workload's conditions, for `thicket status`.

Kueue labels the Workload it creates for a Job with the Job's UID (`kueue.x-k8s.io/job-uid`) and
makes the Job its controller owner; its `status.conditions` say where admission stands
(https://kueue.sigs.k8s.io/docs/tasks/troubleshooting/troubleshooting_jobs/): QuotaReserved False
with reason Pending and a message such as "couldn't assign flavors to pod set main: insufficient
unused quota for nvidia.com/gpu ...", Admitted, Evicted (reason Preempted, PodsReadyTimeout,
InactiveWorkload, ...). Reading them needs `get/list workloads.kueue.x-k8s.io` (k8s/rbac.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from thicket.k8s.client import Forbidden, Kube, NotFound, _one_line
from thicket.k8s.kueue import workloads
from thicket.k8s.names import QUEUE_LABEL

Obj = dict[str, Any]



class WorkloadCondition(str, Enum):
    """The Workload conditions `thicket status` reports, in the order admission passes them."""

    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    FINISHED = "Finished"


@dataclass(frozen=True)
class Condition:
    type: WorkloadCondition
    status: bool
    reason: str
    message: str

    def text(self) -> str:
        said = f" ({self.reason})" if self.reason else ""
        return f"{self.type.value} {self.status}{said}" + (f": {self.message}" if self.message else "")


@dataclass(frozen=True)
class QueueState:
    """A queued Job's admission: its LocalQueue, its Workload's name and conditions, or why unread."""

    queue: str
    workload: str | None = None
    conditions: tuple[Condition, ...] = ()
    note: str | None = None

    def line(self) -> str:
        if self.note:
            return f"queue      {self.queue}: {self.note}"
        if not self.conditions:
            return f"queue      {self.queue}: workload/{self.workload} has no conditions yet (Kueue has not looked at it)"
        return f"queue      {self.queue}: workload/{self.workload}: " + "; ".join(c.text() for c in self.conditions)

    def reason(self) -> str | None:
        """Why the Job waits, for its idle indexes: an eviction, else the first admission step not passed."""
        for cond in self.conditions:
            if cond.type is WorkloadCondition.EVICTED and cond.status:
                return f"evicted by Kueue ({cond.reason}): {cond.message}"
        for cond in self.conditions:
            if cond.type in (WorkloadCondition.QUOTA_RESERVED, WorkloadCondition.ADMITTED) and not cond.status:
                return f"waiting in Kueue queue {self.queue} ({cond.reason}): {cond.message}"
        return None


def conditions(workload: Obj) -> tuple[Condition, ...]:
    known = {c.value for c in WorkloadCondition}
    order = list(WorkloadCondition)
    found = [Condition(WorkloadCondition(c["type"]), c.get("status") == "True", c.get("reason") or "",
                       _one_line(c.get("message") or "")[:300])
             for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") in known]
    return tuple(sorted(found, key=lambda c: order.index(c.type)))


def job_workload(kube: Kube, job: Obj) -> Obj | None:
    """The Workload of the Job (thicket.k8s.kueue.workloads), if Kueue made one yet."""
    return next(iter(workloads(kube, job)), None)


def queue_state(kube: Kube, job: Obj) -> QueueState | None:
    """The Job's Kueue admission state; None for a Job of no queue."""
    queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    if not queue:
        return None
    try:
        workload = job_workload(kube, job)
    except Forbidden as err:
        return QueueState(queue, note=f"Workload not read ({_one_line(str(err))[:200]}; apply k8s/rbac.yaml)")
    except NotFound:  # the kueue.x-k8s.io API is not served: Kueue is not installed
        return QueueState(queue, note="no Kueue Workload API on this cluster: is Kueue installed?")
    if workload is None:
        return QueueState(queue, note="no Workload for the Job yet: is Kueue running and does the LocalQueue exist?")
    return QueueState(queue, workload["metadata"]["name"], conditions(workload))
