"""OpenAIPolicy against a real vLLM (CPU, tiny random model) and against scripted HTTP servers.

The model's weights are random: its free text is noise, so tests check structure
(ids, logprobs, seeds, constraints, caching, errors), never content.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.http_stub import QuietHandler, serving
from thicket.errors import BadInput, Unavailable
from thicket.policy import prompts
from thicket.policy.answers import action_token_start
from thicket.policy.base import Messages, Reply
from thicket.policy.openai import OpenAIConfig, OpenAIPolicy, drop_oldest_exchange
from thicket.tiny_model import build_tiny_model
from thicket.transport import free_port
from thicket.vllm_server import (
    VLLMServer,
    parse_prefix_cache_counters,
    prefix_cache_counters,
)

VALID = ("get 1 oak log", "craft 4 oak planks using 1 oak log", "inventory", "get 2 white wool")
TASK: Messages = [
    prompts.system_message("You are playing TextCraft. Craft the goal item."),
    prompts.observation_message("Goal: craft stick. Inventory: [oak log] (1)", VALID, True),
]


def config_for(url: str, model: str = "m", **overrides: Any) -> OpenAIConfig:
    base = OpenAIConfig(base_url=url, model=model, max_tokens=32, max_thought_chars=24,
                       max_retries=2, retry_backoff_s=0.01, timeout_s=30.0)
    return replace(base, **overrides)


@asynccontextmanager
async def started(config: OpenAIConfig) -> AsyncIterator[OpenAIPolicy]:
    policy = OpenAIPolicy(config)
    try:
        await policy.start()
        yield policy
    finally:
        await policy.close()


def served(server: VLLMServer, **overrides: Any) -> OpenAIConfig:
    overrides.setdefault("model", server.served_name)
    return config_for(server.url, **overrides)


def assert_sampled(reply: Reply) -> None:
    assert reply.token_ids and len(reply.logprobs) == len(reply.token_ids)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in reply.logprobs)


# -- against vLLM ---------------------------------------------------------------------


@pytest.mark.vllm
async def test_propose_returns_n_replies_with_ids_and_logprobs(vllm_server: VLLMServer) -> None:
    async with started(served(vllm_server)) as policy:
        replies = await policy.propose(TASK, 3, valid_actions=VALID, seed=100, temperature=1.0)
    assert len(replies) == 3
    for reply in replies:
        assert_sampled(reply)
        assert reply.prompt_token_ids and not reply.constrained
        assert (reply.thought, reply.action) == prompts.parse_reply(reply.text)
    assert [r.seed for r in replies] == [100, 101, 102]
    for reply in replies:  # each sample is its own request, with its own usage
        assert reply.prompt_tokens == len(reply.prompt_token_ids or []) > 0
        assert reply.cached_tokens is not None


@pytest.mark.vllm
async def test_seeds_reproduce_and_differ(vllm_server: VLLMServer) -> None:
    async with started(served(vllm_server)) as policy:
        first = await policy.propose(TASK, 3, valid_actions=VALID, seed=7, temperature=1.0)
        again = await policy.propose(TASK, 3, valid_actions=VALID, seed=7, temperature=1.0)
        other = await policy.propose(TASK, 3, valid_actions=VALID, seed=1007, temperature=1.0)
        shifted = await policy.propose(TASK, 1, valid_actions=VALID, seed=8, temperature=1.0)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    for a, b in zip(first, again, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len({tuple(r.token_ids) for r in first}) == 3
    assert not {tuple(r.token_ids) for r in first} & {tuple(r.token_ids) for r in other}
    assert shifted[0].token_ids == first[1].token_ids  # sample i uses seed + i


@pytest.mark.vllm
async def test_constrained_actions_are_always_valid(vllm_server: VLLMServer) -> None:
    async with started(served(vllm_server, constrain_actions=True)) as policy:
        batches = [await policy.propose(TASK, 16, valid_actions=VALID, seed=s * 16, temperature=1.0)
                   for s in range(4)]
    replies = [r for batch in batches for r in batch]
    assert len(replies) == 64
    for reply in replies:
        assert reply.constrained and reply.finish_reason == "stop"
        assert reply.action in VALID
        assert reply.text.startswith("Thought: ") and "\n" not in reply.thought
        assert 0 < reply.action_token_start < len(reply.token_ids)
        assert_sampled(reply)
    assert len({r.action for r in replies}) > 1


@pytest.mark.vllm
async def test_unbounded_thoughts_still_end_in_valid_actions(vllm_server: VLLMServer) -> None:
    """The tiny model's noise seldom ends a line: its unbounded thoughts run into the token
    budget, and act() chooses their actions."""
    async with started(served(vllm_server, constrain_actions=True, max_thought_chars=0, max_tokens=24)) as policy:
        replies = await policy.propose(TASK, 6, valid_actions=VALID, seed=300, temperature=1.0)
    assert len(replies) == 6
    for reply in replies:
        assert reply.constrained and reply.action in VALID and "\n" not in reply.thought
        assert reply.text == prompts.turn(reply.thought, reply.action)
        assert 0 < reply.action_token_start < len(reply.token_ids)
        assert_sampled(reply)


ODD_ACTIONS = ("put 1 oak log in box #2 & close it", "look at a.b (c)?", "say ~x+y* [z] {w} | $v ^u \\t")


def test_action_grammar_holds_each_action_literally() -> None:
    grammar = prompts.action_grammar(ODD_ACTIONS + VALID + ('say "hi"\n\tok',), 0)
    assert "\n" not in grammar  # one line: vLLM reads a grammar line by line to tell EBNF from Lark
    head, choices = grammar.split(' "\\nAction: " ')
    assert head == 'root ::= "Thought: " [^\\n]*'
    literals = re.findall(r'"(?:[^"\\]|\\.)*"', choices)
    assert [json.loads(literal) for literal in literals] == [*ODD_ACTIONS, *VALID, 'say "hi"\n\tok']
    assert choices == "(" + " | ".join(literals) + ")"
    assert "{0,24}" in prompts.action_grammar(VALID, 24)


@pytest.mark.vllm
async def test_the_server_reads_action_grammars_without_warnings(vllm_server: VLLMServer) -> None:
    """xgrammar warned once per escape it does not know (re.escape's escaped spaces), for
    every request: hundreds of log lines each. The log must stay quiet, the actions whole."""
    assert vllm_server.log_path is not None
    logged = vllm_server.log_path.stat().st_size
    async with started(served(vllm_server, constrain_actions=True)) as policy:
        replies = await policy.propose(TASK, 8, valid_actions=ODD_ACTIONS + VALID, seed=7, temperature=1.0)
    assert {r.action for r in replies} <= set(ODD_ACTIONS + VALID)
    with vllm_server.log_path.open("rb") as log:
        log.seek(logged)
        assert b"is not recognized" not in log.read()


@pytest.mark.vllm
async def test_the_action_grammar_samples_as_the_same_language_as_a_regex(vllm_server: VLLMServer) -> None:
    """The EBNF grammar is the language the regex was (a bounded thought line, then one
    action), so the server masks the same tokens: the same seeds give the same samples."""
    actions = ODD_ACTIONS + VALID
    literal = "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", a) for a in actions)
    regex = f"Thought: [^\\n]{{0,24}}\\nAction: ({literal})"
    ebnf = prompts.action_grammar(actions, 24)
    body = {"model": vllm_server.served_name, "prompt": "Act now.", "max_tokens": 200, "temperature": 1.0,
            "return_token_ids": True}
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=120) as client:
        async def sample(constraint: dict[str, str], seed: int) -> dict[str, Any]:
            answer = await client.post("/completions", json=body | {"seed": seed, "structured_outputs": constraint})
            answer.raise_for_status()
            return answer.json()["choices"][0]
        for seed in range(6):
            by_regex, by_grammar = await asyncio.gather(sample({"regex": regex}, seed), sample({"grammar": ebnf}, seed))
            assert by_grammar["token_ids"] == by_regex["token_ids"] and by_grammar["text"] == by_regex["text"]
            assert prompts.parse_reply(by_grammar["text"])[1] in actions


@pytest.mark.vllm
async def test_act_completes_a_thought_with_one_action(vllm_server: VLLMServer) -> None:
    """act() is how propose completes a constrained reply that its budget cut before the action."""
    thought = Reply(text="Thought: get wood", thought="get wood", action="", token_ids=[11, 12], logprobs=[-1.0, -2.0])
    async with started(served(vllm_server, constrain_actions=True)) as policy:
        turns = [await policy.act(TASK, thought, valid_actions=VALID, seed=60 + i, temperature=1.0) for i in range(3)]
    async with started(served(vllm_server)) as policy:
        free = await policy.act(TASK, thought, valid_actions=VALID, seed=80, temperature=1.0)
    for turn in turns:
        assert turn.action in VALID and turn.constrained
        assert turn.text == prompts.turn("get wood", turn.action)
        assert prompts.parse_reply(turn.text) == ("get wood", turn.action)
        assert turn.token_ids[:2] == [11, 12] and turn.action_token_start == 2 < len(turn.token_ids)
        assert len(turn.logprobs) == len(turn.token_ids)
    assert "\n" not in free.action and not free.constrained
    assert free.action_token_start == 2 and free.logprobs[:2] == [-1.0, -2.0]


@pytest.mark.vllm
async def test_prefix_cache_serves_a_reused_prefix(vllm_server: VLLMServer) -> None:
    nonce = uuid.uuid4().hex  # a prefix no other test has sent
    recipes = " ".join(f"craft {k} oak planks using 1 oak log;" for k in range(60))
    task: Messages = [prompts.system_message(f"Session {nonce}. Recipes: {recipes}"), TASK[1]]
    child = prompts.extend(task, "Thought: get wood\nAction: get 1 oak log", prompts.observation_message("Got 1 oak log", None, False))
    before = await prefix_cache_counters(vllm_server.url)
    async with started(served(vllm_server)) as policy:
        parent = await policy.propose(task, 1, valid_actions=VALID, seed=1)
        reused = await policy.propose(child, 1, valid_actions=VALID, seed=2)
    after = await prefix_cache_counters(vllm_server.url)
    assert parent[0].prompt_tokens > 256
    assert parent[0].cached_tokens == 0
    assert (reused[0].cached_tokens or 0) >= 256  # whole blocks (128 tokens on CPU)
    assert before is not None and after is not None
    assert after[0] - before[0] >= reused[0].cached_tokens
    assert after[1] > before[1]


@pytest.mark.vllm
async def test_context_overflow_drops_the_oldest_exchange(vllm_server: VLLMServer) -> None:
    filler = "craft 4 oak planks using 1 oak log. " * 350  # ~2,500 tokens of the tiny tokenizer
    history = prompts.extend(TASK, f"Thought: {filler}\nAction: inventory", prompts.observation_message(filler, None, False))
    history = prompts.extend(history, "Thought: ok\nAction: inventory", prompts.observation_message("ok", None, False))
    async with started(served(vllm_server)) as policy:
        [reply] = await policy.propose(history, 1, valid_actions=VALID, seed=3)
        too_long = [TASK[0], {"role": "user", "content": filler * 2}]
        with pytest.raises(BadInput, match="context"):
            await policy.propose(too_long, 1, valid_actions=VALID, seed=3)
    short = prompts.extend(TASK, "Thought: ok\nAction: inventory", prompts.observation_message("ok", None, False))
    assert reply.prompt_tokens < 1000
    assert reply.prompt_tokens == len(reply.prompt_token_ids or []) > 0
    async with started(served(vllm_server)) as policy:
        [expected] = await policy.propose(short, 1, valid_actions=VALID, seed=3)
    assert reply.prompt_token_ids == expected.prompt_token_ids


@pytest.mark.vllm
async def test_prompts_rendered_once_give_the_chat_endpoints_samples(vllm_server: VLLMServer) -> None:
    """With render_once (vLLM serves /tokenize) the samples go to /completions on the prompt's
    ids: the same ids, tokens and logprobs as /chat/completions gives, proposed and acted."""
    thought = Reply(text="Thought: get wood", thought="get wood", action="", token_ids=[11], logprobs=[-1.0])
    runs = {}
    for render_once in (True, False):
        async with started(served(vllm_server, constrain_actions=True, render_once=render_once)) as policy:
            assert policy.renders_once is render_once
            replies = await policy.propose(TASK, 3, valid_actions=VALID, seed=500, temperature=1.0)
            free = await policy.propose(TASK, 2, valid_actions=None, seed=600, temperature=1.0)
            turn = await policy.act(TASK, thought, valid_actions=VALID, seed=700, temperature=1.0)
        runs[render_once] = [*replies, *free, turn]
    for once, chat in zip(runs[True], runs[False], strict=True):
        assert once.token_ids == chat.token_ids and once.text == chat.text
        assert once.prompt_token_ids == chat.prompt_token_ids and once.prompt_tokens == chat.prompt_tokens
        assert once.action_token_start == chat.action_token_start and once.action == chat.action
        assert once.logprobs == pytest.approx(chat.logprobs, abs=1e-4)
    assert runs[True][-1].action in VALID and len({tuple(r.token_ids) for r in runs[True]}) == 6


@pytest.mark.vllm
async def test_wrong_model_name_is_bad_input(vllm_server: VLLMServer) -> None:
    with pytest.raises(BadInput, match=f"not served.*it serves: {vllm_server.served_name}"):
        async with started(served(vllm_server, model="no-such-model")):
            pass


@pytest.mark.vllm
async def test_many_concurrent_requests(vllm_server: VLLMServer) -> None:
    async with started(served(vllm_server, concurrency=16, max_tokens=16)) as policy:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(
            policy.propose(TASK, 2, valid_actions=VALID, seed=2 * k) for k in range(48)
        ))
        elapsed = time.perf_counter() - t0
    assert all(len(r) == 2 for r in results)
    print(f"48 requests (n=2, 16 tokens) in {elapsed:.2f}s: {48 / elapsed:.1f} req/s")


# -- servers that fail ------------------------------------------------------------------


async def test_unreachable_server_is_unavailable_quickly() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    started_at = time.perf_counter()
    policy = OpenAIPolicy(config_for(url, retry_deadline_s=1.0))
    with pytest.raises(Unavailable, match="cannot reach the policy server at"):
        await policy.propose(TASK, 1, valid_actions=VALID, seed=5)  # mid-run: an outage
    await policy.close()
    assert time.perf_counter() - started_at < 3.0


async def test_nothing_listening_at_start_up_is_a_wrong_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    started_at = time.perf_counter()
    with pytest.raises(BadInput, match=r"^policy.url: nothing answers at .* \(connection refused, for 0.5s\)"):
        async with started(config_for(url, startup_connect_s=0.5)):
            pass
    assert 0.5 <= time.perf_counter() - started_at < 3.0


def chat_body(text: str = "Thought: hi\nAction: inventory") -> dict[str, Any]:
    tokens = ["Thought", ":", " hi", "\n", "Action", ":", " inventory"]
    return {
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
            "token_ids": list(range(len(tokens))),
            "logprobs": {"content": [{"token": t, "logprob": -0.5} for t in tokens]},
        }],
        "prompt_token_ids": [1, 2, 3],
        "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}},
    }


class Scripted(QuietHandler):
    """Answers each POST with the next (status, body, delay) of `script`."""

    script: list[tuple[int, Any, float]] = []
    bodies: list[dict[str, Any]] = []
    keys: list[str | None] = []  # each POST's authorization header

    def do_POST(self) -> None:
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.keys.append(self.headers.get("Authorization"))
        status, body, delay = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        time.sleep(delay)
        self.answer(status, json.dumps(body).encode())


@contextmanager
def scripted(*script: tuple[int, Any, float]) -> Iterator[tuple[str, type[Scripted]]]:
    handler = type("Handler", (Scripted,), {"script": list(script), "bodies": [], "keys": []})
    with serving(handler) as url:
        yield f"{url}/v1", handler


@contextmanager
def scripted_server(*script: tuple[int, Any, float]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    with scripted(*script) as (url, handler):
        yield url, handler.bodies


async def test_5xx_is_retried_then_succeeds() -> None:
    error = {"error": {"message": "overloaded"}}
    with scripted_server((503, error, 0), (503, error, 0), (200, chat_body(), 0)) as (url, bodies):
        policy = OpenAIPolicy(config_for(url, max_retries=3))
        [reply] = await policy.propose(TASK, 1, valid_actions=VALID, seed=5)
        await policy.close()
    assert len(bodies) == 3
    assert reply.action == "inventory" and reply.token_ids == list(range(7))
    assert reply.action_token_start == 4
    assert reply.prompt_token_ids == [1, 2, 3]


async def test_5xx_exhausted_is_unavailable() -> None:
    with scripted_server((500, {"error": {"message": "boom"}}, 0)) as (url, bodies):
        policy = OpenAIPolicy(config_for(url, max_retries=2))
        with pytest.raises(Unavailable, match="failed 3 times: HTTP 500: boom"):
            await policy.propose(TASK, 1, valid_actions=VALID, seed=5)
        await policy.close()
    assert len(bodies) == 3


async def test_other_4xx_is_bad_input_in_one_line() -> None:
    error = {"error": {"message": "temperature must be\nnon-negative", "code": 400}}
    with scripted_server((400, error, 0)) as (url, bodies):
        policy = OpenAIPolicy(config_for(url))
        with pytest.raises(BadInput, match="HTTP 400\\): temperature must be non-negative$"):
            await policy.propose(TASK, 1, valid_actions=VALID, seed=5, temperature=-1)
        await policy.close()
    assert len(bodies) == 1


async def test_read_timeout_is_not_retried() -> None:
    with scripted_server((200, chat_body(), 2.0)) as (url, bodies):
        policy = OpenAIPolicy(config_for(url, timeout_s=0.5))
        with pytest.raises(Unavailable, match="did not answer within 0.5s"):
            await policy.propose(TASK, 1, valid_actions=VALID, seed=5)
        await policy.close()
    assert len(bodies) == 1


async def test_request_fields_sent() -> None:
    with scripted((200, chat_body(), 0)) as (url, handler):
        policy = OpenAIPolicy(config_for(url, constrain_actions=True, api_key="sk-test"))
        await policy.propose(TASK, 4, valid_actions=VALID, seed=40)
        await policy.act(TASK, Reply(text="", thought="hm", action=""), valid_actions=VALID, seed=9)
        await policy.close()
    *proposes, act = handler.bodies
    assert handler.keys == ["Bearer sk-test"] * 5
    assert sorted(body["seed"] for body in proposes) == [40, 41, 42, 43]  # one request per sample
    propose = proposes[0]
    assert propose.get("n", 1) == 1 and propose["logprobs"] is True
    assert propose["return_token_ids"] is True
    assert propose["structured_outputs"] == {"grammar": prompts.action_grammar(VALID, 24)}
    assert not any(key.startswith("guided_") for key in propose)
    assert act["structured_outputs"] == {"choice": list(VALID)}
    assert act["continue_final_message"] is True and act["add_generation_prompt"] is False
    assert act["messages"][-1] == {"role": "assistant", "content": "Thought: hm\nAction: "}


def completion_body(text: str = "Thought: hi\nAction: inventory") -> dict[str, Any]:
    tokens = ["Thought", ":", " hi", "\n", "Action", ":", " inventory"]
    return {
        "choices": [{
            "index": 0, "text": text, "finish_reason": "stop", "token_ids": list(range(len(tokens))),
            "logprobs": {"tokens": tokens, "token_logprobs": [-0.5] * len(tokens), "top_logprobs": [None] * len(tokens)},
        }],
        "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
    }


class Routed(QuietHandler):
    """A server that lists model m and answers each POST by its path (`answers`), with
    every (path, body) kept in `posts`; paths it lacks answer 404."""

    answers: dict[str, Any] = {}
    posts: list[tuple[str, dict[str, Any]]] = []

    def do_GET(self) -> None:
        self.answer(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        self.posts.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
        found = self.path in self.answers
        self.answer(200 if found else 404, json.dumps(self.answers.get(self.path, {"detail": "Not Found"})).encode())


@contextmanager
def routed(answers: dict[str, Any]) -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    handler = type("Handler", (Routed,), {"answers": answers, "posts": []})
    with serving(handler) as url:
        yield f"{url}/v1", handler.posts


async def test_a_server_with_tokenize_renders_each_prompt_once() -> None:
    answers = {"/tokenize": {"count": 3, "max_model_len": 2048, "tokens": [1, 2, 3]}, "/v1/completions": completion_body()}
    with routed(answers) as (url, posts):
        async with started(config_for(url, constrain_actions=True, extra_body={"chat_template_kwargs": {"x": 1}})) as policy:
            replies = await policy.propose(TASK, 3, valid_actions=VALID, seed=40)
            await policy.act(TASK, Reply(text="", thought="hm", action=""), valid_actions=VALID, seed=9)
    probe, render, *samples, act_render, act = posts
    assert probe[0] == render[0] == act_render[0] == "/tokenize"
    assert render[1]["messages"] == TASK and render[1]["add_generation_prompt"] is True
    assert render[1]["continue_final_message"] is False and render[1]["chat_template_kwargs"] == {"x": 1}
    assert [path for path, _ in samples] == ["/v1/completions"] * 3  # the samples share one render
    assert sorted(body["seed"] for _, body in samples) == [40, 41, 42]
    body = samples[0][1]
    assert body["prompt"] == [1, 2, 3] and body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["structured_outputs"] == {"grammar": prompts.action_grammar(VALID, 24)}
    assert "messages" not in body and "chat_template_kwargs" not in body
    assert act_render[1]["continue_final_message"] is True and act_render[1]["add_generation_prompt"] is False
    assert act_render[1]["messages"][-1] == {"role": "assistant", "content": "Thought: hm\nAction: "}
    assert act[1]["structured_outputs"] == {"choice": list(VALID)} and act[1]["prompt"] == [1, 2, 3]
    for reply in replies:
        assert reply.action == "inventory" and reply.token_ids == list(range(7)) and reply.action_token_start == 4
        assert reply.logprobs == [-0.5] * 7 and reply.prompt_token_ids == [1, 2, 3]
        assert (reply.prompt_tokens, reply.cached_tokens) == (3, 2)


async def test_a_server_without_tokenize_gets_chat_requests() -> None:
    with routed({"/v1/chat/completions": chat_body()}) as (url, posts):
        async with started(config_for(url)) as policy:
            assert not policy.renders_once
            [reply] = await policy.propose(TASK, 1, valid_actions=VALID, seed=40)
    assert [path for path, _ in posts] == ["/tokenize", "/v1/chat/completions"]
    assert posts[1][1]["messages"] == TASK and posts[1][1]["logprobs"] is True
    assert reply.action == "inventory" and reply.prompt_token_ids == [1, 2, 3]


def cut_body(tokens: list[str]) -> dict[str, Any]:
    """A reply the token budget cut (finish_reason length) after these tokens."""
    body = chat_body("".join(tokens))
    body["choices"][0] |= {
        "finish_reason": "length",
        "token_ids": [100 + i for i in range(len(tokens))],
        "logprobs": {"content": [{"token": t, "logprob": -0.25} for t in tokens]},
    }
    return body


def act_body(action: str) -> dict[str, Any]:
    body = chat_body(action)
    body["choices"][0] |= {"token_ids": [7, 8], "logprobs": {"content": [{"token": action, "logprob": -0.1},
                                                                         {"token": "", "logprob": -0.2}]}}
    body["usage"] = {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 6}}
    return body


@pytest.mark.parametrize("tokens, thought, kept", [
    (["Thought", ":", " still", " going"], "still going", 4),  # cut in the thought
    (["Thought", ":", " done", "\n", "Action", ":", " get 1"], "done", 4),  # cut in the action
])
async def test_a_constrained_reply_cut_before_its_action_is_completed_by_act(
    tokens: list[str], thought: str, kept: int
) -> None:
    with scripted_server((200, cut_body(tokens), 0), (200, act_body("inventory"), 0)) as (url, bodies):
        policy = OpenAIPolicy(config_for(url, constrain_actions=True, max_thought_chars=0))
        [reply] = await policy.propose(TASK, 1, valid_actions=VALID, seed=40)
        await policy.close()
    propose, act = bodies
    assert propose["structured_outputs"] == {"grammar": prompts.action_grammar(VALID, 0)}
    assert "[^\\n]*" in propose["structured_outputs"]["grammar"]  # unbounded: cheap for the grammar
    assert act["structured_outputs"] == {"choice": list(VALID)} and act["seed"] == 40
    assert act["messages"][-1] == {"role": "assistant", "content": f"Thought: {thought}\nAction: "}
    assert reply.action == "inventory" and reply.thought == thought and reply.constrained
    assert reply.text == prompts.turn(thought, "inventory")
    assert reply.token_ids == [100 + i for i in range(kept)] + [7, 8]
    assert reply.logprobs == [-0.25] * kept + [-0.1, -0.2]
    assert reply.action_token_start == kept and reply.prompt_token_ids == [1, 2, 3]
    assert reply.prompt_tokens == 3 + 9 and reply.cached_tokens == 6


async def test_a_constrained_reply_that_ends_in_an_action_is_kept() -> None:
    with scripted_server((200, chat_body(), 0)) as (url, bodies):
        policy = OpenAIPolicy(config_for(url, constrain_actions=True, max_thought_chars=0))
        [reply] = await policy.propose(TASK, 1, valid_actions=VALID, seed=40)
        await policy.close()
    assert len(bodies) == 1 and reply.action == "inventory"


# -- helpers ----------------------------------------------------------------------------


def test_drop_oldest_exchange() -> None:
    a1, u1 = {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u1"}
    a2, u2 = {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u2"}
    prefill = {"role": "assistant", "content": "Thought: "}
    assert drop_oldest_exchange([*TASK, a1, u1, a2, u2]) == [*TASK, a2, u2]
    assert drop_oldest_exchange([*TASK, a2, u2]) == TASK
    assert drop_oldest_exchange(TASK) is None
    assert drop_oldest_exchange([*TASK, a1, u1, prefill], keep_last=1) == [*TASK, prefill]
    assert drop_oldest_exchange([*TASK, prefill], keep_last=1) is None


def test_action_token_start() -> None:
    assert action_token_start(["Thought", ":", " x", "\n", "Action", ":", " go"]) == 4
    assert action_token_start(["Thought: x", "\nAct", "ion: go"]) == 1
    assert action_token_start(["Thought", ": x"]) == -1
    # a thought that says "action:" itself: the action starts on the line that begins with it
    assert action_token_start(["Thought: blue", "Action", ":K&", "\n", "Action", ": go"]) == 4


# replies of the tiny model under the action grammar, seen in a saturation sweep: the
# one-line thought may say "action:" too, and the action is the line that begins with it
@pytest.mark.parametrize(("text", "expected"), [
    ("Thought: blueAction:K&\nAction: craft 4 stairs using 6 andesite", ("blueAction:K&", "craft 4 stairs using 6 andesite")),
    ("Thought: have wool action:swer45ee'lid\nAction: inventory", ("have wool action:swer45ee'lid", "inventory")),
    ("Thought: get wood\nAction: get 1 oak log\nObservation: Got 1 oak log", ("get wood", "get 1 oak log")),
    ("Thought: one line Action: go north", ("one line", "go north")),
    ("Thought: two\nlines", ("two\nlines", "")),
    ("Action: wait", ("", "wait")),
    ("no format at all", ("no format at all", "")),
])
def test_parse_reply(text: str, expected: tuple[str, str]) -> None:
    assert prompts.parse_reply(text) == expected


def test_parse_prefix_cache_counters() -> None:
    text = (
        "# HELP vllm:prefix_cache_hits_total hits\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m{x}"} 512.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 128.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2000.0\n'
        'vllm:external_prefix_cache_hits_total{engine="0"} 99.0\n'
    )
    assert parse_prefix_cache_counters(text) == (640.0, 2000.0)
    assert parse_prefix_cache_counters("vllm:prefix_cache_hits_total 3\n") is None


def test_build_tiny_model_needs_torch(tmp_path: Any) -> None:
    with pytest.raises(BadInput, match="lacks torch"):
        build_tiny_model(tmp_path / "m", python=sys.executable)


def test_server_fails_fast_without_vllm(tmp_path: Any) -> None:
    server = VLLMServer(tmp_path, served_name="x", python=sys.executable, log_path=tmp_path / "log")
    started_at = time.perf_counter()
    with pytest.raises(Unavailable, match="exited with code 1 .*No module named 'vllm'"):
        server.start()
    assert time.perf_counter() - started_at < 10 and not server.running
