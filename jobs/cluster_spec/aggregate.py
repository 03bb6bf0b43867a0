"""The spec's `cluster.aggregate`: where and how the aggregation Jobs run."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from thicket.cluster_spec.base import ClusterModel
from thicket.cluster_spec.placement import NodeSelector, QueueName, Toleration
from thicket.cluster_spec.values import qualified_name

# Labels that GPU nodes carry (the GPU Operator's node feature discovery, GKE's accelerator pools,
# EKS's accelerated node groups): the aggregation pods stay off nodes that carry any of them.
GPU_NODE_LABELS = ("nvidia.com/gpu.present", "cloud.google.com/gke-accelerator", "k8s.amazonaws.com/accelerator")


def _label_keys(value: list[str]) -> list[str]:
    for key in value:
        if not qualified_name(key):
            raise ValueError(f"{key!r} is not a valid label key")
    return value


class AggregateSpec(ClusterModel):
    enabled: bool = Field(True, description="render the aggregation Jobs")
    node_selector: NodeSelector = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    avoid_node_labels: Annotated[list[str], AfterValidator(_label_keys)] = Field(
        default_factory=lambda: list(GPU_NODE_LABELS),
        description="the aggregation pods avoid nodes carrying any of these labels (a required nodeAffinity, "
        "DoesNotExist): GPU nodes by default; [] to turn it off",
    )
    queue: QueueName = Field(None, description="Kueue LocalQueue for the aggregation Jobs")
    backoff_limit: int = Field(2, ge=0, le=100)
    active_deadline_s: int = Field(
        6 * 3600, ge=60, description="each aggregation pod's deadline (activeDeadlineSeconds): it starts once "
        "the rollout has finished, so this bounds the aggregation's own work only"
    )
