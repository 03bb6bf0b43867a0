"""Owner references: a sweep's ConfigMap, RBAC and network objects belong to its Jobs, so when the
Jobs' TTL (cluster.ttl_seconds_after_finished) or a `kubectl delete job` removes them, Kubernetes'
garbage collector removes those too. Each belongs to the rollout and the aggregation Job both: the
collector deletes an object only once all its owners are gone, and the aggregation Job outlives
the rollout.

An owner is named by its uid, which exists only once the Job is created: `thicket submit` adopts
the dependents after applying the Jobs (adopt). Before it deletes a Job to recreate it (--replace,
--resume), it releases them (release), or the collector would delete them under the new Job's pods.
Rendered manifests applied with kubectl carry no owner references (nothing knows the uids then).
"""

from __future__ import annotations

from typing import Any

from thicket.k8s.client import Kube
from thicket.k8s.names import COMPONENT_LABEL

Obj = dict[str, Any]

OWNED_KINDS = frozenset({"ConfigMap", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "PodMonitor"})
OWNER_COMPONENTS = ("rollout", "aggregate")  # not the prefetch Job: it may finish long before the rollout


def _dependents(objects: list[Obj]) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] in OWNED_KINDS]


def owner_references(kube: Kube, objects: list[Obj]) -> list[Obj]:
    """References to the sweep's live rollout and aggregation Jobs."""
    refs = []
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] != "Job" or meta["labels"].get(COMPONENT_LABEL) not in OWNER_COMPONENTS:
            continue
        live = kube.get("Job", meta["namespace"], meta["name"])
        if live is not None:
            refs.append({"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": live["metadata"]["uid"]})
    return refs


def adopt(kube: Kube, objects: list[Obj]) -> int:
    """Make the sweep's Jobs the owners of its other objects; returns how many changed."""
    refs = owner_references(kube, objects)
    if not refs:
        return 0
    changed = 0
    for obj in _dependents(objects):
        meta = obj["metadata"]
        live = kube.get(obj["kind"], meta["namespace"], meta["name"])
        if live is not None and live["metadata"].get("ownerReferences") != refs:
            kube.patch(obj["kind"], meta["namespace"], meta["name"], {"metadata": {"ownerReferences": refs}})
            changed += 1
    return changed


def release(kube: Kube, objects: list[Obj]) -> None:
    """Drop the owner references of the sweep's other objects (before its Jobs are deleted)."""
    for obj in _dependents(objects):
        meta = obj["metadata"]
        live = kube.get(obj["kind"], meta["namespace"], meta["name"])
        if live is not None and live["metadata"].get("ownerReferences"):
            kube.patch(obj["kind"], meta["namespace"], meta["name"], {"metadata": {"ownerReferences": None}})
