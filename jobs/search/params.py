"""Parameters shared by every search algorithm (each adds its own)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SearchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_depth: int = Field(20, ge=1, le=1000, description="actions per path at most")
    max_nodes: int = Field(2000, ge=2, description="nodes per tree at most (a safety budget)")
    max_llm_calls: int | None = Field(None, ge=1, description="LLM calls (sampled replies) per tree at most: a budget")
    temperature: float | None = Field(None, ge=0.0, le=5.0, description="overrides the policy's")
    dedupe: bool = Field(True, description="drop a sibling whose reply text repeats another's")
