"""An env server in AgentGym's TextCraft shapes, on a real socket (REFERENCE.md §2 and §8):
`POST /create {commands?, goal?}` -> {id, observation, done, reward}, `/reset {id, data_idx}`,
`/step {id, action}` -> {observation, reward, done}, `/close {id}`; errors as HTTP 200 with
{"error": ...}; no valid actions listed. Observations come from thicket's TextCraft, so the text
is real; only the shapes are AgentGym's."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.http_stub import QuietHandler, serving
from thicket.envs import make_env
from thicket.envs.protocol import SyncEnv


class AgentGymTextCraft(QuietHandler):
    envs: dict[int, SyncEnv] = {}
    ids = itertools.count()
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        route = self.path.rstrip("/").rsplit("/", 1)[-1]
        try:
            answer = getattr(self, f"_{route}")(body)
        except (KeyError, AttributeError) as err:
            answer = {"error": f"{type(err).__name__}: {err}"}  # AgentGym: a 200 with the error
        self.answer(200, json.dumps(answer).encode())

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            instance = next(self.ids)
            env = make_env("textcraft")
            assert isinstance(env, SyncEnv)
            self.envs[instance] = env
        return {"id": instance, **self._reset({"id": instance, "data_idx": instance})}

    def _reset(self, body: dict[str, Any]) -> dict[str, Any]:
        env = self.envs[int(body["id"])]
        return {"observation": env.reset_sync(int(body["data_idx"])).text, "done": False, "reward": 0}

    def _step(self, body: dict[str, Any]) -> dict[str, Any]:
        transition = self.envs[int(body["id"])].step_sync(str(body["action"]))
        return {"observation": transition.observation.text, "reward": transition.reward, "done": transition.done}

    def _close(self, body: dict[str, Any]) -> dict[str, Any]:
        del self.envs[int(body["id"])]
        return {"closed": True}


@contextmanager
def agentgym_textcraft() -> Iterator[str]:
    """The server's base URL while it runs."""
    with serving(AgentGymTextCraft) as url:
        yield url
