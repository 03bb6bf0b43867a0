"""Dataset parameters: the optional `datasets` section of a sweep spec (CLI flags override)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from thicket.errors import BadInput


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SFTParams(_Strict):
    min_reward: float | None = Field(None, description="a successful path's return must reach this (None: any)")
    rows: Literal["best", "distinct"] = Field(
        "best", description="per task, the best successful path (best), or the best of each distinct action "
        "sequence that succeeded (distinct)")


class DPOParams(_Strict):
    beta: float = Field(0.5, ge=0.0, description="step pairs: minimum value gap between siblings")
    min_visits: int = Field(1, ge=1, description="step pairs: evaluated leaves under each sibling, at least")
    max_trajectory_pairs_per_task: int = Field(4, ge=0, description="trajectory pairs (success vs failure) per task")
    thought_pairs: bool = Field(
        False, description="keep step pairs whose two sides take the same action (thought-level pairs) in envs "
        "that declare themselves deterministic; elsewhere they are always dropped")


class RevisionParams(_Strict):
    alpha: float = Field(0.5, description="a good path's leaf value must exceed this")
    beta: float = Field(0.5, ge=0.0, description="good minus bad leaf value must exceed this")
    max_per_task: int = Field(4, ge=0, description="revision trajectories per task at most")


class DatasetsSpec(_Strict):
    sft: SFTParams = Field(default_factory=SFTParams)
    dpo: DPOParams = Field(default_factory=DPOParams)
    revision: RevisionParams = Field(default_factory=RevisionParams)


def merge(base: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`base` with each section's non-None overrides applied."""
    out = {section: dict(values) for section, values in base.items()}
    for section, values in overrides.items():
        out.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    return out


def resolve(section: Any, overrides: dict[str, dict[str, Any]] | None = None, source: str = "spec") -> DatasetsSpec:
    """The spec's `datasets` section (absent: defaults) with overrides, validated."""
    if section is not None and not isinstance(section, dict):
        raise BadInput(f"{source}: datasets: expected a mapping, got {type(section).__name__}")
    data = merge(section or {}, overrides or {})
    try:
        return DatasetsSpec.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in ("datasets", *first["loc"]))
        raise BadInput(f"{source}: {where}: {first['msg']}") from None
