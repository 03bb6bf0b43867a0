"""`thicket serve-env` over real HTTP: bad requests get clear JSON errors, steps after the end,
the instance cap and the idle reaper, and SIGTERM closing the envs."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from typing import Any

import httpx

from tests.support.env_server import TASK, walk
from thicket.envs import SyncEnv, make_env
from thicket.envs.process import EnvServerProcess


# --- bad requests, limits ------------------------------------------------------------


async def test_bad_requests_get_clear_json_errors(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        env_id = (await http.post("/create", json={"family": "textcraft"})).json()["id"]

        async def expect(status: int, code: str, method: str, path: str, **kwargs: Any) -> None:
            response = await http.request(method, path, **kwargs)
            assert response.status_code == status, response.text
            error = response.json()
            assert error["code"] == code and error["error"] and error["status"] == status

        await expect(400, "bad_json", "POST", "/step", content=b"{not json")
        await expect(400, "bad_json", "POST", "/step", json=[1, 2])
        await expect(404, "unknown_instance", "POST", "/step", json={"id": 12345, "action": "inventory"})
        await expect(422, "bad_request", "POST", "/step", json={"id": env_id})
        await expect(422, "bad_request", "POST", "/step", json={"id": env_id, "action": 5})
        await expect(422, "bad_request", "POST", "/step", json={"id": "abc", "action": "x"})
        await expect(413, "action_too_long", "POST", "/step", json={"id": env_id, "action": "x" * 5000})
        await expect(413, "body_too_large", "POST", "/step", content=b" " * (2 << 20))
        await expect(404, "unknown_family", "POST", "/create", json={"family": "chess"})
        await expect(404, "unknown_family", "POST", "/chess/create", json={})
        await expect(404, "unknown_family", "POST", "/chess/step", json={"id": env_id, "action": "inventory"})
        await expect(404, "unknown_instance", "POST", "/textcraft/step", json={"id": 12345, "action": "inventory"})
        await expect(422, "bad_env_args", "POST", "/create", json={"family": "frozenlake", "env_args": {"colour": 1}})
        await expect(422, "unsupported", "POST", "/textcraft/create", json={"goal": "stick"})
        await expect(422, "bad_request", "POST", "/reset", json={"id": env_id, "data_idx": -1})
        await expect(404, "unknown_snapshot", "POST", "/restore", json={"id": env_id, "snapshot": 999})
        await expect(404, "not_found", "GET", "/no/such/route")
        await expect(405, "method_not_allowed", "GET", "/step")
        # the instance and the server are fine
        ok = await http.post("/step", json={"id": env_id, "action": "inventory"})
        assert ok.status_code == 200 and "server-timing" in ok.headers
        assert ok.headers["content-type"] == "application/json" and ok.json()["observation"]
        steps_line = 'thicket_env_steps_total{family="textcraft"}'

        async def steps_taken() -> float:
            text = (await http.get("/metrics")).text
            return float(next(line for line in text.splitlines() if line.startswith(steps_line)).split()[-1])

        before = await steps_taken()
        again = await http.post("/textcraft/step", json={"id": env_id, "action": "inventory", "request_id": "r1"})
        retry = await http.post("/textcraft/step", json={"id": env_id, "action": "inventory", "request_id": "r1"})
        assert retry.status_code == 200 and retry.content == again.content
        assert await steps_taken() == before + 1  # the retry got the first answer, not a second step
        assert (await http.get("/health")).json()["status"] == "ok"
        metrics = (await http.get("/metrics")).text
        assert 'thicket_env_errors_total{code="bad_json"} 2' in metrics
        assert "thicket_env_step_seconds_count" in metrics and 'thicket_env_steps_total{family="textcraft"}' in metrics
        await http.post("/close", json={"id": env_id})


async def test_step_after_done_is_refused_where_the_family_says_so(server, small_server):
    local = make_env("frozenlake")
    assert isinstance(local, SyncEnv)
    to_the_end = walk(local, random.Random(1), 200).actions  # into a hole, to the goal, or the time limit
    async with httpx.AsyncClient() as http:
        for s, status in ((small_server, 409), (server, 200)):
            env_id = (await http.post(f"{s.url}/frozenlake/create", json={"data_idx": TASK})).json()["id"]
            steps = [(await http.post(f"{s.url}/step", json={"id": env_id, "action": a})).json() for a in to_the_end]
            assert steps[-1]["done"] and not any(step["done"] for step in steps[:-1])
            after = await http.post(f"{s.url}/step", json={"id": env_id, "action": "down"})
            assert after.status_code == status, after.text
            assert (after.json()["code"] == "episode_done") if status == 409 else after.json()["done"]
            await http.post(f"{s.url}/close", json={"id": env_id})


async def test_instance_cap_and_idle_reaper(small_server):
    async with httpx.AsyncClient(base_url=small_server.url) as http:
        ids = [(await http.post("/create", json={})).json()["id"] for _ in range(3)]
        full = await http.post("/create", json={})
        assert full.status_code == 503 and full.json()["code"] == "capacity" and full.headers["retry-after"]
        kept = ids[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # one instance stays busy; the others go idle
            assert (await http.post("/step", json={"id": kept, "action": "inventory"})).status_code == 200
            if 'thicket_env_instances{family="textcraft"} 1' in (await http.get("/metrics")).text:
                break
            await asyncio.sleep(0.2)
        gone = await http.post("/step", json={"id": ids[1], "action": "inventory"})
        assert gone.status_code == 404 and gone.json()["code"] == "unknown_instance"
        assert (await http.post("/create", json={})).status_code == 200
        assert "thicket_env_instances_reaped_total 2" in (await http.get("/metrics")).text


# --- shutdown -------------------------------------------------------------------------


async def test_sigterm_closes_envs_and_exits_cleanly():
    async with EnvServerProcess(["textcraft"]) as s, httpx.AsyncClient(base_url=s.url) as http:
        env_id = (await http.post("/create", json={})).json()["id"]
        assert (await http.post("/step", json={"id": env_id, "action": "inventory"})).status_code == 200
        assert s.proc is not None
        s.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(s.proc.wait, 10) == 0
