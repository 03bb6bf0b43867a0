"""Moves one env instance between the states of a tree's nodes.

Where the env can snapshot, a node keeps its state and moving there is a restore;
otherwise the cursor resets the env to the task and replays the node's actions.
"""

from __future__ import annotations

import asyncio
import time

import thicket.metrics as metrics
from thicket.envs.protocol import Env, Observation, Transition
from thicket.search.guard import ContentGuard
from thicket.search.tree import Node


class EnvCursor:
    def __init__(self, env: Env, task: int, guard: ContentGuard | None = None) -> None:
        self.env = env
        self.task = task
        self.guard = guard or ContentGuard()  # what the tree sees of the env is made safe here
        self.at: Node | None = None  # the node whose state the env is in now
        self.lock = asyncio.Lock()  # one move-and-step at a time per env instance
        self.replayed_steps = 0

    async def reset(self) -> Observation:
        self.at = None
        return self.guard.observation(await self.env.reset(self.task))

    async def remember(self, node: Node) -> None:
        """Record that the env is now in `node`'s state (snapshotting it if it can)."""
        if self.env.can_snapshot:
            node.snapshot = await self.env.snapshot()
        self.at = node

    async def step_from(self, node: Node, action: str) -> Transition:
        """Put the env in `node`'s state, then step `action`. Caller holds `lock`."""
        if self.at is not node:
            await self._goto(node)
        self.at = None  # the env has left `node`; the caller remembers the new node
        return self.guard.transition(await self._step(action))

    async def _goto(self, node: Node) -> None:
        if self.env.can_snapshot and node.snapshot is not None:
            await self.env.restore(node.snapshot)
        else:
            await self.env.reset(self.task)
            for action in node.actions():
                await self._step(action)
                self.replayed_steps += 1
        self.at = node

    async def _step(self, action: str) -> Transition:
        started = time.perf_counter()  # as ENV_STEP_SECONDS.time() does, without its context manager
        try:
            return await self.env.step(action)
        finally:
            metrics.ENV_STEP_SECONDS.observe(time.perf_counter() - started)
