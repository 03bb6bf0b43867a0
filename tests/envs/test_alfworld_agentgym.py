"""AgentGym's ALFWorld client against `thicket serve-env alfworld` over real HTTP, and what its
server shows checked against ALFWorld's own engine stack (issue 53).

Read from WooooDyy/AgentGym (commit 3ef9235d):
- the client, agentenv/agentenv/envs/alfworld.py (AlfWorldEnvClient): `POST /create` with no
  body, reads `["id"]`; every POST body gets `"id"`; `reset` posts `{game, world_type: "Text"}`
  and reads `observation`, `available_actions`; `step` posts `{action}` and reads
  `observation`, `available_actions`, `reward`, `done`; GETs carry `?id=`; every answer must be
  200 (`assert res.status_code == 200`); `observe()` shows "AVAILABLE ACTIONS: a,b,...".
- the server, agentenv-alfworld/agentenv_alfworld/server.py, model.py, env_wrapper.py,
  utils.py: create -> `{id}`; reset -> `{id, observation, available_actions, task_type}`,
  the opening without its first paragraph and its paragraphs joined by "\\n"; step ->
  `{observation, reward, available_actions, done}`, "You arrive at loc N. " cut from the
  front; GET /available_actions -> a bare list, /observation -> the text, /detail -> its record
  `{world_type, game, observation, available_actions, done, reward, deleted}`; once done, step
  and the GETs answer 200 `{"error": "The task with environment N has finished."}`.
- its config, agentenv-alfworld/configs/base_config.yaml: training_method dagger, 50 steps an
  episode (TextWorld's Limit wrapper).
These are re-expressed below (the client's requests in `AgentGymClient`, the server's text
edits in `agentgym_opening` / `agentgym_step_text`), not imported or copied.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.envs.conftest import ALFWORLD_TASKS
from tests.support.alfworld_stack import AGENTGYM_STEP_LIMIT, AlfWorldStack
from tests.support.env_server import started
from thicket.envs.alfworld import agentgym, cache
from thicket.envs.alfworld.wording import Wording
from thicket.envs.client import Adapter, ClientConfig, EnvClient
from thicket.envs.process import EnvServerProcess
from thicket.envs.wire import ApiError

RESET_KEYS = {"id", "observation", "available_actions", "task_type"}
STEP_KEYS = {"observation", "reward", "available_actions", "done"}
DETAIL_KEYS = {"world_type", "game", "observation", "available_actions", "done", "reward", "deleted"}


def agentgym_opening(raw: str) -> str:
    """env_wrapper.py reset: the paragraphs after the first, one newline between them."""
    paragraphs = raw.split("\n\n")
    return "\n".join(paragraphs[1:])


def agentgym_step_text(raw: str) -> str:
    """utils.py process_ob: text starting "You arrive at loc " keeps what follows its first ". "."""
    if raw.startswith("You arrive at loc "):
        return raw[raw.index(". ") + 2:]
    return raw


class AgentGymClient:
    """AlfWorldEnvClient's requests, as it makes them (see the module's docstring)."""

    def __init__(self, base: str) -> None:
        self.http = httpx.Client(base_url=base, timeout=120)
        created = self.http.post("/create")  # no body
        assert created.status_code == 200, created.text
        self.env_id = created.json()["id"]
        self.info: dict[str, Any] = {}

    def _post(self, path: str, data: dict[str, Any]) -> Any:
        data["id"] = self.env_id
        res = self.http.post(f"/{path}", json=data)
        assert res.status_code == 200, res.text
        return res.json()

    def _get(self, path: str) -> Any:
        res = self.http.get(f"/{path}?id={self.env_id}")
        assert res.status_code == 200, res.text
        return res.json()

    def reset(self, game: int, world_type: str = "Text") -> dict[str, Any]:
        response = self._post("reset", {"game": game, "world_type": world_type})
        self.info = {"observation": response["observation"], "available_actions": response["available_actions"],
                     "reward": 0, "done": False}
        return response

    def step(self, action: str) -> dict[str, Any]:
        response = self._post("step", {"action": action})
        self.info = {"observation": response["observation"], "available_actions": response["available_actions"],
                     "reward": response["reward"], "done": response["done"]}
        return response

    def observe(self) -> str:
        return f"{self.info['observation']}\nAVAILABLE ACTIONS: {','.join(self.info['available_actions'])}"

    def close(self) -> None:
        self.http.close()


@pytest.fixture(scope="module")
def alf_server(alf_cache: Path, played: dict[int, dict[str, Any]]) -> Iterator[EnvServerProcess]:
    """`serve-env alfworld` over the games the session generated (`played`: tasks 0-11)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THICKET_ALFWORLD_CACHE", str(alf_cache))
        s = started(["alfworld"])
    yield s
    s.stop()


def gold(alf_cache: Path, game: int) -> list[str]:
    import json

    data = json.loads((cache.game_dir(game, Wording.V211, alf_cache) / cache.GAME_FILE).read_text())
    return list(data["walkthrough"])


# --- point 1: `game` is honoured; AgentGym's client wins games 0-11 ------------------------


def test_agentgyms_client_plays_games_0_to_11_by_game_and_every_gold_path_wins(alf_server, alf_cache, played):
    client = AgentGymClient(alf_server.url)
    wins = []
    for game in ALFWORLD_TASKS:  # one client, reset game after game, as AgentGym's evaluation does
        reset = client.reset(game)
        assert reset["task_type"].endswith(f"/task_{game}")
        assert reset["observation"] == agentgym_opening(played[game]["intro"])
        actions = gold(alf_cache, game)
        for i, action in enumerate(actions):
            assert action in client.info["available_actions"], (game, action)
            step = client.step(action)
            assert (step["reward"], step["done"]) == ((1.0, True) if i == len(actions) - 1 else (0.0, False))
        assert "AVAILABLE ACTIONS: " in client.observe()
        wins.append(step["reward"] == 1.0 and step["done"] is True)
    client.close()
    assert sum(wins) == len(ALFWORLD_TASKS) == 12


def test_a_thicket_instance_reset_by_game_plays_that_game_in_thickets_shapes(alf_server, played):
    with httpx.Client(base_url=alf_server.url) as http:
        env_id = http.post("/create", json={"family": "alfworld"}).json()["id"]
        reset = http.post("/reset", json={"id": env_id, "game": 3, "world_type": "Text"}).json()
        assert reset["task"] == 3 and reset["observation"] == played[3]["intro"] and reset["valid_actions"]
        clash = http.post("/reset", json={"id": env_id, "game": 3, "data_idx": 4})
        assert clash.status_code == 422 and "`game`" in clash.json()["error"] and "\n" not in clash.json()["error"]
        http.post("/close", json={"id": env_id})


@pytest.mark.parametrize(("body", "field"), [
    ({"game": "x", "world_type": "Text"}, "game"),
    ({"game": -1, "world_type": "Text"}, "game"),
    ({"game": 1.5, "world_type": "Text"}, "game"),
    ({"world_type": "Text"}, "game"),
    ({"data_idx": 2}, "game"),  # an AgentGym instance is reset by `game`, as AgentGym's server requires
    ({"game": 1}, "world_type"),
    ({"game": 1, "world_type": "Embody"}, "world_type"),
    ({"game": 1, "world_type": "Hybrid"}, "world_type"),
])
def test_a_reset_field_thicket_cannot_honour_is_refused_naming_it(alf_server, body, field):
    with httpx.Client(base_url=alf_server.url) as http:
        env_id = http.post("/create").json()["id"]
        answer = http.post("/reset", json={**body, "id": env_id})
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert f"`{field}`" in error and "\n" not in error


def test_game_and_world_type_are_refused_where_the_family_is_not_alfworld():
    with pytest.raises(ApiError, match="`game`/`world_type` are ALFWorld's"):
        agentgym.reset_task("textcraft", {"game": 1, "world_type": "Text"}, None)
    assert agentgym.reset_task("textcraft", {"data_idx": 1}, None) is None


# --- point 2: AgentGym's routes and shapes --------------------------------------------


@pytest.mark.parametrize("prefix", ["", "/alfworld"])
def test_agentgyms_routes_answer_in_agentgyms_shapes(alf_server, alf_cache, prefix):
    actions = gold(alf_cache, 1)
    with httpx.Client(base_url=alf_server.url + prefix) as http:
        created = http.post("/create")
        assert created.status_code == 200 and set(created.json()) == {"id"}
        env_id = created.json()["id"]
        early = http.post("/step", json={"action": "look", "id": env_id})  # no game yet: AgentGym's error form
        assert early.status_code == 200 and set(early.json()) == {"error"}
        reset = http.post("/reset", json={"game": 1, "world_type": "Text", "id": env_id}).json()
        assert set(reset) == RESET_KEYS and reset["id"] == env_id
        assert http.get(f"/available_actions?id={env_id}").json() == reset["available_actions"]
        assert http.get(f"/observation?id={env_id}").json() == reset["observation"]
        detail = http.get(f"/detail?id={env_id}").json()
        assert detail == {"world_type": "Text", "game": 1, "observation": reset["observation"],
                          "available_actions": reset["available_actions"], "done": False, "reward": 0,
                          "deleted": False}
        for action in actions:
            step = http.post("/step", json={"action": action, "id": env_id}).json()
            assert set(step) == STEP_KEYS and isinstance(step["reward"], float)
            if not step["done"]:
                listed = http.get(f"/available_actions?id={env_id}").json()
                assert isinstance(listed, list) and listed == step["available_actions"]
                assert http.get(f"/observation?id={env_id}").json() == step["observation"]
                assert set(http.get(f"/detail?id={env_id}").json()) == DETAIL_KEYS
        assert (step["reward"], step["done"]) == (1.0, True)
        finished = {"error": f"The task with environment {env_id} has finished."}
        after = http.post("/step", json={"action": "look", "id": env_id})
        assert after.status_code == 200 and after.json() == finished
        for route in ("available_actions", "observation", "detail"):
            assert http.get(f"/{route}?id={env_id}").json() == finished
        again = http.post("/reset", json={"game": 1, "world_type": "Text", "id": env_id})  # a reset starts anew
        assert again.status_code == 200 and again.json()["observation"] == reset["observation"]
        assert http.post("/close", json={"id": env_id}).json()["closed"] is True


def test_thickets_own_instances_keep_thickets_shapes_and_refusal(alf_server, alf_cache):
    actions = gold(alf_cache, 0)
    with httpx.Client(base_url=alf_server.url) as http:
        made = http.post("/create", json={"family": "alfworld", "data_idx": 0}).json()
        assert {"id", "observation", "valid_actions", "task"} <= set(made)
        assert made["observation"].startswith("-= Welcome to TextWorld, ALFRED! =-\n\n")
        env_id = made["id"]
        assert set(http.get(f"/available_actions?id={env_id}").json()) == {"available_actions"}
        assert http.get(f"/detail?id={env_id}").status_code == 404
        for action in actions:
            step = http.post("/step", json={"action": action, "id": env_id}).json()
        assert {"valid_actions", "success", "info"} <= set(step) and step["success"] is True
        assert step["valid_actions"] == []  # thicket's default: none once the episode is over
        assert http.post("/step", json={"action": "look", "id": env_id}).status_code == 409
        http.post("/close", json={"id": env_id})


async def test_thickets_agentgym_adapter_plays_thickets_alfworld_server(alf_server, alf_cache):
    """thicket's own client, spoken as to AgentGym's server (dialects.AlfWorldDialect)."""
    actions = gold(alf_cache, 2)
    async with EnvClient(ClientConfig(alf_server.url)) as client:
        env = await client.env("alfworld", adapter=Adapter.AGENTGYM)
        first = await env.reset(2)
        assert first.valid_actions and actions[0] in first.valid_actions
        assert not first.text.startswith("-= Welcome")
        transitions = [await env.step(a) for a in actions]
        await env.close()
    assert transitions[-1].success and not any(t.done for t in transitions[:-1])


# --- points 3-5 against ALFWorld's own engine stack ------------------------------------


@pytest.mark.parametrize("game", [0, 4])
def test_agentgym_routes_show_alfworlds_stack_through_agentgyms_edits(alf_server, alf_cache, game):
    """Point 3 (AgentGym's text), 4 (whitespace as ALFWorld's engine reads it) and 5 (the winning
    step lists the admissible commands): every answer equals ALFWorld's stack's, edited as
    AgentGym's server edits it."""
    folder = cache.game_dir(game, Wording.V211, alf_cache)
    first, *rest = gold(alf_cache, game)
    commands = [first.replace(" ", "  ", 1), first.upper(), "look", f" {first} \n", *rest]
    stack = AlfWorldStack(folder)
    client = AgentGymClient(alf_server.url)
    try:
        opening = stack.reset()
        reset = client.reset(game)
        assert reset["observation"] == agentgym_opening(opening.text)
        assert "Welcome to TextWorld" not in reset["observation"] and "\n\n" not in reset["observation"]
        assert reset["available_actions"] == opening.admissible
        seen = []
        for command in commands:
            expected, step = stack.step(command), client.step(command)
            seen.append(step["observation"])
            assert step["observation"] == agentgym_step_text(expected.text), command
            assert step["available_actions"] == expected.admissible, command
            assert (step["reward"], step["done"]) == (float(expected.won), expected.done), command
        assert seen[0] == seen[1] == "Nothing happens."  # two spaces, capitals: not commands
        assert seen[3] != "Nothing happens."  # spaces around it: forgiven, and the gold path goes on to win
        assert step["done"] and step["reward"] == 1.0 and len(step["available_actions"]) > 1
    finally:
        stack.close()
        client.close()


def test_agentgym_instances_end_at_agentgyms_50_steps_as_alfworlds_stack_does(alf_server, alf_cache):
    """Point 5: AgentGym's client cannot ask for `max_steps`; its instances end where AgentGym's
    config ends them, unsolved, still listing the admissible commands."""
    stack = AlfWorldStack(cache.game_dir(5, Wording.V211, alf_cache))
    client = AgentGymClient(alf_server.url)
    try:
        stack.reset()
        client.reset(5)
        for turn in range(1, AGENTGYM_STEP_LIMIT + 1):
            command = "inventory" if turn % 2 else "jump"  # an invalid command takes a turn too
            expected, step = stack.step(command), client.step(command)
            assert (step["done"], step["reward"]) == (expected.done, float(expected.won)) == (turn == 50, 0.0)
        assert step["available_actions"] == expected.admissible and step["available_actions"]
        after = client.http.post("/step", json={"action": "look", "id": client.env_id})
        assert after.status_code == 200 and "has finished" in after.json()["error"]
    finally:
        stack.close()
        client.close()
