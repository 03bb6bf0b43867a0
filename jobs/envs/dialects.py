"""How each env server spells create/reset/step, as the client speaks to it: thicket's own
`serve-env`, and AgentGym's servers (`id` or `env_idx`, errors in 200 answers, ScienceWorld's
cumulative score, WebShop's clickables, which routes exist).

A Dialect builds request bodies and reads answers; `thicket.envs.remote.RemoteEnv` sends them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from thicket.envs.protocol import Observation, RewardSemantics, Transition


@dataclass(frozen=True)
class StepReply:
    transition: Transition
    snapshot: int | None = None  # thicket: the id of the new state
    score: float | None = None  # sciworld: the cumulative score after the step


class Dialect:
    """How one server family spells create/reset/step. The base is AgentGym's textcraft."""

    id_key = "id"
    has_close = True
    resend_safe = False  # a request may be sent again after a lost connection
    snapshots = False
    reward_semantics = RewardSemantics.INCREMENT  # AgentGym's sciworld score is made increments below
    actions_route: str | None = None  # GET route listing the valid actions, where steps lack them
    data_source: str | None = None  # AgentGym's servers do not say
    deterministic = False  # nor whether their transitions are
    default_instructions = "Interact with a text environment: reply with one action per turn."

    def __init__(self, family: str, env_args: dict[str, Any], instructions: str | None = None) -> None:
        self.family = family
        self.env_args = env_args
        self.instructions = instructions or self.default_instructions

    def create_body(self, task: int) -> dict[str, Any] | None:
        return {}

    def created(self, payload: Any) -> tuple[int, Observation | None]:
        """The new instance's id, and its observation if create already reset it to the task."""
        return int(payload[self.id_key] if isinstance(payload, dict) else payload), None

    def reset_body(self, task: int) -> dict[str, Any]:
        return {"data_idx": task}

    def reset_observation(self, payload: Any) -> Observation:
        return Observation(str(payload["observation"]), _actions(payload))

    def step_reply(self, payload: dict[str, Any], score: float) -> StepReply:
        reward, done = float(payload.get("reward") or 0.0), bool(payload.get("done"))
        text = str(payload.get("observation", payload.get("state", "")))
        success = done and reward >= 1.0
        return StepReply(Transition(Observation(text, _actions(payload)), reward, done, success, {"raw_reward": reward}))

    def listed_actions(self, payload: Any) -> tuple[str, ...] | None:
        """The answer of `actions_route` as valid actions."""
        return _actions(payload)


def _actions(payload: Any) -> tuple[str, ...] | None:
    """alfworld's `available_actions`, or thicket's `valid_actions` (an AgentGym client on our server)."""
    if not isinstance(payload, dict):
        return None
    value = payload.get("available_actions", payload.get("valid_actions"))
    return tuple(map(str, value)) if isinstance(value, list | tuple) else None


class ThicketDialect(Dialect):
    resend_safe = True  # ids are never reused and request ids make steps idempotent

    def __init__(self, family: str, env_args: dict[str, Any], instructions: str, can_snapshot: bool,
                 reward_semantics: RewardSemantics, data_source: str | None = None,
                 deterministic: bool = False) -> None:
        super().__init__(family, env_args, instructions)
        self.snapshots = can_snapshot
        self.reward_semantics = reward_semantics
        self.data_source = data_source
        self.deterministic = deterministic

    def create_body(self, task: int) -> dict[str, Any]:
        return {"family": self.family, "env_args": self.env_args, "data_idx": task, "snapshot": self.snapshots}

    def created(self, payload: Any) -> tuple[int, Observation | None]:
        return int(payload["id"]), self.reset_observation(payload)

    def reset_observation(self, payload: Any) -> Observation:
        return Observation(str(payload["observation"]), _actions(payload))

    def step_reply(self, payload: dict[str, Any], score: float) -> StepReply:
        observation = Observation(str(payload["observation"]), _actions(payload))
        transition = Transition(
            observation, float(payload["reward"]), bool(payload["done"]), bool(payload.get("success")),
            payload.get("info") or {},
        )
        return StepReply(transition, payload.get("snapshot"))


class SciWorldDialect(Dialect):
    """Its score is cumulative, 0-100: the reward of a step is the score gained / 100."""

    default_instructions = (
        "ScienceWorld: carry out a science task in a simulated world (look around, go to a room, "
        "pick up, use, focus on objects...). Reply with one action per turn."
    )

    def reset_observation(self, payload: Any) -> Observation:
        text = "\n".join(str(payload[k]) for k in ("task_description", "observation") if payload.get(k))
        return Observation(text)

    def step_reply(self, payload: dict[str, Any], score: float) -> StepReply:
        new_score = float(payload.get("score") or 0.0)
        done = bool(payload.get("done"))
        info = {"score": new_score, "raw_reward": payload.get("reward")}
        transition = Transition(Observation(str(payload["observation"])), (new_score - score) / 100.0, done,
                                done and new_score >= 100.0, info)
        return StepReply(transition, score=new_score)


class WebShopDialect(Dialect):
    """Bare-int ids under `env_idx`, no /close; reset answers [observation, null]."""

    id_key = "env_idx"
    has_close = False
    actions_route = "/available_actions"
    default_instructions = (
        "WebShop: buy the product that matches the instruction. Actions: search[keywords] when "
        "a search bar is shown, or click[button] on one of the clickable values."
    )

    def create_body(self, task: int) -> dict[str, Any] | None:
        return None

    def reset_body(self, task: int) -> dict[str, Any]:
        return {"session_id": task}

    def reset_observation(self, payload: Any) -> Observation:
        text = payload[0] if isinstance(payload, list) and payload else payload
        return Observation(str(text))

    def step_reply(self, payload: dict[str, Any], score: float) -> StepReply:
        reward, done = float(payload.get("reward") or 0.0), bool(payload.get("done"))
        observation = Observation(str(payload.get("state", "")))
        return StepReply(Transition(observation, reward, done, done and reward >= 1.0, {"raw_reward": reward}))

    def listed_actions(self, payload: Any) -> tuple[str, ...] | None:
        if not isinstance(payload, dict) or payload.get("has_search_bar"):
            return None  # free-text search: no finite list
        return tuple(f"click[{c}]" for c in payload.get("clickables") or ())


class AlfWorldDialect(Dialect):
    has_close = False
    default_instructions = (
        "ALFWorld: complete a household task. Choose one of the available actions each turn."
    )

    def reset_body(self, task: int) -> dict[str, Any]:
        return {"game": task, "world_type": "Text"}


class BabyAIDialect(Dialect):
    default_instructions = (
        "BabyAI: reach the goal in a grid world. Actions: turn left, turn right, move forward, "
        "go to <obj> <id>, pick up <obj> <id>, go through <door> <id>, toggle."
    )

    def step_reply(self, payload: dict[str, Any], score: float) -> StepReply:
        reply = super().step_reply(payload, score)
        t = reply.transition
        return StepReply(replace(t, success=t.done and t.reward > 0))


AGENTGYM_DIALECTS: dict[str, type[Dialect]] = {
    "textcraft": Dialect,
    "sciworld": SciWorldDialect,
    "webshop": WebShopDialect,
    "alfworld": AlfWorldDialect,
    "babyai": BabyAIDialect,
}
