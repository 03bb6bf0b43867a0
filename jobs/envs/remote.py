"""An env on a remote server (`RemoteEnv`), with recovery: when the server lost the instance
(it restarted, or reaped it), the env creates a new one and replays its action prefix, so a
search goes on as if nothing happened.

Against thicket's server the env snapshots: a snapshot is a handle to a server-side state
plus the action prefix that rebuilds it, so a handle outlives the server that made it.
Restores are lazy and ride on the next /step, so a tree search pays one round trip per step.
AgentGym servers cannot snapshot: `can_snapshot` is False there and the cursor replays.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from thicket.envs.dialects import Dialect
from thicket.envs.protocol import ActionFailed, Env, Observation, Transition
from thicket.envs.wire import ConnectionLost, EnvServerError, InstanceGone, SnapshotGone
from thicket.errors import Unavailable

EPISODE_OVER = Transition(Observation("The episode is over.", ()), 0.0, True)
MAX_RECOVERIES = 3  # instance lost again and again within one call: give up

log = logging.getLogger("thicket.envs.client")


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


class ServerCalls(Protocol):
    """What a RemoteEnv asks of the client it sends requests through (thicket.envs.client's
    EnvClient, which makes RemoteEnvs: this module does not import it)."""

    connection_errors: int  # lost connections so far: a request may have reached the server

    @property
    def url(self) -> str: ...

    def request_id(self) -> str: ...

    async def call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
                   resend: bool = True) -> Any: ...


class RemoteEnv(Env):
    def __init__(self, client: ServerCalls, dialect: Dialect) -> None:
        self.client = client
        self.dialect = dialect
        # Per instance, not per class: one class serves every family.
        self.family = dialect.family  # type: ignore[misc]
        self.can_snapshot = dialect.snapshots  # type: ignore[misc]
        self.reward_semantics = dialect.reward_semantics  # type: ignore[misc]
        self.data_source = dialect.data_source
        self.deterministic = dialect.deterministic
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
        raise Unavailable(f"env server {self.client.url} keeps losing {self.family} instances")

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
                            self.client.url, self.family, type(err).__name__, len(at.actions))
                self.instance = None  # the next try rebuilds the state on a new instance
                self.recoveries += 1
            except SnapshotGone:
                assert self._pending is not None
                self._pending = replace(self._pending, snapshot=None)  # the next try replays it
            except EnvServerError as err:  # refused (an oversized action, a step after the end) or failed
                self._at = self._current = self._pending = None  # the state the server holds is unknown now
                raise ActionFailed(f"env server {self.client.url} refused {action[:80]!r}: {err}") from err
        raise Unavailable(f"env server {self.client.url} keeps losing {self.family} instances")

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
