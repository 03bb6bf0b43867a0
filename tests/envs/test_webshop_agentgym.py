"""AgentGym's WebShop dialect both ways: thicket's AgentGym client against a server in AgentGym's
WebShop shapes, and an AgentGym WebShop client (its requests and answers, written out with
httpx) against `thicket serve-env webshop`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.support.agentgym_webshop import agentgym_webshop
from tests.support.env_server import started
from thicket.envs import make_env
from thicket.envs.client import Adapter, ClientConfig, EnvClient
from thicket.envs.process import EnvServerProcess
from thicket.envs.webshop.env import WebShopEnv
from thicket.training.experts import webshop_plan

TASK = 4


def expected_episode(task: int) -> tuple[list[str], list[float]]:
    env = make_env("webshop")
    assert isinstance(env, WebShopEnv)
    plan = webshop_plan(task)
    assert plan is not None
    env.reset_sync(task)
    actions = [step.action for step in plan.steps]
    return actions, [env.step_sync(a).reward for a in actions]


async def test_thickets_agentgym_client_plays_an_expert_episode_on_agentgym_webshop():
    actions, rewards = expected_episode(TASK)
    with agentgym_webshop() as url:
        async with EnvClient(ClientConfig(url)) as client:
            env = await client.env("webshop", adapter=Adapter.AGENTGYM)
            assert not env.can_snapshot
            first = await env.reset(TASK)
            assert first.text.startswith("WebShop [SEP] Instruction: [SEP] ") and first.valid_actions is None
            transitions = [await env.step(a) for a in actions]
            await env.close()  # no /close on webshop: nothing is sent
    assert [t.reward for t in transitions] == rewards and rewards[-1] == 1.0
    assert transitions[-1].done and transitions[-1].success and not any(t.done for t in transitions[:-1])
    item = transitions[actions.index(next(a for a in actions if a.startswith("click[b0")))]
    assert item.observation.valid_actions and "click[buy now]" in item.observation.valid_actions


@pytest.fixture(scope="module")
def webshop_server() -> Iterator[EnvServerProcess]:
    s = started(["webshop"])
    yield s
    s.stop()


@pytest.mark.parametrize("prefix", ["/webshop", ""])
def test_an_agentgym_webshop_client_works_unchanged(webshop_server, prefix):
    """Requests as AgentGym's WebshopEnvClient makes them: create with no body, env_idx in
    every body and query, reset by session_id, the answer's `state`."""
    actions, rewards = expected_episode(TASK)
    with httpx.Client(base_url=webshop_server.url + prefix) as http:
        env_idx = http.post("/create").json()
        assert isinstance(env_idx, int)
        reset = http.post("/reset", json={"session_id": TASK, "env_idx": env_idx}).json()
        assert isinstance(reset, list) and reset[1] is None
        assert reset[0].startswith("WebShop [SEP] Instruction: [SEP] ")
        assert http.get(f"/observation?env_idx={env_idx}").json() == reset[0]
        listed = http.get(f"/available_actions?env_idx={env_idx}").json()
        assert listed["has_search_bar"] is True and listed["clickables"] == ["search"]
        for action, reward in zip(actions, rewards, strict=True):
            step = http.post("/step", json={"action": action, "env_idx": env_idx}).json()
            assert set(step) == {"state", "reward", "done", "info"} and step["info"] is None  # StepResponse
            assert step["reward"] == reward
            if action.startswith("click[b0"):
                listed = http.get(f"/available_actions?env_idx={env_idx}").json()
                assert listed["has_search_bar"] is False and "buy now" in listed["clickables"]
                assert http.get(f"/observation?env_idx={env_idx}").json() == step["state"]
        assert step["done"] is True and step["reward"] == 1.0
        assert step["state"].startswith("Thank you for shopping with us!")


@pytest.mark.parametrize("session", ["x", -1, 2.5])
def test_a_bad_session_id_is_refused_not_read_as_task_0(webshop_server, session):
    with httpx.Client(base_url=webshop_server.url) as http:
        env_idx = http.post("/create").json()
        answer = http.post("/reset", json={"session_id": session, "env_idx": env_idx})
        assert answer.status_code == 422 and "session_id" in answer.text, answer.text  # as a bad `data_idx`
        assert http.post("/reset", json={"session_id": "3", "env_idx": env_idx}).json()[1] is None  # as AgentGym's


async def test_thickets_own_client_still_gets_thicket_shapes_from_serve_env_webshop(webshop_server):
    actions, rewards = expected_episode(TASK)
    async with EnvClient(ClientConfig(webshop_server.url)) as client:
        env = await client.env("webshop", {"search_actions": 2})
        assert env.can_snapshot
        first = await env.reset(TASK)
        assert first.valid_actions is not None and len(first.valid_actions) == 2
        transitions = [await env.step(a) for a in actions]
        await env.close()
    assert [t.reward for t in transitions] == rewards and transitions[-1].success


# AgentGym's WebShop server's routes and answer shapes (WooooDyy/AgentGym,
# agentenv-webshop/agentenv_webshop/server.py, model.py, environment.py) over real HTTP.


@pytest.mark.parametrize("prefix", ["/webshop", ""])
def test_agentgym_routes_answer_agentgyms_shapes(webshop_server, prefix):
    with httpx.Client(base_url=webshop_server.url + prefix) as http:
        assert http.get("/").json() == "ok"
        env_idx = http.post("/create").json()
        listed = http.get("/list_envs").json()
        assert isinstance(listed, list) and env_idx in listed and all(isinstance(i, int) for i in listed)
        reset = http.post("/reset", json={"env_idx": env_idx, "session_id": TASK}).json()
        instruction = reset[0].split(" [SEP] ")[2]
        # get_instruction_text: the `#instruction-text h4` text of the page shown
        assert http.get(f"/instruction_text?env_idx={env_idx}").json() == "Instruction: " + instruction
        state = http.get(f"/state?env_idx={env_idx}").json()
        assert set(state) == {"url", "html", "instruction_text"}
        assert state["url"] == f"http://127.0.0.1:3000/{TASK}" and state["instruction_text"] == "Instruction: " + instruction
        actions, _ = expected_episode(TASK)
        search = actions[0]
        keywords = search[len("search["):-1]
        http.post("/step", json={"env_idx": env_idx, "action": search})
        assert http.get(f"/instruction_text?env_idx={env_idx}").json() == "Instruction:" + instruction
        assert http.get(f"/state?env_idx={env_idx}").json()["url"] == (
            f"http://127.0.0.1:3000/search_results/{TASK}/{keywords.replace(' ', '+')}/1")
        for action in actions[1:-1]:
            http.post("/step", json={"env_idx": env_idx, "action": action})
        clickables = http.get(f"/available_actions?env_idx={env_idx}").json()
        assert set(clickables) == {"has_search_bar", "clickables"}
        assert clickables["clickables"][:6] == ["back to search", "< prev", "description", "features", "reviews", "buy now"]
        local = make_env("webshop")
        assert isinstance(local, WebShopEnv)
        local.reset_sync(TASK)
        for action in actions[:-1]:
            local.step_sync(action)
        s = local.state  # WebShop's item_page url: session, asin, keywords, page, json.dumps(options)
        assert http.get(f"/state?env_idx={env_idx}").json()["url"] == (
            f"http://127.0.0.1:3000/item_page/{TASK}/{s.asin}/{keywords.replace(' ', '+')}/{s.page_no}/"
            f"{json.dumps(dict(s.options))}")
        assert s.options  # the expert chose options
        done = http.post("/step", json={"env_idx": env_idx, "action": actions[-1]}).json()
        assert done == {"state": done["state"], "reward": 1.0, "done": True, "info": None}
        assert http.get(f"/state?env_idx={env_idx}").json()["url"].startswith(f"http://127.0.0.1:3000/done/{TASK}/")
        late = http.get(f"/instruction_text?env_idx={env_idx}")  # the done page has no instruction
        assert late.status_code == 409 and "\n" not in late.json()["error"]


@pytest.mark.parametrize("body", [{}, {"session_id": None}])
def test_an_agentgym_reset_without_a_session_draws_a_goal(webshop_server, body):
    """WebAgentTextEnv.reset(session=None) draws a goal (random_idx over the goals' weights)."""
    with httpx.Client(base_url=webshop_server.url) as http:
        env_idx = http.post("/create").json()
        seen = set()
        for _ in range(8):
            answer = http.post("/reset", json={"env_idx": env_idx, **body}).json()
            assert isinstance(answer, list) and len(answer) == 2 and answer[1] is None
            assert answer[0].startswith("WebShop [SEP] Instruction: [SEP] ")
            assert http.get(f"/observation?env_idx={env_idx}").json() == answer[0]
            seen.add(answer[0])
        assert len(seen) > 1  # not always task 0
        session = http.get(f"/state?env_idx={env_idx}").json()["url"].rsplit("/", 1)[1]
        assert len(session) == 10 and session.isalpha() and session.islower()  # WebShop's random session


def test_webshop_only_routes_are_404_for_other_families():
    s = started(["frozenlake", "webshop"])
    try:
        with httpx.Client(base_url=s.url) as http:
            assert http.get("/").json() != "ok" and http.get("/webshop/").json() == "ok"
            created = http.post("/create", json={"family": "frozenlake"}).json()
            assert http.get(f"/state?env_idx={created['id']}").status_code == 404
            assert http.get("/list_envs").status_code == 404
    finally:
        s.stop()
