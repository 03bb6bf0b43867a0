"""AgentGym's ALFWorld server shapes, for `thicket serve-env alfworld` (WooooDyy/AgentGym:
agentenv-alfworld/agentenv_alfworld/server.py, model.py, env_wrapper.py; its client is
agentenv/agentenv/envs/alfworld.py).

An instance made by a `POST /create` with no body (what AgentGym's client sends) is answered
in AgentGym's shapes, and its env shows AgentGym's presentation (`presentation`) and ends an
episode at AgentGym's 50 steps:

    POST /create                        -> {id}                 (no game yet)
    POST /reset {id, game, world_type}  -> {id, observation, available_actions, task_type}
    POST /step {id, action}             -> {observation, reward, available_actions, done}
    GET  /observation?id=               -> "the observation"
    GET  /available_actions?id=         -> [the admissible commands]
    GET  /detail?id=                    -> AgentGym's record: {world_type, game, observation,
                                           available_actions, done, reward, deleted}

Once the episode is over, /step and the three GETs answer 200 {"error": "The task with
environment N has finished."}, as AgentGym's do; so do they before the first reset. Bad fields
are 422 naming the field. `game` N is thicket's task N (not AgentGym's mapping files' N-th game).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from thicket.envs.protocol import Observation, Transition
from thicket.envs.wire import ApiError, ErrorCode, int_field, task_field

FAMILY = "alfworld"
# AgentGym's config (agentenv-alfworld/configs/base_config.yaml): training_method dagger,
# dagger.training.max_nb_steps_per_episode 50, TextWorld's Limit wrapper ends the episode there.
STEP_LIMIT = 50
ENV_ARGS: dict[str, Any] = {"presentation": "agentgym", "max_steps": STEP_LIMIT}
WORLD_TYPES = ("Text", "Embody", "Hybrid")  # AgentGym's; only "Text" (the TextWorld engine) is served

Record = dict[str, Any]  # AgentGym's per-instance info record (its /detail)


def wants_shapes(family: str, body: dict[str, Any]) -> bool:
    """AgentGym's client creates with no body; thicket's names the family and its args."""
    return family == FAMILY and not body


def new_record() -> Record:
    return {"done": False, "reward": 0, "deleted": False}


def reset_task(family: str, body: dict[str, Any], record: Record | None) -> int | None:
    """The task an AgentGym-style reset names (`game`, with `world_type`), else None (thicket's
    `data_idx`). An instance in AgentGym's shapes must name both, as AgentGym's server requires."""
    named = body.get("game") is not None or body.get("world_type") is not None
    if not named and record is None:
        return None
    if family != FAMILY:
        raise ApiError(ErrorCode.BAD_REQUEST, f"`game`/`world_type` are ALFWorld's reset fields; {family} takes `data_idx`")
    game = int_field(body, "game")
    if game < 0:
        raise ApiError(ErrorCode.BAD_REQUEST, f"`game` must be >= 0, got {game}")
    world_type = body.get("world_type")
    if world_type is None and record is not None:
        raise ApiError(ErrorCode.BAD_REQUEST, "missing `world_type` (AgentGym's reset names it: \"Text\")")
    if world_type is not None and world_type != "Text":
        raise ApiError(ErrorCode.BAD_REQUEST, f"`world_type` must be \"Text\" (TextWorld's engine; {WORLD_TYPES[1]} and "
                       f"{WORLD_TYPES[2]} need AI2-THOR, not served), got {world_type!r}"[:200])
    if body.get("data_idx") is not None and task_field(body) != game:
        raise ApiError(ErrorCode.BAD_REQUEST, f"`game` ({game}) and `data_idx` ({body['data_idx']!r}) disagree"[:200])
    return game


def task_type(game_folder: Path | None) -> str:
    """AgentGym's `task_type`: the game file's two parent folders (for ALFWorld's games
    "<type>-<object>-...-<scene>/trial_..."; for generated ones "<cache key>/task_N")."""
    return "/".join(game_folder.parts[-2:]) if game_folder is not None else ""


def reset_answer(instance_id: int, game: int, observation: Observation, game_folder: Path | None,
                 record: Record) -> dict[str, Any]:
    actions = list(observation.valid_actions or ())
    record.clear()
    record.update({"world_type": "Text", "game": game, "observation": observation.text, "available_actions": actions,
                   "done": False, "reward": 0, "deleted": False})
    return {"id": instance_id, "observation": observation.text, "available_actions": actions,
            "task_type": task_type(game_folder)}


def step_answer(transition: Transition, record: Record) -> dict[str, Any]:
    payload = {"observation": transition.observation.text, "reward": float(transition.reward),
               "available_actions": list(transition.observation.valid_actions or ()), "done": transition.done}
    record.update(payload)
    return payload


def refusal(instance_id: int, record: Record) -> dict[str, str] | None:
    """AgentGym's 200 answer to a request its server refuses (a finished episode, no game yet), else None."""
    if record["done"]:
        return {"error": f"The task with environment {instance_id} has finished."}
    if "game" not in record:
        return {"error": f"environment {instance_id} has no game yet: POST /reset {{id, game, world_type}} first"}
    return None
