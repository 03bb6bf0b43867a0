"""The spec's `cluster.model_cache` section: where every pod's vLLM finds its model.

A PersistentVolumeClaim shared by the sweep's pods (or an emptyDir per pod), the claim thicket may
create for it, and whether a prefetch Job fills it once before the rollout starts
(thicket.k8s.prefetch).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from thicket.cluster_spec.values import dns_subdomain, parse_quantity

AccessMode = Literal["ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce"]


class ModelCache(BaseModel):
    model_config = ConfigDict(extra="forbid")

    claim: str | None = Field(
        "thicket-models", description="PVC holding HF_HOME, shared by the sweep's pods; null: an emptyDir per pod "
        "(each pod downloads the model itself, and nothing is prefetched)"
    )
    path: str = Field("/models", description="where the cache is mounted in the vLLM container")
    hf_home: str = Field("/models/huggingface", description="HF_HOME inside the vLLM container")
    size: str | None = Field(
        None, description="create the claim with this size when it does not exist (e.g. 200Gi); null: it must "
        "exist already (k8s/examples/model-cache-pvc.yaml)"
    )
    storage_class: str | None = Field(
        None, description="storage class of a claim thicket creates (efs-sc on EKS, standard-rwx on GKE); "
        "null: the cluster's default class"
    )
    access_mode: AccessMode = Field(
        "ReadWriteMany", description="ReadWriteMany for pods on many nodes; ReadOnlyMany for a cache filled "
        "beforehand (prefetch false); ReadWriteOnce only when every pod runs on one node"
    )
    prefetch: bool = Field(
        True, description="a hub model: one Job downloads it into the claim before the rollout starts, and "
        "the pods' vLLM then runs with the hub offline"
    )
    prefetch_timeout_s: int = Field(3600, ge=60, description="how long `thicket submit` waits for the prefetch Job")

    @field_validator("claim", "storage_class")
    @classmethod
    def object_name(cls, value: str | None) -> str | None:
        return value if value is None else dns_subdomain(value)

    @field_validator("path", "hf_home")
    @classmethod
    def absolute(cls, value: str) -> str:
        if not value.startswith("/") or ".." in value.split("/"):
            raise ValueError(f"expected an absolute path, got {value!r}")
        return value.rstrip("/") or "/"

    @field_validator("size")
    @classmethod
    def quantity(cls, value: str | None) -> str | None:
        if value is not None and parse_quantity(value) <= 0:
            raise ValueError(f"expected a positive size like 200Gi, got {value!r}")
        return value

    @model_validator(mode="after")
    def consistent(self) -> ModelCache:
        explicit = self.model_fields_set
        if self.claim is None and explicit & {"size", "storage_class", "access_mode"}:
            raise ValueError("size, storage_class and access_mode describe a claim: set claim, or drop them "
                             "(claim null is an emptyDir per pod)")
        if self.claim is None and "prefetch" in explicit and self.prefetch:
            raise ValueError("prefetch: true needs a claim to fill (claim null is an emptyDir per pod)")
        if self.storage_class and self.size is None:
            raise ValueError("storage_class applies to a claim thicket creates: set size too, or set the class "
                             "on the claim you made")
        if self.access_mode == "ReadOnlyMany" and self.prefetch:
            raise ValueError("access_mode ReadOnlyMany: the prefetch Job cannot write the cache; fill it "
                             "beforehand and set prefetch: false")
        return self

    def prefetches(self, model: str) -> bool:
        """Whether a prefetch Job fills the cache with `model` (a hub id, not a path in the cache)."""
        return self.prefetch and self.claim is not None and not model.startswith("/")
