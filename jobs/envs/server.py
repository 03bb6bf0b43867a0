"""`thicket serve-env`: one HTTP server hosting many env instances (the pod's env sidecar).

Every route of AgentGym's servers for the same families answers with AgentGym's shapes, and
thicket's extras ride along as further fields, so an AgentGym client works unchanged:

    POST /create      {family?, env_args?, data_idx?}     -> {id, observation, done, reward, ...}
    POST /reset       {id | env_idx, data_idx?}           -> {id, observation, done, reward, ...}
    POST /step        {id | env_idx, action}              -> {observation, reward, done, success, ...}
    POST /close       {id | env_idx}                      -> {id, closed}
    GET  /observation?id=  (or env_idx=)                  -> "the current observation"
    GET  /available_actions?id=                           -> {available_actions: [...] | null}
    GET  /detail?id=                                      -> AgentGym's ALFWorld record
    GET  /list_envs, /instruction_text?env_idx=, /state?env_idx=  -> AgentGym's WebShop answers

Each of these is also mounted under /<family>/ (e.g. /textcraft/create), so a client written
for AgentGym's textcraft server works with base URL http://host:port/textcraft; a bare /create
makes the first family served.

ALFWorld instances made by a /create with no body, and WebShop requests that name the instance
`env_idx` (AgentGym's clients), are answered in AgentGym's own shapes, nothing more
(`thicket.envs.webshop.agentgym`, `thicket.envs.alfworld.agentgym`).

thicket's own routes: GET /health, /ready, /metrics (Prometheus text), /families;
POST /describe {family, env_args} -> {instructions, can_snapshot, reward_semantics}; POST /snapshot {id} ->
{snapshot}; POST /restore {id, snapshot}.

Snapshots stay server-side: a snapshot id names a state kept in its instance (at most
`max_snapshots` per instance, least recently used evicted) until the instance is closed or
reaped. A client holding an id that is gone (evicted, reaped, server restarted) gets 404
`unknown_snapshot` / `unknown_instance` and rebuilds the state by replay. /step and /reset take
`snapshot: true` (answer with a snapshot id of the new state) and /step takes `restore: <id>`
(restore first), so a tree search pays one round trip per step. Mutating requests may carry a
`request_id`; a retry with the same id gets the first answer again instead of a second step.

Errors are JSON `{"error": message, "code": ErrorCode, "status": http_status}`.

This module assembles the app (with a fast path for /step) and runs it; the handlers are in
`thicket.envs.service`, the instances in `thicket.envs.pool`, the wire format in `thicket.envs.wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from thicket.envs import EnvNotInstalled, env_names, require
from thicket.envs.request_body import read_body
from thicket.envs.service import EnvService, Phase, ServerConfig
from thicket.envs.wire import ApiError, parse_json
from thicket.errors import BadInput, Unavailable

log = logging.getLogger("thicket.envs.server")


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
        "/list_envs": svc.list_envs, "/instruction_text": svc.instruction_text, "/state": svc.webshop_state,
        "/detail": svc.detail,
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
