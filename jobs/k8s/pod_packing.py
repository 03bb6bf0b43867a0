"""Small GPU pods packed onto the large GPU nodes they are sent to.

A pod of fewer GPUs than its node has leaves the rest for other pods only if the scheduler puts
them together. kube-scheduler's default scoring (NodeResourcesFit, LeastAllocated) prefers the
emptiest node, so without help 1-GPU pods spread over 8-GPU nodes, each node partly used and kept
up by one pod (https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/).
The rollout pods of a GPU sweep therefore carry a preferred pod affinity to the nodes that already
run the sweep's rollout pods (topology kubernetes.io/hostname,
https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity).
In the default scheduler profile InterPodAffinity scores with weight 2 and NodeResourcesFit with 1
(https://kubernetes.io/docs/reference/scheduling/config/#scheduling-plugins), so a node that holds
the sweep's pods and has a GPU free outscores an empty one. It is a preference: a full node is
filtered out and the next pod goes elsewhere. A node's preemption then ends all the pods it holds
(thicket.k8s.fault_price prices that).
"""

from __future__ import annotations

from typing import Any

from thicket.k8s.names import COMPONENT_LABEL, SWEEP_LABEL

HOSTNAME = "kubernetes.io/hostname"
PACKING_WEIGHT = 100  # the largest a preferred term may have


def packing_affinity(sweep: str) -> dict[str, Any]:
    """The rollout pod's preferred affinity to nodes that run the sweep's other rollout pods."""
    selector = {"matchLabels": {SWEEP_LABEL: sweep, COMPONENT_LABEL: "rollout"}}
    term = {"weight": PACKING_WEIGHT, "podAffinityTerm": {"labelSelector": selector, "topologyKey": HOSTNAME}}
    return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}


def packing_lines(request: Any, selected: list[Any]) -> list[str]:
    """What validate says when the node types cluster.node_selector picks have more GPUs than one pod
    takes. `request` is node_fit's PodRequest, `selected` its Fits of the picked node types."""
    shared = [f for f in selected if f.pods > 1 and request.gpus and f.node.gpus > request.gpus]
    if not shared:
        return []
    nodes = ", ".join(f"{f.node.name} ({f.node.gpus} GPUs, {f.pods} pods a node)" for f in shared)
    return [f"packing pods of {request.gpus} GPU(s) on {nodes}: they prefer nodes that run the sweep's pods "
            "(a preferred podAffinity); a node's preemption ends the pods it holds (priced below)"]
