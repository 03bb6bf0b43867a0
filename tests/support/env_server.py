"""Shared by the env server tests: start `thicket serve-env`, walk an env, view its transitions,
open a remote env, and grow an MCTS tree to compare (as rows)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from thicket.envs import SyncEnv, env_names
from thicket.envs.client import ClientConfig, EnvClient
from thicket.envs.process import EnvServerProcess
from thicket.envs.protocol import Observation, Transition
from thicket.envs.remote import RemoteEnv
from thicket.policy.uniform import UniformPolicy
from thicket.search import grow
from thicket.search.expand import Expander
from thicket.search.mcts import MCTSParams
from thicket.search.tree import Node

FAMILIES = env_names()
TASK = 0
FREE_TEXT = ("42", "look")  # actions for envs without a list of valid actions


def started(families: list[str], *args: str, port: int = 0) -> EnvServerProcess:
    server = EnvServerProcess(families, port=port, args=args, startup_timeout_s=120).start()
    asyncio.run(server.wait_ready())
    return server


def view(t: Transition) -> tuple[Any, ...]:
    return t.observation.text, t.observation.valid_actions, round(t.reward, 9), t.done, t.success


@dataclass
class Walk:
    first: Observation
    actions: list[str]
    transitions: list[tuple[Any, ...]]


def walk(env: SyncEnv, rng: random.Random, steps: int) -> Walk:
    """Random valid actions from a reset (stops at the end of the episode)."""
    first = env.reset_sync(TASK)
    out, valid = Walk(first, [], []), first.valid_actions or FREE_TEXT
    for _ in range(steps):
        if not valid:
            break
        action = rng.choice(valid)
        t = env.step_sync(action)
        out.actions.append(action)
        out.transitions.append(view(t))
        if t.done:
            break
        valid = t.observation.valid_actions or FREE_TEXT
    return out


async def remote(server: EnvServerProcess, family: str, **config: Any) -> tuple[EnvClient, RemoteEnv]:
    client = EnvClient(ClientConfig(server.url, **config))
    return client, await client.env(family)


def tree_view(node: Node) -> list[tuple[Any, ...]]:
    rows = [(node.key, node.reply.action if node.reply else None, node.observation, node.reward, node.done,
             node.visits, round(node.value_sum, 9), node.stop)]
    for child in node.children:
        rows += tree_view(child)
    return rows


async def search(env: Any, params: MCTSParams, task: int = 1, policy: UniformPolicy | None = None) -> list[Any]:
    x = await Expander.open(env, task, policy or UniformPolicy(), 3, max_depth=params.max_depth,
                            max_nodes=params.max_nodes)
    await grow(x, params)
    return tree_view(x.tree.root)
