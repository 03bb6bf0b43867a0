"""The spec's `cluster.ephemeral_storage`: the local disk of each container."""

from __future__ import annotations

from pydantic import Field, field_validator

from thicket.cluster_spec.base import ClusterModel
from thicket.cluster_spec.values import parse_quantity


class EphemeralStorage(ClusterModel):
    """Local disk of each container: its /tmp emptyDir's sizeLimit, and (with LOG_ALLOWANCE for its
    logs) its ephemeral-storage request and limit. A container past its limit is evicted by the kubelet
    as a limit violation (which the Job counts), before it can fill the node's disk."""

    worker: str = Field("2Gi", description="the worker's /tmp")
    env: str = Field("2Gi", description="each env sidecar's /tmp")
    vllm: str = Field("10Gi", description="vLLM's /tmp: torch.compile, Triton and CUDA-graph caches")
    aggregate: str = Field("20Gi", description="the aggregation's /tmp")
    model_cache: str | None = Field(
        None, description="the per-pod model emptyDir when model_cache.claim is null (default: from the "
        "model's size, 3 bytes a parameter + 4Gi, else 100Gi)"
    )

    @field_validator("worker", "env", "vllm", "aggregate", "model_cache")
    @classmethod
    def quantity(cls, value: str | None) -> str | None:
        if value is not None:
            parse_quantity(value)
        return value
