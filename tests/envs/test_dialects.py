"""AgentGym's request and response shapes: its TextCraft client against our server unchanged, and
our AgentGym adapter against servers with each family's quirks."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.env_server import search
from thicket.envs import make_env
from thicket.envs.client import Adapter, ClientConfig, EnvClient
from thicket.envs.protocol import RewardSemantics
from thicket.envs.textcraft import gold_path, make_task
from thicket.search.mcts import MCTSParams


# --- AgentGym's shapes --------------------------------------------------------------


async def test_an_agentgym_textcraft_client_works_unchanged(server):
    """Raw requests as AgentGym's TextCraftEnvClient makes them, base URL .../textcraft."""
    base = f"{server.url}/textcraft"
    path = gold_path(make_task(3))
    assert path
    async with httpx.AsyncClient(base_url=base) as http:
        assert "textcraft" in (await http.get("/")).json()
        created = (await http.post("/create", json={"commands": None, "goal": None})).json()
        assert {"id", "observation", "done", "reward"} <= set(created) and created["done"] is False
        env_id = created["id"]
        reset = (await http.post("/reset", json={"id": env_id, "data_idx": 3})).json()
        assert reset["id"] == env_id and "Crafting commands" in reset["observation"] and reset["reward"] == 0
        for i, action in enumerate(path):
            key = "id" if i % 2 else "env_idx"  # both spellings
            response = await http.post("/step", json={key: env_id, "action": action})
            assert response.status_code == 200
            step = response.json()
            assert {"observation", "reward", "done"} <= set(step)
        assert step["done"] is True and step["reward"] == 1.0
        assert (await http.get("/observation", params={"id": env_id})).json() == step["observation"]
        assert (await http.post("/close", json={"id": env_id})).json()["closed"] is True


async def test_agentgym_adapter_against_our_server_searches_like_in_process(server):
    """The AgentGym adapter (no snapshots: the cursor replays) grows the same MCTS tree."""
    params = MCTSParams(iterations=4, expansions=3, max_depth=5)
    reference = await search(make_env("textcraft"), params, task=2)
    async with EnvClient(ClientConfig(f"{server.url}/textcraft")) as client:
        env = await client.env("textcraft", adapter=Adapter.AGENTGYM)
        assert not env.can_snapshot
        tree = await search(env, params, task=2)
        await env.close()
    assert tree == reference


def agentgym_fake(family: str) -> httpx.MockTransport:
    """AgentGym's quirks for families that cannot run offline (REFERENCE §2 shapes)."""
    state = {"steps": 0}

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.read() or b"{}")
        route = request.url.path
        if family == "webshop":
            if route == "/create":
                return httpx.Response(200, json=7)
            if route == "/reset":
                assert body == {"env_idx": 7, "session_id": 4}
                return httpx.Response(200, json=["WebShop [SEP] Search", None])
            if route == "/available_actions":
                assert request.url.params["env_idx"] == "7"
                if state["steps"]:
                    return httpx.Response(200, json={"has_search_bar": False, "clickables": ["buy now", "< prev"]})
                return httpx.Response(200, json={"has_search_bar": True, "clickables": ["search"]})
            if route == "/step":
                state["steps"] += 1
                if body["action"] == "click[oops]":
                    return httpx.Response(200, json={"error": "invalid action"})
                return httpx.Response(200, json={"state": "Item page", "reward": 0.0, "done": False, "info": None})
        if family == "sciworld":
            if route == "/create":
                return httpx.Response(200, json={"id": 0})
            if route == "/reset":
                return httpx.Response(200, json={"task_description": "Boil water.", "observation": "A kitchen."})
            if route == "/step":
                state["steps"] += 1
                score = {1: 25, 2: 100}[state["steps"]]
                return httpx.Response(200, json={"observation": "ok", "reward": 25, "score": score, "done": score == 100})
            if route == "/close":
                return httpx.Response(200, json={"ok": True})
        raise AssertionError(f"unexpected {request.method} {route}")

    return httpx.MockTransport(handle)


async def test_agentgym_adapters_handle_each_servers_quirks():
    async with EnvClient(ClientConfig("http://agentgym"), transport=agentgym_fake("webshop")) as client:
        env = await client.env("webshop", adapter=Adapter.AGENTGYM)
        first = await env.reset(4)
        assert first.text == "WebShop [SEP] Search" and first.valid_actions is None  # free-text search
        t = await env.step("search[red shoes]")
        assert t.observation.valid_actions == ("click[buy now]", "click[< prev]") and not t.done
        with pytest.raises(Exception, match="invalid action"):  # HTTP 200 with an `error` body
            await env.step("click[oops]")
        await env.close()  # no /close on webshop: nothing is sent
    async with EnvClient(ClientConfig("http://agentgym"), transport=agentgym_fake("sciworld")) as client:
        env = await client.env("sciworld", adapter=Adapter.AGENTGYM)
        assert (await env.reset(0)).text == "Boil water.\nA kitchen."
        steps = [await env.step("go to kitchen"), await env.step("boil water")]
        assert [t.reward for t in steps] == [0.25, 0.75]  # cumulative 0-100 score -> gains in [0, 1]
        assert steps[1].success and steps[1].done
        # gains: a path's return is their sum (1.0), as the reward semantics it declares say
        assert env.reward_semantics is RewardSemantics.INCREMENT
        assert env.reward_semantics.path_return(env.reward_semantics.path_return(0.0, 0.25), 0.75) == 1.0
        assert (await env.step("anything")).done  # after the end: answered locally, never sent
        await env.close()
