"""An env server in AgentGym's WebShop shapes, on a real socket (REFERENCE.md §2):
`POST /create` -> a bare int, `POST /reset {env_idx, session_id}` -> [observation, null],
`POST /step {env_idx, action}` -> {state, reward, done, info}, `GET /available_actions?env_idx=`
-> {has_search_bar, clickables}, `GET /observation?env_idx=` -> the text; no /close; errors as
HTTP 200 with {"error": ...}. Pages come from thicket's WebShop; only the shapes are AgentGym's."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.support.http_stub import QuietHandler, serving
from thicket.envs import make_env
from thicket.envs.webshop.env import WebShopEnv
from thicket.envs.webshop.pages import Page


class AgentGymWebShop(QuietHandler):
    envs: dict[int, WebShopEnv] = {}
    ids = itertools.count()
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self._reply(lambda: getattr(self, f"_{urlparse(self.path).path.strip('/')}")(body))

    def do_GET(self) -> None:
        url = urlparse(self.path)
        env_idx = int(parse_qs(url.query)["env_idx"][0])
        self._reply(lambda: getattr(self, f"_get_{url.path.strip('/')}")(self.envs[env_idx]))

    def _reply(self, make: Any) -> None:
        try:
            answer = make()
        except (KeyError, AttributeError, ValueError) as err:
            answer = {"error": f"{type(err).__name__}: {err}"}  # AgentGym: a 200 with the error
        self.answer(200, json.dumps(answer).encode())

    def _create(self, body: dict[str, Any]) -> int:
        with self.lock:
            env_idx = next(self.ids)
            env = make_env("webshop")
            assert isinstance(env, WebShopEnv)
            env.reset_sync(0)
            self.envs[env_idx] = env
        return env_idx

    def _reset(self, body: dict[str, Any]) -> list[Any]:
        env = self.envs[int(body["env_idx"])]
        return [env.reset_sync(int(body.get("session_id") or 0)).text, None]

    def _step(self, body: dict[str, Any]) -> dict[str, Any]:
        t = self.envs[int(body["env_idx"])].step_sync(str(body["action"]))
        return {"state": t.observation.text, "reward": t.reward, "done": t.done, "info": None}

    def _get_observation(self, env: WebShopEnv) -> str:
        return env.observation().text

    def _get_available_actions(self, env: WebShopEnv) -> dict[str, Any]:
        if env.state.page is Page.SEARCH:
            return {"has_search_bar": True, "clickables": ["search"]}
        return {"has_search_bar": False, "clickables": list(env.shop.clickables(env.state))}


@contextmanager
def agentgym_webshop() -> Iterator[str]:
    """The server's base URL while it runs."""
    with serving(AgentGymWebShop) as url:
        yield url
