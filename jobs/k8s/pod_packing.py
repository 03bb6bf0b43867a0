"""Whether small GPU pods share the large GPU nodes they are sent to (`thicket validate`'s warning).

A pod of fewer GPUs than its node has leaves the rest for other pods only if the scheduler puts
them together. kube-scheduler's default scoring (NodeResourcesFit, LeastAllocated) prefers the
emptiest node, so 1-GPU pods spread over 8-GPU nodes, each node partly used and kept up by one pod;
packing them needs the MostAllocated or RequestedToCapacityRatio strategy, which a cluster admin
configures (https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/), or a
machine type of as many GPUs as the pod asks for.
"""

from __future__ import annotations

from typing import Any

PACKING_DOC = "https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/"


def packing_warnings(request: Any, selected: list[Any]) -> list[str]:
    """A warning when the node types cluster.node_selector picks have more GPUs than one pod takes.
    `request` is node_fit's PodRequest, `selected` its Fits of the picked node types."""
    shared = [f for f in selected if f.fits and request.gpus and f.node.gpus > request.gpus]
    if not shared:
        return []
    nodes = ", ".join(f"{f.node.name} ({f.node.gpus} GPUs, {f.pods} pods a node)" for f in shared)
    gpus = f"{request.gpus} GPU{'s' if request.gpus != 1 else ''}"
    return [f"pod packing: pods of {gpus} on {nodes}: the default scheduler spreads pods over the emptiest nodes "
            "(LeastAllocated), so each large node may run one pod and stay up for it. Pick a machine type with "
            f"{gpus} a node, set cluster.gpus to the node's GPUs (tensor parallel), or have the cluster's scheduler "
            f"score MostAllocated ({PACKING_DOC})"]
