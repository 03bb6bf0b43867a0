"""The policy server over HTTP: one call, retried while the server is down (restarting) or
fails it (5xx), its failures turned into ThicketErrors, and what its answers say (their
JSON, their error message, a prompt too long for the model's context)."""

from __future__ import annotations

import logging
import re
from functools import partial
from typing import Any

import httpx
import orjson
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential

import thicket.metrics as metrics
from thicket.errors import BadInput, NothingAnswers, Unavailable
from thicket.policy.openai_config import OpenAIConfig
from thicket.transport import Answer, Exchange, exchange_for
from thicket.unreachable import nobody_listens
from thicket.vllm_server import server_root

log = logging.getLogger("thicket.policy")

# vLLM: a prompt longer than the context ("maximum context length"), or exactly as long (no room
# for a token: "max_tokens must be at least 1, got 0"); OpenAI: context_length_exceeded
_CONTEXT_ERROR = re.compile(r"maximum context length|context_length_exceeded|max_tokens must be at least 1, got 0",
                            re.IGNORECASE)
_CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    httpx.PoolTimeout,
)


class _ServerError(Exception):
    """A 5xx answer: the server is up but failed the request (retried)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ContextTooLong(Exception):
    """A 400 that says the prompt does not fit the model's context."""


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (*_CONNECTION_ERRORS, _ServerError))


def error_message(response: Answer) -> str:
    try:
        body = orjson.loads(response.content)
        error = body.get("error", body) if isinstance(body, dict) else body
        message = error.get("message", error) if isinstance(error, dict) else error
    except ValueError:
        message = response.text
    return " ".join(str(message).split())[:500] or response.reason


def served_models(response: Answer) -> list[str] | None:
    """The model ids of a /models answer; None when it is not an OpenAI-compatible list."""
    try:
        data = orjson.loads(response.content).get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(m.get("id", "?")) if isinstance(m, dict) else "?" for m in data]


def generated(response: Answer) -> dict[str, Any]:
    """The JSON of a generation's (or /tokenize's) answer: a context-length 400 is
    ContextTooLong, any other 4xx BadInput."""
    if response.status == 400 and _CONTEXT_ERROR.search(response.text):
        raise ContextTooLong(error_message(response))
    if response.status >= 400:
        raise BadInput(f"the policy server refused the request (HTTP {response.status}): "
                       f"{error_message(response)}")
    return orjson.loads(response.content)


class ServerConnection:
    """HTTP calls to the server at config.base_url, on at most max_connections connections."""

    def __init__(self, config: OpenAIConfig, max_connections: int) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self.root = server_root(self.base_url)  # vLLM serves /tokenize here, beside the API root
        self.api = self.base_url[len(self.root):]  # the API root's path from there ("/v1")
        self._max_connections = max_connections
        self._exchange: Exchange | None = None

    @property
    def exchange(self) -> Exchange:
        if self._exchange is None:
            headers = {"authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else None
            self._exchange = exchange_for(self.root, self.config.timeout_s, self._max_connections, headers,
                                          connect_timeout_s=min(10.0, self.config.timeout_s))
        return self._exchange

    async def close(self) -> None:
        if self._exchange is not None:
            await self._exchange.aclose()
            self._exchange = None

    async def send(self, method: str, path: str, body: dict[str, Any] | None = None,
                   startup: bool = False) -> Answer:
        """One HTTP call (path from the server's root), retried on connection errors and 5xx;
        errors become ThicketErrors. At start-up, nothing listening for startup_connect_s is a
        wrong URL (BadInput)."""
        # orjson: a reply's JSON (its logprobs a token each) cost the worker more than anything else it does per request
        content = None if body is None else orjson.dumps(body)
        retrying = AsyncRetrying(
            retry=retry_if_exception(_retryable),
            wait=wait_exponential(multiplier=self.config.retry_backoff_s, max=5.0),
            stop=self._give_up_at_startup if startup else self._give_up,
            before_sleep=partial(self._log_retry, startup=startup),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self.exchange(method, path, content)
                    if response.status >= 500:
                        raise _ServerError(response.status, error_message(response))
        except _CONNECTION_ERRORS as exc:
            if startup and (reason := nobody_listens(exc)):
                raise NothingAnswers(f"{self.config.url_field}: nothing answers at {self.base_url} ({reason}, "
                               f"for {self.config.startup_connect_s:g}s): check the URL and that the "
                               "server is running") from None
            raise Unavailable(f"cannot reach the policy server at {self.base_url} for "
                              f"{self.config.retry_deadline_s:g}s: {exc!r}") from None
        except _ServerError as exc:
            raise Unavailable(f"the policy server at {self.base_url} failed "
                              f"{self.config.max_retries + 1} times: {exc}") from None
        except httpx.TimeoutException as exc:
            raise Unavailable(f"the policy server at {self.base_url} did not answer within "
                              f"{self.config.timeout_s:g}s ({type(exc).__name__})") from None
        return response

    def _give_up(self, state: RetryCallState) -> bool:
        """5xx answers get max_retries more tries; a server that is down (restarting) is
        retried until retry_deadline_s."""
        if state.outcome is not None and isinstance(state.outcome.exception(), _ServerError):
            return state.attempt_number > self.config.max_retries
        return (state.seconds_since_start or 0.0) >= self.config.retry_deadline_s

    def _give_up_at_startup(self, state: RetryCallState) -> bool:
        """As _give_up, and also once nothing has listened at the URL for startup_connect_s."""
        err = state.outcome.exception() if state.outcome is not None else None
        waited = (state.seconds_since_start or 0.0) >= self.config.startup_connect_s
        return self._give_up(state) or (waited and err is not None and nobody_listens(err) is not None)

    def _log_retry(self, state: RetryCallState, startup: bool = False) -> None:
        metrics.RETRIES.labels("llm").inc()
        exc = state.outcome.exception() if state.outcome is not None else None
        # waiting at start-up for a server that is not listening yet is expected, not a warning
        level = logging.DEBUG if startup and exc is not None and nobody_listens(exc) else logging.WARNING
        if state.attempt_number == 1 or state.attempt_number % 10 == 0:
            log.log(level, "policy server %s: %s; retrying (attempt %d, %.0f s so far)", self.base_url,
                    type(exc).__name__ if exc else "?", state.attempt_number, state.seconds_since_start or 0.0)
