"""One async client for env servers: thicket's `serve-env` and AgentGym's servers.

    async with EnvClient(ClientConfig("http://127.0.0.1:8080")) as client:
        env = await client.env("textcraft")                      # thicket's server
        env = await client.env("webshop", adapter=Adapter.AGENTGYM)  # an AgentGym server

Each `RemoteEnv` implements the Env protocol over HTTP; all envs of a client share its
connection pool. Connection errors and 503s are retried (exponential backoff, up to a
deadline). When the server lost the instance (it restarted, or reaped it), the env creates a
new one and replays its action prefix, so a search goes on as if nothing happened.

Against thicket's server the env snapshots: a snapshot is a handle to a server-side state
plus the action prefix that rebuilds it, so a handle outlives the server that made it.
Restores are lazy and ride on the next /step, so a tree search pays one round trip per step.
AgentGym servers cannot snapshot: `can_snapshot` is False there and the cursor replays.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import TracebackType
from typing import Any

import httpx
import orjson
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential, wait_random

from thicket import metrics
from thicket.envs.protocol import ActionFailed, Env, Observation, Transition
from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.transport import Exchange, exchange_for

EPISODE_OVER = Transition(Observation("The episode is over.", ()), 0.0, True)
MAX_RECOVERIES = 3  # instance lost again and again within one call: give up


log = logging.getLogger("thicket.envs.client")


class Adapter(StrEnum):
    THICKET = "thicket"
    AGENTGYM = "agentgym"


@dataclass(frozen=True)
class ClientConfig:
    url: str
    timeout_s: float = 60.0  # one request
    retry_deadline_s: float = 60.0  # connection errors and 503s are retried this long
    max_connections: int = 32


class EnvServerError(ThicketError):
    """The server answered with an error (HTTP status >= 400, or AgentGym's 200 + {"error": ...})."""

    def __init__(self, message: str, status: int = 200, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class InstanceGone(EnvServerError):
    """The server does not know the instance (restarted, reaped or closed)."""


class SnapshotGone(EnvServerError):
    """The snapshot id is no longer kept by the server (evicted, or a restart)."""


class ConnectionLost(ThicketError):
    """A request to a server that reuses instance ids failed mid-way: the instance is suspect."""


class _Busy(Exception):
    """503: the server is full or draining; worth retrying."""


_GONE = re.compile(r"\bid\b.*\b(not valid|invalid|deleted|not found|does not exist)", re.IGNORECASE)


def _loads(content: bytes) -> Any:
    """JSON from a server that may send text that is not UTF-8 (replaced, not refused)."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return orjson.loads(content.decode(errors="replace"))


def _classify(payload: Any, status: int) -> EnvServerError | None:
    if status < 400 and not (isinstance(payload, dict) and "error" in payload):
        return None
    body = payload if isinstance(payload, dict) else {}
    message = str(body.get("error") or body.get("detail") or payload)[:500]
    code = str(body.get("code") or "")
    if code == "unknown_instance" or (not code and _GONE.search(message)):
        return InstanceGone(message, status, code)
    if code == "unknown_snapshot":
        return SnapshotGone(message, status, code)
    return EnvServerError(message, status, code)


# --- the wire formats ---------------------------------------------------------------


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
    actions_route: str | None = None  # GET route listing the valid actions, where steps lack them
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

    def __init__(self, family: str, env_args: dict[str, Any], instructions: str, can_snapshot: bool) -> None:
        super().__init__(family, env_args, instructions)
        self.snapshots = can_snapshot

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


# --- the client ---------------------------------------------------------------------


def default_exchange(config: ClientConfig, transport: httpx.AsyncBaseTransport | None = None) -> Exchange:
    return exchange_for(config.url, config.timeout_s, config.max_connections, transport=transport)


@dataclass(frozen=True)
class FamilyInfo:
    family: str
    instructions: str
    can_snapshot: bool


class EnvClient:
    """The connection pool to one server, shared by all the envs made from it."""

    def __init__(self, config: ClientConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self._exchange = default_exchange(config, transport)
        self._slots = asyncio.Semaphore(config.max_connections)  # connections in use at most
        self._request_ids = itertools.count(1)
        self.connection_errors = 0

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._exchange.aclose()

    def request_id(self) -> str:
        return f"{id(self):x}-{next(self._request_ids)}"

    async def call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
                   resend: bool = True) -> Any:
        """One request, retried on connection errors and 503s; error answers raise EnvServerError.

        With `resend=False` a request that may have reached the server is not sent again after
        a lost connection: once the server answers again, ConnectionLost is raised instead."""
        try:
            return await self._attempt(method, path, body, params, resend)
        except (httpx.TransportError, _Busy) as err:  # the common case above stays free of the retry machinery
            log.warning("env server %s: %s on %s; retrying for up to %.0f s", self.config.url,
                        type(err).__name__, path, self.config.retry_deadline_s)
        metrics.RETRIES.labels("env").inc()  # the loop's first attempt sends it again, without a wait
        try:
            async for attempt in self._retrying():
                with attempt:
                    return await self._attempt(method, path, body, params, resend)
        except (httpx.TransportError, _Busy) as err:
            raise self._unavailable(err) from None
        raise AssertionError("unreachable")

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, httpx.TransportError | _Busy)),
            wait=wait_exponential(multiplier=0.02, max=0.5) + wait_random(0, 0.05),
            stop=stop_after_delay(self.config.retry_deadline_s),
            before_sleep=metrics.count_retry("env"),
            reraise=True,
        )

    def _unavailable(self, err: Exception) -> Unavailable:
        return Unavailable(f"env server {self.config.url} unavailable for {self.config.retry_deadline_s:.0f} s "
                           f"({type(err).__name__}: {err})")

    async def _attempt(self, method: str, path: str, body: Any, params: dict[str, Any] | None, resend: bool) -> Any:
        try:
            return await self._once(method, path, body, params)
        except httpx.TransportError:
            self.connection_errors += 1
            if resend:
                raise
        await self.wait_reachable()
        raise ConnectionLost(f"lost the connection to {self.config.url} during {path}")

    async def _once(self, method: str, path: str, body: Any, params: dict[str, Any] | None) -> Any:
        async with self._slots:
            answer = await self._exchange(method, path, orjson.dumps(body) if body is not None else None, params)
        if answer.status == 503:
            raise _Busy(answer.text[:200])
        try:
            payload = _loads(answer.content) if answer.content else None
        except orjson.JSONDecodeError:
            payload = {"error": answer.text[:300] or answer.reason}
            if answer.status < 400:
                raise EnvServerError(f"{path}: answer is not JSON: {answer.text[:200]!r}", answer.status) from None
        problem = _classify(payload, answer.status)
        if problem is not None:
            raise problem
        return payload

    async def wait_reachable(self) -> None:
        """Block until the server answers anything at all (Unavailable after the deadline)."""
        try:
            async for attempt in self._retrying():
                with attempt:
                    async with self._slots:
                        await self._exchange("GET", "/")
        except httpx.TransportError as err:
            raise self._unavailable(err) from None

    async def wait_ready(self, timeout_s: float) -> None:
        """Until thicket's server says /ready (raises Unavailable after timeout_s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                if (await self._exchange("GET", "/ready")).status == 200:
                    return
            except httpx.TransportError:
                pass
            if loop.time() > deadline:
                raise Unavailable(f"env server {self.config.url} not ready within {timeout_s:.0f} s")
            await asyncio.sleep(0.05)

    async def describe(self, family: str, env_args: dict[str, Any] | None = None) -> FamilyInfo:
        try:
            payload = await self.call("POST", "/describe", {"family": family, "env_args": env_args or {}})
        except EnvServerError as err:
            if err.code in ("unknown_family", "bad_env_args"):
                raise BadInput(f"env server {self.config.url}: {err}") from None
            raise
        return FamilyInfo(family, str(payload["instructions"]), bool(payload["can_snapshot"]))

    async def env(self, family: str, env_args: dict[str, Any] | None = None,
                  adapter: Adapter = Adapter.THICKET) -> RemoteEnv:
        return RemoteEnv(self, await self.dialect(family, env_args or {}, adapter))

    async def dialect(self, family: str, env_args: dict[str, Any], adapter: Adapter) -> Dialect:
        if adapter is Adapter.THICKET:
            info = await self.describe(family, env_args)
            return ThicketDialect(family, env_args, info.instructions, info.can_snapshot)
        if family not in AGENTGYM_DIALECTS:
            raise BadInput(f"no AgentGym adapter for {family!r}; expected one of {', '.join(AGENTGYM_DIALECTS)}")
        return AGENTGYM_DIALECTS[family](family, env_args)


# --- the env ------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteSnapshot:
    """A server-side state (`snapshot` id in `instance`), and the actions that rebuild it."""

    instance: int
    snapshot: int | None
    task: int
    actions: tuple[str, ...]
    done: bool
    score: float = 0.0


@dataclass
class _Position:
    """Where the episode stands, as the client knows it (enough to rebuild it by replay)."""

    task: int
    actions: list[str] = field(default_factory=list)
    done: bool = False
    score: float = 0.0  # a cumulative score the server reports (sciworld)


class RemoteEnv(Env):
    def __init__(self, client: EnvClient, dialect: Dialect) -> None:
        self.client = client
        self.dialect = dialect
        # Per instance, not per class: one class serves every family.
        self.family = dialect.family  # type: ignore[misc]
        self.can_snapshot = dialect.snapshots  # type: ignore[misc]
        self.instance: int | None = None
        self._connection_errors = client.connection_errors
        self._at: _Position | None = None  # None before the first reset
        self._current: RemoteSnapshot | None = None  # handle of the state the server holds now
        self._pending: RemoteSnapshot | None = None  # restored, not yet sent to the server
        # Ask for a snapshot along with each step while the caller takes one of every state
        # (a tree search does); stop when one goes unused (a plain rollout).
        self._auto_snapshot = True
        self._handed_out = False
        self.recoveries = 0
        self.replayed_steps = 0

    @property
    def instructions(self) -> str:
        return self.dialect.instructions

    # --- protocol ---

    async def reset(self, task: int) -> Observation:
        self._pending = None
        for _ in range(MAX_RECOVERIES):
            try:
                return await self._reset(task)
            except (InstanceGone, ConnectionLost):
                self.instance = None
        raise Unavailable(f"env server {self.client.config.url} keeps losing {self.family} instances")

    async def step(self, action: str) -> Transition:
        at = self._target()
        if at is None:
            raise RuntimeError("reset the env before stepping it")
        if at.done:
            return EPISODE_OVER  # as in-process envs answer; some servers refuse such steps
        for _ in range(MAX_RECOVERIES):
            try:
                return await self._step(action)
            except (InstanceGone, ConnectionLost) as err:
                log.warning("env server %s: %s instance lost (%s); rebuilding it by replaying %d action(s)",
                            self.client.config.url, self.family, type(err).__name__, len(at.actions))
                self.instance = None  # the next try rebuilds the state on a new instance
                self.recoveries += 1
            except SnapshotGone:
                assert self._pending is not None
                self._pending = replace(self._pending, snapshot=None)  # the next try replays it
            except EnvServerError as err:  # refused (an oversized action, a step after the end) or failed
                self._at = self._current = self._pending = None  # the state the server holds is unknown now
                raise ActionFailed(f"env server {self.client.config.url} refused {action[:80]!r}: {err}") from err
        raise Unavailable(f"env server {self.client.config.url} keeps losing {self.family} instances")

    async def snapshot(self) -> RemoteSnapshot:
        if not self.can_snapshot:
            await super().snapshot()  # raises: branch by replay
        if self._pending is not None:
            return self._pending
        if self._current is None:
            raise RuntimeError("reset the env before snapshotting it")
        if self._current.snapshot is None:
            self._current = await self._snapshot_now(self._current)
        self._handed_out = self._auto_snapshot = True
        return self._current

    async def restore(self, state: Any) -> None:
        if not self.can_snapshot:
            return await super().restore(state)
        assert isinstance(state, RemoteSnapshot)
        self._pending = None if state == self._current else state

    async def close(self) -> None:
        instance, self.instance = self.instance, None
        if instance is None or not self.dialect.has_close:
            return
        if not self.dialect.resend_safe and self.client.connection_errors != self._connection_errors:
            return  # the server may have restarted and given this id to someone else
        with contextlib.suppress(EnvServerError, ConnectionLost, Unavailable):  # gone, or unreachable
            await self.client.call("POST", "/close", {self.dialect.id_key: instance}, resend=False)

    # --- wire ---

    def _target(self) -> _Position | None:
        """Where the caller expects the env to be: the restored state, else the current one."""
        p = self._pending
        return self._at if p is None else _Position(p.task, list(p.actions), p.done, p.score)

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        """An instance-bound request; instances of AgentGym servers are dropped after a lost
        connection, since such a server reuses ids after a restart."""
        if not self.dialect.resend_safe and self.client.connection_errors != self._connection_errors:
            self._connection_errors = self.client.connection_errors
            raise ConnectionLost("connection to the env server was lost since this instance was made")
        assert self.instance is not None
        body[self.dialect.id_key] = self.instance
        if self.dialect.resend_safe:
            body["request_id"] = self.client.request_id()
        return await self.client.call("POST", path, body, resend=self.dialect.resend_safe)

    async def _create(self, task: int) -> tuple[Observation | None, int | None]:
        self._connection_errors = self.client.connection_errors
        payload = await self.client.call("POST", "/create", self.dialect.create_body(task),
                                         resend=self.dialect.resend_safe)
        self.instance, observation = self.dialect.created(payload)
        snapshot = payload.get("snapshot") if isinstance(payload, dict) else None
        return observation, snapshot

    async def _reset(self, task: int) -> Observation:
        observation, snapshot = (None, None) if self.instance is not None else await self._create(task)
        if observation is None:
            body = self.dialect.reset_body(task) | ({"snapshot": self._auto_snapshot} if self.can_snapshot else {})
            payload = await self._post("/reset", body)
            observation = await self._listing(self.dialect.reset_observation(payload))
            snapshot = payload.get("snapshot") if isinstance(payload, dict) else None
        self._at = _Position(task)
        self._mark(snapshot)
        return observation

    async def _step(self, action: str) -> Transition:
        pending = self._pending
        if self.instance is None or (pending is not None and (pending.instance != self.instance or pending.snapshot is None)):
            await self._rebuild()
            pending = None
        at = self._target()
        assert at is not None
        transition = await self._send_step(at, action, None if pending is None else pending.snapshot)
        self._pending = None
        return transition

    async def _send_step(self, at: _Position, action: str, restore: int | None) -> Transition:
        """POST /step (restoring `restore` first); on success `at` (now the current position) moves on."""
        body: dict[str, Any] = {"action": action}
        if restore is not None:
            body["restore"] = restore
        if self.can_snapshot:
            if self._current is not None and self._current.snapshot is not None and not self._handed_out:
                self._auto_snapshot = False
            body["snapshot"] = self._auto_snapshot
        payload = await self._post("/step", body)
        reply = self.dialect.step_reply(payload, at.score)
        transition = reply.transition
        if self.dialect.actions_route is not None:
            transition = replace(transition, observation=await self._listing(transition.observation))
        at.actions.append(action)
        at.done = transition.done
        at.score = at.score if reply.score is None else reply.score
        self._at = at
        self._mark(reply.snapshot)
        return transition

    async def _listing(self, observation: Observation) -> Observation:
        """The observation with the valid actions of `actions_route`, for servers that list them apart."""
        route = self.dialect.actions_route
        if route is None:
            return observation
        payload = await self.client.call("GET", route, params={self.dialect.id_key: self.instance}, resend=False)
        return replace(observation, valid_actions=self.dialect.listed_actions(payload))

    def _mark(self, snapshot: int | None) -> None:
        at = self._at
        assert at is not None and self.instance is not None
        self._current = RemoteSnapshot(self.instance, snapshot, at.task, tuple(at.actions), at.done, at.score)
        self._handed_out = False

    async def _snapshot_now(self, state: RemoteSnapshot) -> RemoteSnapshot:
        """The handle with a server-side snapshot id; without one if the instance is lost
        (the handle's actions still rebuild the state)."""
        try:
            payload = await self._post("/snapshot", {})
        except (InstanceGone, ConnectionLost):
            return state
        return replace(state, snapshot=int(payload["snapshot"]))

    # --- recovery ---

    async def _rebuild(self) -> None:
        """Put the instance (a new one if it was lost) in the target state by reset + replay."""
        target = self._target()
        assert target is not None
        if self._pending is None:  # keep the target through a failure halfway
            self._pending = RemoteSnapshot(-1, None, target.task, tuple(target.actions), target.done, target.score)
        await self._reset(target.task)
        at = self._at
        assert at is not None
        for action in target.actions:
            await self._send_step(at, action, None)
            self.replayed_steps += 1
        self._pending = None
