"""`thicket serve-env`: one HTTP server hosting many env instances (the pod's env sidecar).

Every route of AgentGym's servers for the same families answers with AgentGym's shapes, and
thicket's extras ride along as further fields, so an AgentGym client works unchanged:

    POST /create      {family?, env_args?, data_idx?}     -> {id, observation, done, reward, ...}
    POST /reset       {id | env_idx, data_idx?}           -> {id, observation, done, reward, ...}
    POST /step        {id | env_idx, action}              -> {observation, reward, done, success, ...}
    POST /close       {id | env_idx}                      -> {id, closed}
    GET  /observation?id=  (or env_idx=)                  -> "the current observation"
    GET  /available_actions?id=                           -> {available_actions: [...] | null}

Each of these is also mounted under /<family>/ (e.g. /textcraft/create), so a client written
for AgentGym's textcraft server works with base URL http://host:port/textcraft; a bare /create
makes the first family served.

thicket's own routes: GET /health, /ready, /metrics (Prometheus text), /families;
POST /describe {family, env_args} -> {instructions, can_snapshot}; POST /snapshot {id} ->
{snapshot}; POST /restore {id, snapshot}.

Snapshots stay server-side: a snapshot id names a state kept in its instance (at most
`max_snapshots` per instance, least recently used evicted) until the instance is closed or
reaped. A client holding an id that is gone (evicted, reaped, server restarted) gets 404
`unknown_snapshot` / `unknown_instance` and rebuilds the state by replay. /step and /reset take
`snapshot: true` (answer with a snapshot id of the new state) and /step takes `restore: <id>`
(restore first), so a tree search pays one round trip per step. Mutating requests may carry a
`request_id`; a retry with the same id gets the first answer again instead of a second step.

Errors are JSON `{"error": message, "code": ErrorCode, "status": http_status}`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import json
import logging
import math
import os
import secrets
import signal
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from thicket.envs import EnvNotInstalled, env_names, make_env, require
from thicket.envs.protocol import Env, Observation, Transition
from thicket.errors import BadInput, Unavailable

log = logging.getLogger("thicket.envs.server")

# AgentGym's servers for these families refuse /step once the episode is over.
AGENTGYM_REFUSE_AFTER_DONE = frozenset({"sciworld", "alfworld", "babyai"})
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class ErrorCode(StrEnum):
    BAD_JSON = "bad_json"
    BAD_REQUEST = "bad_request"
    BODY_TOO_LARGE = "body_too_large"
    ACTION_TOO_LONG = "action_too_long"
    UNKNOWN_FAMILY = "unknown_family"
    BAD_ENV_ARGS = "bad_env_args"
    UNSUPPORTED = "unsupported"
    UNKNOWN_INSTANCE = "unknown_instance"
    UNKNOWN_SNAPSHOT = "unknown_snapshot"
    CANNOT_SNAPSHOT = "cannot_snapshot"
    EPISODE_DONE = "episode_done"
    CAPACITY = "capacity"
    DRAINING = "draining"
    ENV_ERROR = "env_error"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INTERNAL = "internal"


STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_JSON: 400,
    ErrorCode.BAD_REQUEST: 422,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.ACTION_TOO_LONG: 413,
    ErrorCode.UNKNOWN_FAMILY: 404,
    ErrorCode.BAD_ENV_ARGS: 422,
    ErrorCode.UNSUPPORTED: 422,
    ErrorCode.UNKNOWN_INSTANCE: 404,
    ErrorCode.UNKNOWN_SNAPSHOT: 404,
    ErrorCode.CANNOT_SNAPSHOT: 409,
    ErrorCode.EPISODE_DONE: 409,
    ErrorCode.CAPACITY: 503,
    ErrorCode.DRAINING: 503,
    ErrorCode.ENV_ERROR: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.INTERNAL: 500,
}


class Phase(StrEnum):
    STARTING = "starting"  # loading the families' data
    READY = "ready"
    DRAINING = "draining"  # shutting down: no new instances


class ApiError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return STATUS[self.code]


@dataclass(frozen=True)
class ServerConfig:
    families: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8080
    max_instances: int = 1024
    idle_timeout_s: float = 600.0
    max_snapshots: int = 4096  # per instance, least recently used evicted
    max_action_chars: int = 4096
    max_body_bytes: int = 1 << 20
    refuse_after_done: frozenset[str] = AGENTGYM_REFUSE_AFTER_DONE
    shutdown_grace_s: float = 10.0
    parent_pid: int | None = None  # shut down when this process dies (a sidecar of `thicket run`)

    @property
    def reap_interval_s(self) -> float:
        return min(max(self.idle_timeout_s / 4, 0.05), 5.0)


# --- instances ----------------------------------------------------------------------


@dataclass(frozen=True)
class Saved:
    """A snapshot kept server-side, with what the instance must know besides the env state."""

    state: Any
    task: int
    done: bool
    observation: Observation


@dataclass(eq=False)
class Instance:
    id: int
    family: str
    env: Env
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    task: int = 0
    done: bool = False
    observation: Observation = field(default_factory=lambda: Observation(""))
    snapshots: OrderedDict[int, Saved] = field(default_factory=OrderedDict)
    next_snapshot: int = 1
    answered: tuple[str, bytes] | None = None  # (request_id, body) of the last mutating request

    def keep(self, saved: Saved, limit: int) -> int:
        snapshot_id = self.next_snapshot
        self.next_snapshot += 1
        self.snapshots[snapshot_id] = saved
        while len(self.snapshots) > limit:
            self.snapshots.popitem(last=False)
        return snapshot_id

    def saved(self, snapshot_id: int) -> Saved:
        saved = self.snapshots.get(snapshot_id)
        if saved is None:
            raise ApiError(ErrorCode.UNKNOWN_SNAPSHOT, f"snapshot {snapshot_id} of instance {self.id} is gone")
        self.snapshots.move_to_end(snapshot_id)
        return saved


class Pool:
    """The live instances, their cap and their reaping."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.instances: dict[int, Instance] = {}
        self.spares: dict[str, Env] = {}  # warmed-up envs (default env_args) for the first creates

    def create(self, family: str, env_args: dict[str, Any]) -> Instance:
        if len(self.instances) >= self.config.max_instances:
            raise ApiError(
                ErrorCode.CAPACITY,
                f"server is full: {len(self.instances)} live instances (max {self.config.max_instances}); "
                "close instances or retry later",
            )
        env = (None if env_args else self.spares.pop(family, None)) or build_env(family, env_args)
        instance_id = secrets.randbits(48)  # never reused, even across restarts
        while instance_id in self.instances:
            instance_id = secrets.randbits(48)
        instance = Instance(instance_id, family, env)
        self.instances[instance_id] = instance
        self.metrics.created[family] += 1
        return instance

    def get(self, instance_id: int) -> Instance:
        instance = self.instances.get(instance_id)
        if instance is None:
            raise ApiError(ErrorCode.UNKNOWN_INSTANCE, f"no instance {instance_id} (closed, reaped, or never created)")
        instance.last_used = time.monotonic()
        return instance

    async def close(self, instance: Instance) -> None:
        if self.instances.pop(instance.id, None) is None:
            return
        instance.snapshots.clear()
        try:
            await instance.env.close()
        except Exception:  # a failing close must not keep the instance alive
            log.exception("closing instance %d (%s) failed", instance.id, instance.family)

    async def reap(self) -> int:
        deadline = time.monotonic() - self.config.idle_timeout_s
        reaped = 0
        for instance in list(self.instances.values()):
            # checked right before closing: an earlier close may have let a request in
            if instance.last_used < deadline and not instance.lock.locked():
                await self.close(instance)
                reaped += 1
        self.metrics.reaped += reaped
        return reaped

    async def close_all(self) -> None:
        for instance in list(self.instances.values()):
            async with instance.lock:  # lets an in-flight step finish first
                await self.close(instance)
        spares, self.spares = list(self.spares.values()), {}
        for env in spares:
            with contextlib.suppress(Exception):
                await env.close()


def build_env(family: str, env_args: dict[str, Any]) -> Env:
    try:
        return make_env(family, **env_args)
    except (TypeError, ValueError) as err:
        raise ApiError(ErrorCode.BAD_ENV_ARGS, f"env_args rejected by {family}: {err}") from None


@contextlib.contextmanager
def env_errors(family: str) -> Iterator[None]:
    """An exception from env code becomes a 500 `env_error` answer; the instance lives on."""
    try:
        yield
    except ApiError:
        raise
    except Exception as err:
        log.exception("%s raised", family)
        raise ApiError(ErrorCode.ENV_ERROR, f"{family} raised {type(err).__name__}: {err}"[:500]) from err


# --- metrics ------------------------------------------------------------------------


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip((*self.buckets, math.inf), self.counts, strict=True):
            running += n
            le = "+Inf" if bound == math.inf else repr(bound)
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        return [*out, f"{name}_sum {self.total!r}", f"{name}_count {self.count}"]


@dataclass
class Metrics:
    created: Counter[str] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)
    resets: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    reaped: int = 0
    step_seconds: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))

    def render(self, pool: Pool) -> str:
        live = Counter(i.family for i in pool.instances.values())
        snapshots = sum(len(i.snapshots) for i in pool.instances.values())
        families = sorted(set(live) | set(self.created) | set(pool.config.families))
        lines = [
            "# HELP thicket_env_instances Live env instances.",
            "# TYPE thicket_env_instances gauge",
            *(f'thicket_env_instances{{family="{f}"}} {live[f]}' for f in families),
            "# TYPE thicket_env_instances_created_total counter",
            *(f'thicket_env_instances_created_total{{family="{f}"}} {self.created[f]}' for f in families),
            "# TYPE thicket_env_instances_reaped_total counter",
            f"thicket_env_instances_reaped_total {self.reaped}",
            "# TYPE thicket_env_snapshots gauge",
            f"thicket_env_snapshots {snapshots}",
            "# TYPE thicket_env_steps_total counter",
            *(f'thicket_env_steps_total{{family="{f}"}} {self.steps[f]}' for f in families),
            "# TYPE thicket_env_resets_total counter",
            *(f'thicket_env_resets_total{{family="{f}"}} {self.resets[f]}' for f in families),
            "# TYPE thicket_env_errors_total counter",
            *(f'thicket_env_errors_total{{code="{c}"}} {n}' for c, n in sorted(self.errors.items())),
            "# HELP thicket_env_step_seconds Time in the /step handler (JSON in to JSON out).",
            "# TYPE thicket_env_step_seconds histogram",
            *self.step_seconds.lines("thicket_env_step_seconds"),
        ]
        return "\n".join(lines) + "\n"


# --- request parsing ----------------------------------------------------------------


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """A request's body off the ASGI channel, refused past `limit` bytes."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(ErrorCode.BODY_TOO_LARGE, f"request body of {declared} bytes exceeds {limit}")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(ErrorCode.BODY_TOO_LARGE, f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ApiError(ErrorCode.BAD_JSON, f"request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.BAD_JSON, f"expected a JSON object, got {type(body).__name__}")
    return body


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    return parse_json(await read_body(request.receive, request.headers.get("content-length"), limit))


def int_field(body: dict[str, Any], *names: str, default: int | None = None) -> int:
    """The first of `names` present (AgentGym spells the instance `id` or `env_idx`)."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(ErrorCode.BAD_REQUEST, f"`{name}` must be an integer, got {value!r}")
        return value
    if default is None:
        raise ApiError(ErrorCode.BAD_REQUEST, f"missing `{names[0]}`")
    return default


def task_field(body: dict[str, Any]) -> int:
    task = int_field(body, "data_idx", "task", default=0)
    if task < 0:
        raise ApiError(ErrorCode.BAD_REQUEST, f"`data_idx` must be >= 0, got {task}")
    return task


def action_field(body: dict[str, Any], limit: int) -> str:
    action = body.get("action")
    if not isinstance(action, str):
        raise ApiError(ErrorCode.BAD_REQUEST, f"`action` must be a string, got {action!r}"[:200])
    if len(action) > limit:
        raise ApiError(ErrorCode.ACTION_TOO_LONG, f"action of {len(action)} characters exceeds {limit}")
    return action


def request_id(body: dict[str, Any]) -> str | None:
    value = body.get("request_id")
    return None if value is None else str(value)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_dumps(payload), status, headers, media_type="application/json")


def _dumps(payload: Any) -> bytes:
    try:
        return orjson.dumps(payload, default=str, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:  # text that is not valid UTF-8 (lone surrogates) from an env
        return json.dumps(payload, default=str, ensure_ascii=False).encode(errors="replace")


def observation_fields(observation: Observation) -> dict[str, Any]:
    return {"observation": observation.text, "valid_actions": observation.valid_actions}


def transition_fields(t: Transition) -> dict[str, Any]:
    return {
        **observation_fields(t.observation),
        "reward": t.reward,
        "done": t.done,
        "success": t.success,
        "info": t.info,
    }


# --- the service --------------------------------------------------------------------


class EnvService:
    """The route handlers, over one pool of instances."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.pool = Pool(config, self.metrics)
        self.phase = Phase.STARTING
        self.request_exit: Callable[[], None] = lambda: None  # set by serve(): a graceful shutdown

    # --- lifecycle ---

    async def warm_up(self) -> None:
        """Load each family's shared data (TextCraft's crafting tree, a JVM...) before /ready;
        the warmed-up env serves the family's first /create."""

        async def warm(family: str) -> None:
            env = build_env(family, {})
            await env.reset(0)
            self.pool.spares[family] = env

        await asyncio.gather(*(warm(f) for f in self.config.families))  # async envs overlap
        self.phase = Phase.READY

    async def watch_parent(self) -> None:
        """A sidecar must not outlive a parent killed without the chance to stop it."""
        while os.getppid() == self.config.parent_pid:
            await asyncio.sleep(1.0)
        log.warning("parent process %s is gone: shutting down", self.config.parent_pid)
        self.request_exit()

    async def reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            reaped = await self.pool.reap()
            if reaped:
                log.info("reaped %d idle instance(s)", reaped)

    # --- helpers ---

    def family_of(self, request: Request, body: dict[str, Any] | None = None) -> str:
        family = request.path_params.get("family") or (body or {}).get("family") or self.config.families[0]
        if family not in self.config.families:
            raise ApiError(
                ErrorCode.UNKNOWN_FAMILY,
                f"this server does not serve {family!r}; it serves {', '.join(self.config.families)}",
            )
        return str(family)

    async def body(self, request: Request) -> dict[str, Any]:
        self.family_of(request)  # a /<family>/ prefix must name a served family
        return await read_json(request, self.config.max_body_bytes)

    def instance_from_query(self, request: Request) -> Instance:
        self.family_of(request)
        return self.pool.get(int_field(dict(request.query_params), "id", "env_idx"))

    async def reset_instance(self, instance: Instance, task: int) -> Observation:
        with env_errors(instance.family):
            observation = await instance.env.reset(task)
        instance.task, instance.done, instance.observation = task, False, observation
        self.metrics.resets[instance.family] += 1
        return observation

    async def snapshot_of(self, instance: Instance) -> int:
        if not instance.env.can_snapshot:
            raise ApiError(ErrorCode.CANNOT_SNAPSHOT, f"{instance.family} cannot snapshot; branch by replay")
        with env_errors(instance.family):
            state = await instance.env.snapshot()
        saved = Saved(state, instance.task, instance.done, instance.observation)
        return instance.keep(saved, self.config.max_snapshots)

    async def restore_into(self, instance: Instance, snapshot_id: int) -> None:
        saved = instance.saved(snapshot_id)
        with env_errors(instance.family):
            await instance.env.restore(saved.state)
        instance.task, instance.done, instance.observation = saved.task, saved.done, saved.observation

    def replayed(self, instance: Instance, body: dict[str, Any]) -> bytes | None:
        """The stored answer when this is a retry of the instance's last mutating request."""
        rid = request_id(body)
        if rid is not None and instance.answered is not None and instance.answered[0] == rid:
            return instance.answered[1]
        return None

    def answer(self, instance: Instance, body: dict[str, Any], payload: dict[str, Any]) -> bytes:
        data = _dumps(payload)
        rid = request_id(body)
        instance.answered = (rid, data) if rid is not None else None
        return data

    # --- AgentGym-compatible routes ---

    async def create(self, request: Request) -> Response:
        if self.phase is Phase.DRAINING:
            raise ApiError(ErrorCode.DRAINING, "server is shutting down")
        body = await self.body(request)
        family = self.family_of(request, body)
        if body.get("commands") is not None or body.get("goal") is not None:
            raise ApiError(ErrorCode.UNSUPPORTED, "custom `commands`/`goal` are not supported; pick a task with `data_idx`")
        env_args = body.get("env_args") or {}
        if not isinstance(env_args, dict):
            raise ApiError(ErrorCode.BAD_REQUEST, f"`env_args` must be an object, got {env_args!r}"[:200])
        task = task_field(body)
        with env_errors(family):
            instance = self.pool.create(family, env_args)
        async with instance.lock:
            try:
                observation = await self.reset_instance(instance, task)
            except Exception:
                await self.pool.close(instance)
                raise
            payload = self.reset_payload(instance, observation)
            if body.get("snapshot"):
                payload["snapshot"] = await self.snapshot_of(instance)
        return json_response(payload)

    async def reset(self, request: Request) -> Response:
        body = await self.body(request)
        instance = self.pool.get(int_field(body, "id", "env_idx"))
        task = task_field(body)
        async with instance.lock:
            if (replay := self.replayed(instance, body)) is not None:
                return Response(replay, media_type="application/json")
            observation = await self.reset_instance(instance, task)
            payload = self.reset_payload(instance, observation)
            if body.get("snapshot"):
                payload["snapshot"] = await self.snapshot_of(instance)
            return Response(self.answer(instance, body, payload), media_type="application/json")

    def reset_payload(self, instance: Instance, observation: Observation) -> dict[str, Any]:
        return {"id": instance.id, **observation_fields(observation), "done": False, "reward": 0,
                "family": instance.family, "task": instance.task}

    async def step(self, request: Request) -> Response:
        data, timing = await self.step_json(await self.body(request))
        return Response(data, media_type="application/json", headers={"server-timing": timing})

    async def step_json(self, body: dict[str, Any]) -> tuple[bytes, str]:
        """A /step's answer and its Server-Timing header (env time and the handler's)."""
        started = time.perf_counter()
        instance = self.pool.get(int_field(body, "id", "env_idx"))
        action = action_field(body, self.config.max_action_chars)
        async with instance.lock:
            if (replay := self.replayed(instance, body)) is not None:
                return replay, "replayed;dur=0"
            if body.get("restore") is not None:
                await self.restore_into(instance, int_field(body, "restore"))
            if instance.done and instance.family in self.config.refuse_after_done:
                raise ApiError(ErrorCode.EPISODE_DONE, f"episode of instance {instance.id} is over; reset it")
            env_started = time.perf_counter()
            with env_errors(instance.family):
                transition = await instance.env.step(action)
            env_ms = (time.perf_counter() - env_started) * 1000
            instance.done, instance.observation = transition.done, transition.observation
            payload = transition_fields(transition)
            if body.get("snapshot"):
                payload["snapshot"] = await self.snapshot_of(instance)
            data = self.answer(instance, body, payload)
        elapsed = time.perf_counter() - started
        self.metrics.steps[instance.family] += 1
        self.metrics.step_seconds.observe(elapsed)
        return data, f"env;dur={env_ms:.4f}, handler;dur={elapsed * 1000:.4f}"

    async def close(self, request: Request) -> Response:
        body = await self.body(request)
        instance = self.pool.get(int_field(body, "id", "env_idx"))
        async with instance.lock:
            await self.pool.close(instance)
        return json_response({"id": instance.id, "closed": True})

    async def observation(self, request: Request) -> Response:
        return json_response(self.instance_from_query(request).observation.text)

    async def available_actions(self, request: Request) -> Response:
        valid = self.instance_from_query(request).observation.valid_actions
        return json_response({"available_actions": valid})

    # --- thicket's routes ---

    async def snapshot(self, request: Request) -> Response:
        body = await self.body(request)
        instance = self.pool.get(int_field(body, "id", "env_idx"))
        async with instance.lock:
            return json_response({"id": instance.id, "snapshot": await self.snapshot_of(instance)})

    async def restore(self, request: Request) -> Response:
        body = await self.body(request)
        instance = self.pool.get(int_field(body, "id", "env_idx"))
        async with instance.lock:
            await self.restore_into(instance, int_field(body, "snapshot"))
            fields = observation_fields(instance.observation)
            return json_response({"id": instance.id, **fields, "done": instance.done, "task": instance.task})

    async def describe(self, request: Request) -> Response:
        body = await self.body(request)
        family = self.family_of(request, body)
        env_args = body.get("env_args") or {}
        if not isinstance(env_args, dict):
            raise ApiError(ErrorCode.BAD_REQUEST, f"`env_args` must be an object, got {env_args!r}"[:200])
        with env_errors(family):
            env = build_env(family, env_args)
        try:
            payload = {"family": family, "instructions": env.instructions, "can_snapshot": env.can_snapshot}
        finally:
            await env.close()
        return json_response(payload)

    async def hello(self, request: Request) -> Response:
        family = self.family_of(request)
        return json_response(f"This is environment {family}, served by thicket serve-env.")

    async def families(self, request: Request) -> Response:
        return json_response({"families": list(self.config.families), "phase": self.phase})

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok", "phase": self.phase, "instances": len(self.pool.instances)})

    async def ready(self, request: Request) -> Response:
        status = 200 if self.phase is Phase.READY else 503
        return json_response({"ready": status == 200, "phase": self.phase}, status)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(self.pool), media_type="text/plain; version=0.0.4")

    # --- errors ---

    def error_response(self, code: ErrorCode, message: str, status: int | None = None) -> Response:
        status = status or STATUS[code]
        self.metrics.errors[code] += 1
        return json_response({"error": message, "code": code, "status": status}, status)

    def api_error_response(self, exc: ApiError) -> Response:
        response = self.error_response(exc.code, exc.message)
        if exc.status == 503:
            response.headers["retry-after"] = "1"
        return response

    def crash_response(self, method: str, path: str, exc: Exception) -> Response:
        log.error("%s %s failed: %r", method, path, exc)
        return self.error_response(ErrorCode.ENV_ERROR, f"{type(exc).__name__}: {exc}"[:500])

    async def on_api_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return self.api_error_response(exc)

    async def on_http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(exc.status_code, ErrorCode.BAD_REQUEST)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return self.error_response(code, message, exc.status_code)

    async def on_crash(self, request: Request, exc: Exception) -> Response:
        return self.crash_response(request.method, request.url.path, exc)


class StepRoute:
    """POST /step (and /<family>/step) straight on ASGI, every other request to `app`.

    A search steps once a node, so this is the server's hot route: Starlette's middleware,
    routing, Request and Response took about 40% of the server's CPU a ScienceWorld step
    (py-spy). Answers and errors are the same as through the app's handlers."""

    def __init__(self, svc: EnvService, app: ASGIApp) -> None:
        self.svc = svc
        self.app = app
        self.paths = frozenset({"/step", *(f"/{family}/step" for family in svc.config.families)})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        try:
            declared = next((v.decode() for k, v in scope["headers"] if k == b"content-length"), None)
            raw = await read_body(receive, declared, self.svc.config.max_body_bytes)
            data, timing = await self.svc.step_json(parse_json(raw))
        except ClientDisconnect:
            return
        except ApiError as exc:
            return await self.svc.api_error_response(exc)(scope, receive, send)
        except Exception as exc:
            return await self.svc.crash_response("POST", scope["path"], exc)(scope, receive, send)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data)),
                   (b"server-timing", timing.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})


# --- the app ------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]


def instance_routes(svc: EnvService) -> list[BaseRoute]:
    post: dict[str, Handler] = {
        "/step": svc.step, "/reset": svc.reset, "/create": svc.create, "/close": svc.close,
        "/snapshot": svc.snapshot, "/restore": svc.restore, "/describe": svc.describe,
    }
    get: dict[str, Handler] = {
        "/observation": svc.observation, "/available_actions": svc.available_actions, "/": svc.hello,
    }
    return [
        *(Route(path, handler, methods=["POST"]) for path, handler in post.items()),
        *(Route(path, handler, methods=["GET"]) for path, handler in get.items()),
    ]


def build_app(svc: EnvService) -> ASGIApp:
    service_routes = [
        Route("/health", svc.health), Route("/ready", svc.ready), Route("/metrics", svc.metrics_text),
        Route("/families", svc.families),
    ]
    routes = [*instance_routes(svc), *service_routes, Mount("/{family}", routes=instance_routes(svc))]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await svc.warm_up()
        tasks = [asyncio.create_task(svc.reap_forever())]
        if svc.config.parent_pid is not None:
            tasks.append(asyncio.create_task(svc.watch_parent()))
        log.info("serving %s on http://%s:%d", ", ".join(svc.config.families), svc.config.host, svc.config.port)
        try:
            yield
        finally:
            svc.phase = Phase.DRAINING
            for task in tasks:
                task.cancel()
            await svc.pool.close_all()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: svc.on_api_error, HTTPException: svc.on_http_error, Exception: svc.on_crash},
    )
    app.router.redirect_slashes = False
    return StepRoute(svc, app)


class _Server(uvicorn.Server):
    """uvicorn, marking the service as draining the moment a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, svc: EnvService) -> None:
        super().__init__(config)
        self.svc = svc

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.svc.phase = Phase.DRAINING
        super().handle_exit(sig, frame)


def check_families(families: tuple[str, ...]) -> None:
    if not families:
        raise BadInput("serve-env: name at least one env family")
    unknown = [f for f in families if f not in env_names()]
    if unknown:
        raise BadInput(f"serve-env: unknown env {unknown[0]!r}; expected one of {', '.join(env_names())}")
    for family in families:
        try:
            require(family)
        except EnvNotInstalled as err:
            raise BadInput(f"serve-env: {err}") from None


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise Unavailable(f"serve-env: cannot listen on {host}:{port}: {err.strerror}") from None
    sock.set_inheritable(True)
    return sock


def serve(config: ServerConfig) -> None:
    """Run the server until SIGINT/SIGTERM (then: no new instances, in-flight steps finish, envs close)."""
    check_families(config.families)
    sock = bind(config.host, config.port)
    svc = EnvService(dataclasses.replace(config, port=sock.getsockname()[1]))
    uv_config = uvicorn.Config(
        build_app(svc),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(config.shutdown_grace_s),
        timeout_keep_alive=30,
        proxy_headers=False,  # a sidecar: its clients connect directly
    )
    # uvicorn raises the signal again once it has drained; exit 0 then, as a clean stop.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    server = _Server(uv_config, svc)
    svc.request_exit = lambda: setattr(server, "should_exit", True)
    server.run(sockets=[sock])


def _exit_cleanly(sig: int, frame: Any) -> None:
    raise SystemExit(0)
