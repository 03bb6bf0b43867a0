"""One async client for env servers: thicket's `serve-env` and AgentGym's servers.

    async with EnvClient(ClientConfig("http://127.0.0.1:8080")) as client:
        env = await client.env("textcraft")                      # thicket's server
        env = await client.env("webshop", adapter=Adapter.AGENTGYM)  # an AgentGym server

Each env is a `thicket.envs.remote.RemoteEnv` (the Env protocol over HTTP, with recovery and
snapshots); all envs of a client share its connection pool. Connection errors and 503s are
retried here (exponential backoff, up to a deadline); how each server spells its requests is
in `thicket.envs.dialects`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import Any

import httpx
import orjson
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential, wait_random

import thicket.metrics as metrics
from thicket.envs.dialects import AGENTGYM_DIALECTS, Dialect, ThicketDialect
from thicket.envs.protocol import RewardSemantics
from thicket.envs.remote import RemoteEnv
from thicket.envs.wire import ConnectionLost, EnvServerError, ErrorCode, classify, loads
from thicket.errors import BadInput, Unavailable
from thicket.transport import Exchange, exchange_for

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


class _Busy(Exception):
    """503: the server is full or draining; worth retrying."""


def default_exchange(config: ClientConfig, transport: httpx.AsyncBaseTransport | None = None) -> Exchange:
    return exchange_for(config.url, config.timeout_s, config.max_connections, transport=transport)


@dataclass(frozen=True)
class FamilyInfo:
    family: str
    instructions: str
    can_snapshot: bool
    reward_semantics: RewardSemantics = RewardSemantics.INCREMENT
    data_source: str | None = None
    deterministic: bool = False  # older servers do not say: not declared


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

    @property
    def url(self) -> str:
        return self.config.url

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
            payload = loads(answer.content) if answer.content else None
        except orjson.JSONDecodeError:
            payload = {"error": answer.text[:300] or answer.reason}
            if answer.status < 400:
                raise EnvServerError(f"{path}: answer is not JSON: {answer.text[:200]!r}", answer.status) from None
        problem = classify(payload, answer.status)
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
            if err.code in (ErrorCode.UNKNOWN_FAMILY, ErrorCode.BAD_ENV_ARGS):
                raise BadInput(f"env server {self.config.url}: {err}") from None
            raise
        # a server older than reward_semantics says nothing: its families' rewards were increments or
        # running scores alike, so ask for a current server rather than guess
        semantics = payload.get("reward_semantics")
        if semantics not in tuple(RewardSemantics):
            raise BadInput(f"env server {self.config.url}: /describe does not say how {family}'s rewards add up "
                              f"(reward_semantics {semantics!r}); run a thicket serve-env of this version")
        source = payload.get("data_source")
        return FamilyInfo(family, str(payload["instructions"]), bool(payload["can_snapshot"]),
                          RewardSemantics(semantics), None if source is None else str(source),
                          payload.get("deterministic") is True)

    async def env(self, family: str, env_args: dict[str, Any] | None = None,
                  adapter: Adapter = Adapter.THICKET) -> RemoteEnv:
        return RemoteEnv(self, await self.dialect(family, env_args or {}, adapter))

    async def dialect(self, family: str, env_args: dict[str, Any], adapter: Adapter) -> Dialect:
        if adapter is Adapter.THICKET:
            info = await self.describe(family, env_args)
            return ThicketDialect(family, env_args, info.instructions, info.can_snapshot, info.reward_semantics,
                                  info.data_source, info.deterministic)
        if family not in AGENTGYM_DIALECTS:
            raise BadInput(f"no AgentGym adapter for {family!r}; expected one of {', '.join(AGENTGYM_DIALECTS)}")
        return AGENTGYM_DIALECTS[family](family, env_args)
