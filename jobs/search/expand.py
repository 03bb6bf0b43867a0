"""Growing a tree: ask the policy for turns at a node, step the env for each."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from thicket.envs.protocol import ActionFailed, Env, Observation, Transition
from thicket.policy import prompts
from thicket.policy.base import Messages, Policy, Reply
from thicket.search.cursor import EnvCursor
from thicket.search.guard import ContentGuard, Fault
from thicket.search.tree import Node, StopReason, Tree

SEED_SPACING = 1024  # a propose of n samples uses seed .. seed+n-1; proposes never overlap


def propose_seed(*parts: object) -> int:
    """A stable seed for one propose, spaced so sibling samples never share seeds."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") % (2**31 // SEED_SPACING)) * SEED_SPACING


@dataclass
class Expander:
    """Everything a search algorithm needs for one tree."""

    tree: Tree
    cursor: EnvCursor
    policy: Policy
    instructions: str
    max_depth: int
    max_nodes: int
    show_valid_actions: bool = False
    dedupe: bool = True
    max_llm_calls: int | None = None
    llm_requests: int = 0  # proposes (each of n sampled replies)
    llm_calls: int = 0  # sampled replies, each one LLM request
    _messages: dict[Node, Messages] = field(default_factory=dict)

    @classmethod
    async def open(cls, env: Env, task: int, policy: Policy, seed: int, *,
                   guard: ContentGuard | None = None, **settings) -> Expander:
        cursor = EnvCursor(env, task, guard)
        observation = await cursor.reset()
        tree = Tree.start(task, observation, seed)
        await cursor.remember(tree.root)
        return cls(tree=tree, cursor=cursor, policy=policy, instructions=env.instructions, **settings)

    def seed_for(self, node: Node, *salt: object) -> int:
        return propose_seed(self.tree.seed, self.tree.task, node.key, *salt)

    def messages(self, node: Node) -> Messages:
        """The chat history at `node`: its parent's plus two turns (append-only)."""
        cached = self._messages.get(node)
        if cached is not None:
            return cached
        observation = prompts.observation_message(
            node.observation.text, node.observation.valid_actions, self.show_valid_actions
        )
        if node.parent is None:
            messages = [prompts.system_message(self.instructions), observation]
        else:
            assert node.reply is not None
            messages = prompts.extend(self.messages(node.parent), node.reply.text, observation)
        self._messages[node] = messages
        return messages

    def calls_left(self) -> int | None:
        return None if self.max_llm_calls is None else max(self.max_llm_calls - self.llm_calls, 0)

    def over_budget(self) -> bool:
        return self.tree.size >= self.max_nodes or self.calls_left() == 0

    async def propose(self, node: Node, n: int, *, temperature: float | None = None,
                      salt: tuple[object, ...] = ("",)) -> list[Reply]:
        """n replies sampled at `node` (fewer where the LLM-call budget is nearly spent), counted.
        The calls are counted before they are made, so proposes in flight together keep to the budget."""
        left = self.calls_left()
        asked = n if left is None else min(n, left)
        self.llm_calls += asked
        replies = await self.policy.propose(
            self.messages(node),
            asked,
            valid_actions=node.observation.valid_actions,
            seed=self.seed_for(node, *salt),
            temperature=temperature,
        )
        self.llm_requests += 1
        self.llm_calls += len(replies) - asked
        node.llm_calls += len(replies)
        node.llm_tokens += sum(len(reply.token_ids) for reply in replies)
        return replies

    async def expand(self, node: Node, n: int, *, temperature: float | None = None, salt: object = "") -> list[Node]:
        """Sample n turns at `node` and step each; returns the new children."""
        if self.over_budget():
            node.close(StopReason.BUDGET)
            return []
        return await self.step_all(node, await self.propose(node, n, temperature=temperature, salt=(salt,)))

    async def step_all(self, node: Node, replies: list[Reply]) -> list[Node]:
        seen = {c.reply.text for c in node.children if c.reply is not None}
        children = []
        for reply in replies:
            if self.dedupe and reply.text in seen:
                continue
            seen.add(reply.text)
            if self.over_budget():
                break
            children.append(await self.step(node, reply))
        return children

    async def step(self, node: Node, reply: Reply, label: int = -1) -> Node:
        self.cursor.guard.reply(reply, node.observation.valid_actions)
        async with self.cursor.lock:
            started = time.perf_counter()
            try:
                transition = await self.cursor.step_from(node, reply.action)
            except ActionFailed as err:
                return self._error_leaf(node, reply, label, str(err), started)
            env_ms = (time.perf_counter() - started) * 1000
            child = self.tree.add_child(node, reply, transition, env_ms)
            child.label = label
            await self.cursor.remember(child)
        classify(child, self.max_depth)
        return child

    def _error_leaf(self, node: Node, reply: Reply, label: int, error: str, started: float) -> Node:
        """The action the env failed on, kept as a leaf whose stop reason says so."""
        self.cursor.guard.faults[Fault.ACTION_FAILED] += 1
        observation = Observation(f"[the environment failed on this action: {error[:500]}]")
        env_ms = (time.perf_counter() - started) * 1000
        child = self.tree.add_child(node, reply, Transition(observation, 0.0, True), env_ms)
        child.label = label
        child.close(StopReason.ERROR)
        return child


def classify(child: Node, max_depth: int) -> None:
    """Close a new node when the episode ended or the depth limit is reached."""
    if child.done:
        child.close(StopReason.DISASTER if child.reward < 0 else StopReason.DONE)
    elif child.depth >= max_depth:
        child.close(StopReason.DEPTH_LIMIT)


def close_open_leaves(tree: Tree, stop: StopReason) -> None:
    """At the end of a search, say why each unfinished leaf stopped."""
    for node in tree.nodes():
        if not node.children and not node.terminal:
            node.close(stop)
