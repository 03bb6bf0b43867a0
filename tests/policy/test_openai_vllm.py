"""OpenAIPolicy against a real vLLM (CPU, tiny random model).

The model's weights are random: its free text is noise, so tests check structure
(ids, logprobs, seeds, constraints, caching, errors), never content.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.support.openai_policy import ODD_ACTIONS, TASK, VALID, config_for, started
from thicket.errors import BadInput
from thicket.policy import prompts
from thicket.policy.base import Messages, Reply
from thicket.policy.openai import OpenAIConfig
from thicket.vllm_server import VLLMServer, prefix_cache_counters


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
        assert reply.text.startswith("Thought: ") and reply.text.endswith("Action: " + reply.action)
        assert prompts.parse_reply(reply.text) == (reply.thought, reply.action)
        assert 0 < reply.action_token_start < len(reply.token_ids)
        assert_sampled(reply)
    completed = [reply for reply in replies if reply.prefill_start >= 0]
    assert completed  # most of the noise runs into the budget
    for reply in completed:  # the sampled thought's exact text (never re-spelled), the prefilled mark, the action
        assert reply.prefill_start == reply.action_token_start and reply.prefill_len > 0
        assert all(lp == 0.0 for lp in reply.logprobs[reply.prefill_start: reply.prefill_start + reply.prefill_len])


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


def filled_to(server: VLLMServer, config: OpenAIConfig, extra: int) -> Messages:
    """TASK, one exchange, then an observation long enough that the rendered prompt holds the
    server's whole context plus `extra` tokens (0: exactly the context, no room for a token)."""
    limit = httpx.get(f"{server.url}/models", timeout=30).json()["data"][0]["max_model_len"]
    root = server.url.removesuffix("/v1")

    def length(words: int) -> int:
        messages = [*TASK, {"role": "assistant", "content": prompts.turn("look", "inventory")},
                    {"role": "user", "content": "Observation: " + "oak " * words}]
        body = {"model": config.model, "messages": messages, "add_generation_prompt": True}
        return len(httpx.post(f"{root}/tokenize", json=body, timeout=30).json()["tokens"])

    low, high = 0, limit  # "oak " is at least one token: `limit` words overflow
    while low < high:  # the fewest words whose prompt reaches limit + extra
        mid = (low + high) // 2
        low, high = (mid + 1, high) if length(mid) < limit + extra else (low, mid)
    assert length(low) == limit + extra, "no filler length renders to exactly that many tokens"
    return [*TASK, {"role": "assistant", "content": prompts.turn("look", "inventory")},
            {"role": "user", "content": "Observation: " + "oak " * low}]


@pytest.mark.vllm
@pytest.mark.parametrize("extra", [0, 7])
async def test_a_prompt_that_fills_or_overflows_the_context_drops_its_oldest_exchange(vllm_server, extra):
    """vLLM answers a prompt of exactly max_model_len tokens with "max_tokens must be at least 1,
    got 0" and a longer one with "maximum context length": both are the context running out,
    and the policy drops the oldest exchange (the make-model --train webshop evaluation died on
    the first before)."""
    config = served(vllm_server)
    messages = filled_to(vllm_server, config, extra)
    async with started(config) as policy:
        replies = await policy.propose(messages, 2, valid_actions=VALID, seed=3, temperature=1.0)
    assert len(replies) == 2
    for reply in replies:
        assert_sampled(reply)
        assert 0 < len(reply.prompt_token_ids or []) < 200  # the system prompt and the task only
