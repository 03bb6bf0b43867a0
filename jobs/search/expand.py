"""Growing a tree: ask the policy for turns at a node, step the env for each."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

from thicket.envs.protocol import ActionFailed, Env, Observation, RewardSemantics, Transition
from thicket.policy import prompts
from thicket.policy.base import Messages, Policy, Reply
from thicket.search.cursor import EnvCursor
from thicket.search.guard import ContentGuard, Fault
from thicket.search.journal import ReplyJournal, propose_key
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
    unstepped: int = 0  # replies asked for or in hand, not stepped yet: each will be a node
    journal: ReplyJournal | None = None  # replies paid for before (a resumed tree) and kept for later
    _messages: dict[Node, Messages] = field(default_factory=dict)
    _from_journal: dict[int, Reply] = field(default_factory=dict)  # id -> reply, until it is stepped

    @classmethod
    async def open(cls, env: Env, task: int, policy: Policy, seed: int, *,
                   guard: ContentGuard | None = None, **settings) -> Expander:
        cursor = EnvCursor(env, task, guard)
        observation = await cursor.reset()
        tree = Tree.start(task, observation, seed, env.reward_semantics, env.data_source, env.deterministic)
        await cursor.remember(tree.root)
        return cls(tree=tree, cursor=cursor, policy=policy, instructions=env.instructions, **settings)

    @property
    def resumed_calls(self) -> int:
        """Of llm_calls: those served from the journal, no LLM asked."""
        return sum(node.resumed_llm_calls for node in self.tree.nodes())

    @property
    def resumed_nodes(self) -> int:
        """Nodes whose reply came from the journal."""
        return sum(node.resumed for node in self.tree.nodes())

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

    def affordable(self) -> int:
        """Replies the budgets still pay for: LLM calls left, and nodes left once every reply
        asked for or in hand is stepped (each becomes a node)."""
        nodes = max(self.max_nodes - self.tree.size - self.unstepped, 0)
        calls = self.calls_left()
        return nodes if calls is None else min(nodes, calls)

    def over_budget(self) -> bool:
        return self.affordable() == 0

    async def propose(self, node: Node, n: int, *, temperature: float | None = None,
                      salt: tuple[object, ...] = ("",)) -> list[Reply]:
        """n replies sampled at `node` (fewer where a budget is nearly spent), counted. The calls
        and the nodes they will make are counted before the calls are made, so proposes in
        flight together keep to the budgets, and every reply that comes back can be stepped:
        the caller steps each (step_all, step), none is dropped for the budget."""
        asked = min(n, self.affordable())
        if asked == 0:
            return []
        self.llm_calls += asked
        self.unstepped += asked
        try:
            replies = await self._sample(node, asked, self.seed_for(node, *salt), temperature)
        except BaseException:
            self.unstepped -= asked
            raise
        self.llm_requests += 1
        self.llm_calls += len(replies) - asked
        self.unstepped += len(replies) - asked
        node.llm_calls += len(replies)
        node.llm_tokens += sum(len(reply.token_ids) for reply in replies)
        return replies

    async def _sample(self, node: Node, n: int, seed: int, temperature: float | None) -> list[Reply]:
        """The policy's n replies, or those the journal kept for this very propose."""
        messages, valid = self.messages(node), node.observation.valid_actions
        if self.journal is None:
            return await self.policy.propose(messages, n, valid_actions=valid, seed=seed, temperature=temperature)
        key = propose_key(messages, n, valid_actions=valid, seed=seed, temperature=temperature)
        replies = self.journal.take(key)
        if replies is not None:
            node.resumed_llm_calls += len(replies)
            self._from_journal.update((id(reply), reply) for reply in replies)
            await asyncio.sleep(0)  # as a policy call would: proposes gathered together all ask before any steps
            return replies
        replies = await self.policy.propose(messages, n, valid_actions=valid, seed=seed, temperature=temperature)
        await self.journal.record(key, replies)
        return replies

    async def expand(self, node: Node, n: int, *, temperature: float | None = None, salt: object = "") -> list[Node]:
        """Sample n turns at `node` and step each; returns the new children."""
        if self.over_budget():
            node.close(StopReason.BUDGET)
            return []
        return await self.step_all(node, await self.propose(node, n, temperature=temperature, salt=(salt,)))

    async def step_all(self, node: Node, replies: list[Reply]) -> list[Node]:
        """Step every reply (a reply whose text repeats a sibling's is dropped where dedupe is on,
        as Agent-R drops duplicate samples: it was paid for, and counted in node.llm_calls)."""
        seen = {c.reply.text for c in node.children if c.reply is not None}
        children = []
        for reply in replies:
            if self.dedupe and reply.text in seen:
                self.unstepped -= 1
                self._from_journal.pop(id(reply), None)
                continue
            seen.add(reply.text)
            children.append(await self.step(node, reply))
        return children

    async def step(self, node: Node, reply: Reply, label: int = -1) -> Node:
        """Step `reply` from `node`'s state: a new child (an error leaf where the env failed)."""
        self.unstepped -= 1
        resumed = self._from_journal.pop(id(reply), None) is not None
        self.cursor.guard.reply(reply, node.observation.valid_actions)
        async with self.cursor.lock:
            started = time.perf_counter()
            try:
                transition = await self.cursor.step_from(node, reply.action)
            except ActionFailed as err:
                child = self._error_leaf(node, reply, label, str(err), started)
                child.resumed = resumed
                return child
            env_ms = (time.perf_counter() - started) * 1000
            child = self.tree.add_child(node, reply, transition, env_ms)
            child.label = label
            await self.cursor.remember(child)
        child.resumed = resumed
        classify(child, self.max_depth)
        return child

    def _error_leaf(self, node: Node, reply: Reply, label: int, error: str, started: float) -> Node:
        """The action the env failed on, kept as a leaf whose stop reason says so. It earned
        nothing: its path's return is its parent's (a running score stays where it was)."""
        self.cursor.guard.faults[Fault.ACTION_FAILED] += 1
        observation = Observation(f"[the environment failed on this action: {error[:500]}]")
        env_ms = (time.perf_counter() - started) * 1000
        unchanged = node.reward if self.tree.reward_semantics is RewardSemantics.RUNNING else 0.0
        child = self.tree.add_child(node, reply, Transition(observation, unchanged, True), env_ms)
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
