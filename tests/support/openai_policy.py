"""Shared by the OpenAIPolicy tests: a TextCraft turn with its valid actions (and odd ones), a
config for a server at a URL, a started policy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from thicket.policy import prompts
from thicket.policy.base import Messages
from thicket.policy.openai import OpenAIConfig, OpenAIPolicy

VALID = ("get 1 oak log", "craft 4 oak planks using 1 oak log", "inventory", "get 2 white wool")
TASK: Messages = [
    prompts.system_message("You are playing TextCraft. Craft the goal item."),
    prompts.observation_message("Goal: craft stick. Inventory: [oak log] (1)", VALID, True),
]
ODD_ACTIONS = ("put 1 oak log in box #2 & close it", "look at a.b (c)?", "say ~x+y* [z] {w} | $v ^u \\t")


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
