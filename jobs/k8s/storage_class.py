"""The model cache's StorageClass: before submit, the class of a claim thicket creates exists (or the
cluster has a default one); while waiting, why a Pending claim will never bind."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from thicket.errors import BadInput
from thicket.k8s.client import Forbidden, Kube, NotFound
from thicket.k8s.names import serves_vllm
from thicket.spec import SweepSpec

Obj = dict[str, Any]


def check_storage_class(kube: Kube, spec: SweepSpec) -> None:
    """The StorageClass of a model-cache claim thicket creates exists (else the claim stays Pending and
    the prefetch Job waits its whole timeout). Unreadable StorageClasses (a namespaced Role): not checked."""
    cache, ns = spec.cluster.model_cache, spec.cluster.namespace
    if not (serves_vllm(spec) and cache.claim and cache.size):
        return
    try:
        if kube.get("PersistentVolumeClaim", ns, cache.claim) is not None:
            return  # kept as it is; a Pending one is caught while waiting (claim_problem)
        if cache.storage_class:
            if kube.storage_class(cache.storage_class) is None:
                raise BadInput(f"cluster.model_cache.storage_class: StorageClass {cache.storage_class!r} does not exist "
                               f"on the cluster{_classes(kube)}: set one that does (kubectl get storageclass)")
            return
        classes = kube.storage_classes()
    except Forbidden:
        return
    if not any(_is_default(sc) for sc in classes):
        names_ = ", ".join(sc["metadata"]["name"] for sc in classes) or "none"
        raise BadInput(f"cluster.model_cache.storage_class: not set, and the cluster has no default StorageClass "
                       f"(it has: {names_}): set cluster.model_cache.storage_class, or the claim stays Pending")


def _is_default(storage_class: Obj) -> bool:
    annotations = (storage_class.get("metadata") or {}).get("annotations") or {}
    return any(annotations.get(k) == "true" for k in ("storageclass.kubernetes.io/is-default-class",
                                                      "storageclass.beta.kubernetes.io/is-default-class"))


def _classes(kube: Kube) -> str:
    try:
        names_ = [sc["metadata"]["name"] for sc in kube.storage_classes()]
    except (Forbidden, NotFound):
        return ""
    return f" (it has: {', '.join(names_) or 'none'})"


MISSING_CLASS = re.compile(r'storageclass\.storage\.k8s\.io "([^"]+)" not found')
NO_CLASS = "no storage class is set"
# A block-storage class asked for ReadWriteMany: the provisioner refuses the access mode, in its
# own words. EBS CSI: 'Volume capabilities MULTI_NODE_MULTI_WRITER not supported. Only
# AccessModes[ReadWriteOnce] supported' (kubernetes-sigs/aws-ebs-csi-driver#2237); the in-tree GCE
# PD / EBS plugins: 'invalid AccessModes [ReadWriteMany]: only AccessModes [ReadWriteOnce
# ReadOnlyMany] are supported'; GCE PD CSI: 'specified multi writer with mount access type'. The
# external provisioner prefixes each with 'failed to provision volume with StorageClass "NAME"'.
ACCESS_MODE_REFUSED = re.compile(r'provision volume with StorageClass "([^"]+)".*?'
                                 r"(MULTI_NODE_\w+|invalid AccessModes|multi.?writer|access.?mode)", re.I | re.S)
RWX_CLASSES = "efs-sc on EKS (the EFS CSI driver), standard-rwx or premium-rwx on GKE (Filestore)"


def claim_problem(kube: Kube, namespace: str, claim: str) -> str | None:
    """Why a Pending model-cache claim will never bind: its StorageClass does not exist, or none is set
    and the cluster has no default. None while it is Bound, or Pending for a reason that may pass
    (WaitForFirstConsumer waits for the prefetch pod: that is normal)."""
    pvc = kube.get("PersistentVolumeClaim", namespace, claim)
    if pvc is None or (pvc.get("status") or {}).get("phase") != "Pending":
        return None
    fix = (f"a claim's class cannot change: delete it (kubectl -n {namespace} delete pvc {claim}) and set "
           "cluster.model_cache.storage_class to one that exists")
    name = (pvc.get("spec") or {}).get("storageClassName")
    if name:
        try:
            if kube.storage_class(name) is None:
                return f"persistentvolumeclaim/{claim} stays Pending: StorageClass {name!r} does not exist{_classes(kube)}: {fix}"
        except Forbidden:
            pass  # the claim's Events tell
    try:
        events = kube.list("Event", namespace, "", fields=f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={claim}")
    except Forbidden:
        return None
    for event in reversed(events):
        message = event.get("message") or ""
        if found := MISSING_CLASS.search(message):
            return (f"persistentvolumeclaim/{claim} stays Pending: StorageClass {found[1]!r} does not exist "
                    f"(event {event.get('reason')}){_classes(kube)}: {fix}")
        if found := ACCESS_MODE_REFUSED.search(message):
            mode = ", ".join((pvc.get("spec") or {}).get("accessModes") or ["ReadWriteMany"])
            return (f"persistentvolumeclaim/{claim} stays Pending: StorageClass {found[1]!r} cannot provision {mode} "
                    f"(event {event.get('reason')}: {_short(message)}); the model cache needs a class that can: "
                    f"{RWX_CLASSES}; {fix}")
        if NO_CLASS in message:
            return (f"persistentvolumeclaim/{claim} stays Pending: it names no StorageClass and the cluster has no "
                    f"default one (event {event.get('reason')}){_classes(kube)}: {fix}")
    return None


def _short(message: str, limit: int = 200) -> str:
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def claim_check(kube: Kube, spec: SweepSpec) -> Callable[[], None] | None:
    cache, ns = spec.cluster.model_cache, spec.cluster.namespace
    if not (serves_vllm(spec) and cache.claim):
        return None

    def check() -> None:
        if problem := claim_problem(kube, ns, cache.claim):
            raise BadInput(problem)

    return check
