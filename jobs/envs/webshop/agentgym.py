"""AgentGym's WebShop server shapes, for `thicket serve-env webshop` (WooooDyy/AgentGym,
agentenv-webshop/agentenv_webshop/server.py and model.py):

    GET  /                       -> "ok"
    GET  /list_envs              -> [env_idx, ...]
    POST /create                 -> env_idx (a bare int)
    POST /reset {env_idx, session_id?} -> [observation, null]; no session_id (or null): a drawn goal
    POST /step {env_idx, action} -> {state, reward, done, info: null}, nothing more
    GET  /available_actions?env_idx= -> {has_search_bar, clickables}
    GET  /instruction_text?env_idx=  -> the current page's instruction heading
    GET  /observation?env_idx=   -> the observation text
    GET  /state?env_idx=         -> {url, html, instruction_text}

A request speaks AgentGym's dialect when it names the instance `env_idx` (thicket's client names it
`id`) or carries a `session_id`; thicket's client keeps thicket's shapes on the same routes.
"""

from __future__ import annotations

import html
import json
import random
import string
import weakref
from typing import TYPE_CHECKING, Any

from thicket.envs.protocol import Env
from thicket.envs.wire import ApiError, ErrorCode, int_field

if TYPE_CHECKING:
    from thicket.envs.webshop.env import WebShopEnv

FAMILY = "webshop"
BASE_URL = "http://127.0.0.1:3000"  # WebShop's text env's base_url
_draw = random.Random()  # AgentGym's reset without a session draws a goal (weights 1 each for human goals)
# Pages are compared by their names (thicket.envs.webshop.pages.Page is a StrEnum): this module is
# imported by the env server for every family, the webshop modules only once a webshop env is used.
_sessions: weakref.WeakKeyDictionary[Env, str] = weakref.WeakKeyDictionary()  # env -> WebShop's session id


def wants_bare_id(family: str, body: dict[str, Any]) -> bool:
    """AgentGym's client creates with an empty body; thicket's names the family and its args."""
    return family == FAMILY and not body


def speaks_agentgym(family: str, body: dict[str, Any]) -> bool:
    return family == FAMILY and ("session_id" in body or ("env_idx" in body and "id" not in body))


def session_task(env: Env, family: str, body: dict[str, Any]) -> int | None:
    """The task of an AgentGym reset (None: not one): its `session_id` (refused unless a whole
    number >= 0), or a drawn one when there is none; the session is remembered for /state's url."""
    if not speaks_agentgym(family, body):
        return None
    if body.get("session_id") is None:
        task, session = _draw.randrange(len(_webshop(env).catalog.goals)), None
    else:
        task = int_field(body, "session_id")
        if task < 0:
            raise ApiError(ErrorCode.BAD_REQUEST, f"`session_id` must be >= 0, got {task}")
        session = str(task)
    _sessions[env] = session or "".join(_draw.choices(string.ascii_lowercase, k=10))
    return task


def step_payload(text: str, reward: float, done: bool) -> dict[str, Any]:
    return {"state": text, "reward": reward, "done": done, "info": None}


def available_actions(env: Env) -> dict[str, Any]:
    """WebShop's get_available_actions: the search bar only on the search page, whose one
    clickable is its "search" button; elsewhere the page's clickables, lowercased, in order."""
    shop = _webshop(env)
    if shop.state.page == "search":
        return {"has_search_bar": True, "clickables": ["search"]}
    return {"has_search_bar": False, "clickables": list(shop.shop.clickables(shop.state))}


def instruction_text(env: Env) -> str:
    """The page's `#instruction-text h4` text: "Instruction: " and the instruction on the search
    page, "Instruction:" and it (no space) on the others; the done page has none."""
    shop = _webshop(env)
    if shop.state.page == "done":
        raise ApiError(ErrorCode.EPISODE_DONE, "webshop: the done page shows no instruction; reset the env")
    return ("Instruction: " if shop.state.page == "search" else "Instruction:") + shop.shop.goal.instruction


def state(env: Env) -> dict[str, Any]:
    """{url, html, instruction_text}: WebShop's url for the page; `html` is a plain page of the
    observation's segments (thicket does not render WebShop's templates); `instruction_text` is
    the one read at reset, as WebShop's env keeps it."""
    shop = _webshop(env)
    text = shop.observation().text
    body = "".join(f"<div>{html.escape(segment)}</div>" for segment in text.split(" [SEP] "))
    return {"url": url(shop), "html": f"<html><body>{body}</body></html>",
            "instruction_text": "Instruction: " + shop.shop.goal.instruction}


def url(env: WebShopEnv) -> str:
    """The url WebShop's text env is at: its routes, session, keywords joined by "+", page, options."""
    s, session = env.state, _sessions.get(env, "")
    keywords = "+".join(s.keywords.split(" "))
    options = dict(s.options)
    if s.page == "search":
        return f"{BASE_URL}/{session}"
    if s.page == "results":
        return f"{BASE_URL}/search_results/{session}/{keywords}/{s.page_no}"
    if s.page == "item":
        return f"{BASE_URL}/item_page/{session}/{s.asin}/{keywords}/{s.page_no}/{json.dumps(options)}"
    if s.page == "done":
        return f"{BASE_URL}/done/{session}/{s.asin}/{options}"
    return f"{BASE_URL}/item_sub_page/{session}/{s.asin}/{keywords}/{s.page_no}/{s.page.value.title()}/{options}"


def _webshop(env: Env) -> WebShopEnv:
    from thicket.envs.webshop.env import WebShopEnv  # the server imports this module for every family

    assert isinstance(env, WebShopEnv)
    return env
