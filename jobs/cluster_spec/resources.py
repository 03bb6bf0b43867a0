"""The spec's `cluster.resources`: CPU and memory requests and limits of each container."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from thicket.cluster_spec.base import ClusterModel
from thicket.cluster_spec.values import parse_quantity, qualified_name


class Resources(ClusterModel):
    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)

    @field_validator("requests", "limits", mode="before")
    @classmethod
    def quantities(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        out = {}
        for name, amount in value.items():
            if isinstance(amount, bool) or not isinstance(amount, (str, int, float)):
                raise ValueError(f"{name}: expected a quantity like 500m, 2 or 16Gi, got {amount!r}")
            if "gpu" in str(name):
                raise ValueError(f"{name}: set GPUs with cluster.gpus, not in resources")
            if not qualified_name(str(name)):
                raise ValueError(f"{name!r} is not a resource name")
            parse_quantity(amount)
            out[str(name)] = str(amount)
        return out

    @model_validator(mode="after")
    def requests_within_limits(self) -> Resources:
        for name, amount in self.requests.items():
            if name in self.limits and parse_quantity(amount) > parse_quantity(self.limits[name]):
                raise ValueError(f"requests.{name} ({amount}) is above limits.{name} ({self.limits[name]})")
        return self


def _res(cpu: str, memory: str, memory_limit: str | None = None) -> Resources:
    return Resources(requests={"cpu": cpu, "memory": memory}, limits={"memory": memory_limit or memory})


class ContainerResources(ClusterModel):
    vllm: Resources = Field(default_factory=lambda: _res("4", "32Gi"),
                            description="default: 4 CPUs + 2 per GPU past the first, and memory from the model's size "
                                        "(thicket.k8s.vllm_memory)")
    worker: Resources = Field(default_factory=lambda: _res("1", "2Gi", "4Gi"))
    env: Resources = Field(default_factory=lambda: _res("500m", "1Gi", "2Gi"))
    aggregate: Resources = Field(default_factory=lambda: _res("2", "8Gi"))
