"""AgentGym's WebShop server shapes, for `thicket serve-env webshop` (REFERENCE.md §2):
POST /create (no body) -> a bare int; POST /reset {env_idx, session_id} -> [observation, null];
POST /step -> {state, reward, done, info}; GET /available_actions -> {has_search_bar, clickables}.
thicket's own fields ride along where the answer is an object."""

from __future__ import annotations

from typing import Any

from thicket.envs.protocol import Observation
from thicket.envs.wire import ApiError, ErrorCode, int_field

FAMILY = "webshop"


def wants_bare_id(family: str, body: dict[str, Any]) -> bool:
    """AgentGym's client creates with an empty body; thicket's names the family and its args."""
    return family == FAMILY and not body


def session_task(family: str, body: dict[str, Any]) -> int | None:
    """The task of an AgentGym reset (its `session_id`: refused unless a whole number >= 0), else None."""
    if family != FAMILY or body.get("session_id") is None:
        return None
    task = int_field(body, "session_id")
    if task < 0:
        raise ApiError(ErrorCode.BAD_REQUEST, f"`session_id` must be >= 0, got {task}")
    return task


def available_actions(observation: Observation) -> dict[str, Any]:
    valid = observation.valid_actions
    has_search_bar = valid is None or any(a.startswith("search[") for a in valid)
    clicks = [a[len("click[") : -1] for a in valid or () if a.startswith("click[")]
    return {"has_search_bar": has_search_bar, "clickables": ["search"] if has_search_bar else clicks,
            "available_actions": valid}
