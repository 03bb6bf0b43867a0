"""OpenAIPolicy against scripted HTTP servers: servers that fail (retries, timeouts, one-line
errors), the fields of each request, prompts rendered once through /tokenize, and constrained
replies cut before their action."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.http_stub import QuietHandler, serving
from tests.support.openai_policy import TASK, VALID, config_for, started
from thicket.errors import BadInput, Unavailable
from thicket.policy import prompts
from thicket.policy.base import Reply
from thicket.policy.openai import OpenAIPolicy
from thicket.transport import free_port


# -- servers that fail ------------------------------------------------------------------


async def test_unreachable_server_is_unavailable_quickly() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    started_at = time.perf_counter()
    policy = OpenAIPolicy(config_for(url, retry_deadline_s=1.0))
    with pytest.raises(Unavailable, match="cannot reach the policy server at"):
        await policy.propose(TASK, 1, valid_actions=VALID, seed=5)  # mid-run: an outage
    await policy.close()
    assert time.perf_counter() - started_at < 30  # its 1 s deadline, not the default 300 s (a busy machine: margin)


async def test_nothing_listening_at_start_up_is_a_wrong_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    started_at = time.perf_counter()
    with pytest.raises(BadInput, match=r"^policy.url: nothing answers at .* \(connection refused, for 0.5s\)"):
        async with started(config_for(url, startup_connect_s=0.5)):
            pass
    assert 0.5 <= time.perf_counter() - started_at < 30  # the 0.5 s window, not the default 60 s


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
        await policy.act(TASK, Reply(text="Thought: hm", thought="hm", action=""), valid_actions=VALID, seed=9)
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
            await policy.act(TASK, Reply(text="Thought: hm", thought="hm", action=""), valid_actions=VALID, seed=9)
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
