"""Where a sweep's pods may run: node selectors, tolerations and the Kueue queue (of the rollout
pods in `cluster`, of the aggregation pods in `cluster.aggregate`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from thicket.cluster_spec.base import ClusterModel
from thicket.cluster_spec.values import DNS_SUBDOMAIN, label_value, qualified_name


class Toleration(ClusterModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, alias="tolerationSeconds")

    @model_validator(mode="after")
    def consistent(self) -> Toleration:
        if self.key is not None and not qualified_name(self.key):
            raise ValueError(f"key {self.key!r} is not a valid label key")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator Exists")
        if self.value and not label_value(self.value):
            raise ValueError(f"value {self.value!r} is not a valid label value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self

    def manifest(self) -> dict:
        out: dict = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


def checked_labels(value: dict[str, str]) -> dict[str, str]:
    for key, item in value.items():
        if not qualified_name(key):
            raise ValueError(f"{key!r} is not a valid label key")
        if not label_value(item):
            raise ValueError(f"{key}: {item!r} is not a valid label value")
    return value


def _queue(value: str | None) -> str | None:
    if value is not None and not (label_value(value) and DNS_SUBDOMAIN.match(value)):
        raise ValueError(f"{value!r} is not a valid Kueue queue name (a DNS-1123 name of at most 63 characters)")
    return value


NodeSelector = Annotated[dict[str, str], AfterValidator(checked_labels)]
QueueName = Annotated[str | None, AfterValidator(_queue)]
