"""The env server's route handlers (`EnvService`) over one pool of instances, and its config.

`thicket.envs.server` mounts these handlers in the app and serves it; the wire format they speak
is in `thicket.envs.wire`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from thicket.envs.alfworld import agentgym as alfworld
from thicket.envs.pool import Instance, Pool, Saved, build_env, env_errors
from thicket.envs.protocol import Observation
from thicket.envs.request_body import read_body, read_json
from thicket.envs.server_metrics import CONTENT_TYPE, ServerMetrics
from thicket.envs.webshop import agentgym as webshop
from thicket.envs.wire import (
    STATUS,
    ApiError,
    ErrorCode,
    action_field,
    dumps,
    env_args_field,
    int_field,
    observation_fields,
    request_id,
    task_field,
    transition_fields,
)

log = logging.getLogger("thicket.envs.server")

# AgentGym's servers for these families refuse /step once the episode is over.
AGENTGYM_REFUSE_AFTER_DONE = frozenset({"sciworld", "alfworld", "babyai"})


class Phase(StrEnum):
    STARTING = "starting"  # loading the families' data
    READY = "ready"
    DRAINING = "draining"  # shutting down: no new instances


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


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(payload), status, headers, media_type="application/json")


class EnvService:
    """The route handlers, over one pool of instances."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.pool = Pool(config.max_instances, config.idle_timeout_s)
        self.metrics = ServerMetrics(config.families, self.pool.census)
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
            self.metrics.reaped += reaped
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
        data = dumps(payload)
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
        env_args = env_args_field(body)
        task = task_field(body)
        agentgym = alfworld.wants_shapes(family, body)
        with env_errors(family):
            instance = self.pool.create(family, alfworld.ENV_ARGS if agentgym else env_args)
        self.metrics.created[family] += 1
        if agentgym:  # AgentGym's ALFWorld: an instance with no game until its reset
            instance.agentgym = alfworld.new_record()
            return json_response({"id": instance.id})
        async with instance.lock:
            try:
                observation = await self.reset_instance(instance, task)
            except Exception:
                await self.pool.close(instance)
                raise
            payload = self.reset_payload(instance, observation)
            if body.get("snapshot"):
                payload["snapshot"] = await self.snapshot_of(instance)
        return json_response(instance.id if webshop.wants_bare_id(family, body) else payload)

    async def reset(self, request: Request) -> Response:
        body = await self.body(request)
        instance = self.pool.get(int_field(body, "id", "env_idx"))
        session = webshop.session_task(instance.env, instance.family, body)
        game = alfworld.reset_task(instance.family, body, instance.agentgym)
        task = game if game is not None else task_field(body) if session is None else session
        async with instance.lock:
            if (replay := self.replayed(instance, body)) is not None:
                return Response(replay, media_type="application/json")
            observation = await self.reset_instance(instance, task)
            if session is not None:  # AgentGym's WebShop answers [observation, null]
                return json_response([observation.text, None])
            if instance.agentgym is not None:
                folder = getattr(instance.env, "game_folder", None)
                payload = alfworld.reset_answer(instance.id, task, observation, folder, instance.agentgym)
                if body.get("snapshot"):
                    payload["snapshot"] = await self.snapshot_of(instance)
                return Response(self.answer(instance, body, payload), media_type="application/json")
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
            if instance.agentgym is not None and (refused := alfworld.refusal(instance.id, instance.agentgym)):
                self.metrics.errors[ErrorCode.EPISODE_DONE if instance.agentgym["done"] else ErrorCode.BAD_REQUEST] += 1
                return dumps(refused), "refused;dur=0"  # AgentGym's: 200 with an `error`
            if instance.done and instance.family in self.config.refuse_after_done:
                raise ApiError(ErrorCode.EPISODE_DONE, f"episode of instance {instance.id} is over; reset it")
            env_started = time.perf_counter()
            with env_errors(instance.family):
                transition = await instance.env.step(action)
            env_ms = (time.perf_counter() - env_started) * 1000
            instance.done, instance.observation = transition.done, transition.observation
            payload = transition_fields(transition)
            if instance.agentgym is not None:
                payload = alfworld.step_answer(transition, instance.agentgym)
            if instance.family == webshop.FAMILY:
                payload["state"] = transition.observation.text  # AgentGym's WebShop field
                if webshop.speaks_agentgym(instance.family, body):  # its StepResponse, nothing more
                    payload = webshop.step_payload(transition.observation.text, transition.reward, transition.done)
            if body.get("snapshot"):
                payload["snapshot"] = await self.snapshot_of(instance)
            data = self.answer(instance, body, payload)
        elapsed = time.perf_counter() - started
        self.metrics.count_step(instance.family, elapsed)
        return data, f"env;dur={env_ms:.4f}, handler;dur={elapsed * 1000:.4f}"

    async def close(self, request: Request) -> Response:
        body = await self.body(request)
        instance = self.pool.get(int_field(body, "id", "env_idx"))
        async with instance.lock:
            await self.pool.close(instance)
        return json_response({"id": instance.id, "closed": True})

    async def observation(self, request: Request) -> Response:
        instance = self.instance_from_query(request)
        if instance.agentgym is not None:
            return json_response(alfworld.refusal(instance.id, instance.agentgym) or instance.agentgym["observation"])
        return json_response(instance.observation.text)

    async def available_actions(self, request: Request) -> Response:
        instance = self.instance_from_query(request)
        if instance.agentgym is not None:  # AgentGym's ALFWorld: a bare list
            return json_response(alfworld.refusal(instance.id, instance.agentgym) or instance.agentgym["available_actions"])
        if instance.family == webshop.FAMILY:
            return json_response(webshop.available_actions(instance.env))
        return json_response({"available_actions": instance.observation.valid_actions})

    async def detail(self, request: Request) -> Response:
        """AgentGym's ALFWorld GET /detail: its record of the instance (thicket's instances: 404)."""
        instance = self.instance_from_query(request)
        if instance.agentgym is None:
            raise ApiError(ErrorCode.NOT_FOUND, f"/detail is AgentGym's ALFWorld route; instance {instance.id} was "
                           "made by thicket's /create (a body): see its answers")
        return json_response(alfworld.refusal(instance.id, instance.agentgym) or instance.agentgym)

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
        env_args = env_args_field(body)
        with env_errors(family):
            env = build_env(family, env_args)
        try:
            payload = {"family": family, "instructions": env.instructions, "can_snapshot": env.can_snapshot,
                       "reward_semantics": env.reward_semantics.value, "data_source": env.data_source,
                       "deterministic": env.deterministic}
        finally:
            await env.close()
        return json_response(payload)

    async def hello(self, request: Request) -> Response:
        family = self.family_of(request)
        if family == webshop.FAMILY:
            return json_response("ok")  # AgentGym's WebShop server
        return json_response(f"This is environment {family}, served by thicket serve-env.")

    # --- AgentGym's WebShop-only routes ---

    def webshop_instance(self, request: Request) -> Instance:
        instance = self.instance_from_query(request)
        if instance.family != webshop.FAMILY:
            raise ApiError(ErrorCode.NOT_FOUND,
                           f"{request.url.path} is a webshop route; instance {instance.id} is {instance.family}")
        return instance

    async def list_envs(self, request: Request) -> Response:
        if self.family_of(request) != webshop.FAMILY:
            raise ApiError(ErrorCode.NOT_FOUND, f"{request.url.path} is a webshop route")
        return json_response([i.id for i in self.pool.instances.values() if i.family == webshop.FAMILY])

    async def instruction_text(self, request: Request) -> Response:
        return json_response(webshop.instruction_text(self.webshop_instance(request).env))

    async def webshop_state(self, request: Request) -> Response:
        return json_response(webshop.state(self.webshop_instance(request).env))

    async def families(self, request: Request) -> Response:
        return json_response({"families": list(self.config.families), "phase": self.phase})

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok", "phase": self.phase, "instances": len(self.pool.instances)})

    async def ready(self, request: Request) -> Response:
        status = 200 if self.phase is Phase.READY else 503
        return json_response({"ready": status == 200, "phase": self.phase}, status)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

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
