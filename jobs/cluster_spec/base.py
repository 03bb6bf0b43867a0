"""The base of the `cluster` section's models: a key the model does not know is an error."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ClusterModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
