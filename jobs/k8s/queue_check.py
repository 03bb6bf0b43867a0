"""Preflight of what a spec names for scheduling: its Kueue LocalQueues and its PriorityClass.

A Job labelled with a LocalQueue that does not exist stays suspended for ever: Kueue creates no
Workload for it, or one that waits with QuotaReserved False, "LocalQueue ... doesn't exist"
(https://kueue.sigs.k8s.io/docs/concepts/local_queue/). A pod naming a PriorityClass that does not
exist is rejected by the Priority admission plugin, so the Job makes no pods at all
(https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/#priorityclass).
LocalQueues are namespaced (`localqueues.kueue.x-k8s.io`, the submitter's Role may get them);
PriorityClasses are cluster-scoped (`priorityclasses.scheduling.k8s.io`), which a namespaced
account usually cannot read: forbidden becomes a warning, not a refusal.
"""

from __future__ import annotations

from urllib.parse import quote

from thicket.errors import BadInput
from thicket.k8s.client import Forbidden, Kube, NotFound
from thicket.spec import SweepSpec

PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


def _queue_fields(spec: SweepSpec) -> list[tuple[str, str]]:
    """(field, LocalQueue name) the spec names."""
    c = spec.cluster
    named = [("cluster.queue", c.queue), ("cluster.aggregate.queue", c.aggregate.queue)]
    return [(field, name) for field, name in named if name]


def check_local_queues(kube: Kube, spec: SweepSpec, warnings: list[str]) -> None:
    ns = spec.cluster.namespace
    for field, name in _queue_fields(spec):
        try:
            found = kube.get("LocalQueue", ns, name)
        except Forbidden:
            warnings.append(f"cannot read localqueue/{name} (forbidden): {field} not checked; apply k8s/rbac.yaml")
            continue
        if found is None:
            raise BadInput(f"{field}: Kueue LocalQueue {name!r} not found in namespace {ns!r}: its Jobs would stay "
                           "suspended; create it (kubectl get localqueues -n NS lists them) or fix the name")


def check_priority_class(kube: Kube, spec: SweepSpec, warnings: list[str]) -> None:
    name = spec.cluster.priority_class_name
    if not name:
        return
    try:
        kube.request("GET", f"{PRIORITY_CLASSES}/{quote(name)}")
    except Forbidden:
        warnings.append(f"cannot read priorityclass/{name} (forbidden: a cluster-scoped read): "
                        "cluster.priority_class_name not checked")
    except NotFound:
        raise BadInput(f"cluster.priority_class_name: PriorityClass {name!r} does not exist: the API would reject "
                       "every pod; create it (kubectl get priorityclasses lists them) or fix the name") from None


def check_scheduling_refs(kube: Kube, spec: SweepSpec, warnings: list[str]) -> None:
    check_local_queues(kube, spec, warnings)
    check_priority_class(kube, spec, warnings)
