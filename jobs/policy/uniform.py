"""The uniform-random baseline: every turn picks one of the env's valid actions."""

from __future__ import annotations

import asyncio
import functools
import math

from thicket.errors import BadInput
from thicket.policy import prompts
from thicket.policy.base import Messages, Policy, Reply
from thicket.policy.inflight import AdjustableLimit


def mix(seed: int) -> int:
    """splitmix64: a cheap, well-spread hash of the seed (sample i uses seed + i)."""
    z = (seed + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=1024)
def default_turn(action: str) -> tuple[str, str]:
    """The thought and the text of a turn taking `action` with no thought given."""
    thought = f"I will try {action}."
    return thought, prompts.turn(thought, action)


class UniformPolicy(Policy):
    name = "uniform"

    def __init__(self, latency_s: float = 0.0, concurrency: int = 64) -> None:
        self.latency_s = latency_s  # simulated server latency, for benchmarks
        self._slots = AdjustableLimit(concurrency)  # requests "in flight" at most

    async def _wait(self) -> None:
        async with self.slots:
            with self.meter.request():
                await asyncio.sleep(self.latency_s)

    @staticmethod
    def _choose(valid_actions: tuple[str, ...] | None, seed: int) -> tuple[str, float]:
        if not valid_actions:
            raise BadInput("policy.kind uniform needs an env that lists its valid actions")
        return valid_actions[mix(seed) % len(valid_actions)], -math.log(len(valid_actions))

    def _reply(self, thought: str, valid_actions: tuple[str, ...] | None, seed: int) -> Reply:
        action, logprob = self._choose(valid_actions, seed)
        thought, text = (thought, prompts.turn(thought, action)) if thought else default_turn(action)
        return Reply(
            text=text,
            thought=thought,
            action=action,
            logprobs=[logprob],
            action_token_start=0,
            constrained=True,
            temperature=1.0,
            seed=seed,
        )

    async def propose(
        self,
        messages: Messages,
        n: int,
        *,
        valid_actions: tuple[str, ...] | None,
        seed: int,
        temperature: float | None = None,
    ) -> list[Reply]:
        if self.latency_s > 0:
            await self._wait()
        return [self._reply("", valid_actions, seed + i) for i in range(n)]

    async def act(
        self,
        messages: Messages,
        thought: Reply,
        *,
        valid_actions: tuple[str, ...] | None,
        seed: int,
        temperature: float | None = None,
    ) -> Reply:
        if self.latency_s > 0:
            await self._wait()
        return self._reply(thought.thought, valid_actions, seed)
