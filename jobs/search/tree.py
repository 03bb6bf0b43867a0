"""The search tree: one node per environment state reached by an agent turn."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from thicket.envs.protocol import Observation, RewardSemantics, Transition
from thicket.policy.base import Reply


class StopReason(StrEnum):
    """Where a node stands. OPEN: a leaf that could still be expanded; EXPANDED: it
    has children; the others say why a node is terminal."""

    OPEN = "open"
    EXPANDED = "expanded"
    DONE = "done"  # the env ended the episode
    DEPTH_LIMIT = "depth_limit"
    BUDGET = "budget"  # the search ran out of its node / run budget
    TIMEOUT = "timeout"
    ERROR = "error"  # the policy or env failed here; never a silent zero-reward success
    EXHAUSTED = "exhausted"  # every child is terminal (MCTS closes such nodes)
    PRUNED = "pruned"  # a beam search kept other nodes of its level (ToT's beam)
    DISASTER = "disaster"  # the env gave a negative score (scored 0)

    @property
    def evaluated(self) -> bool:
        """Whether a leaf that stopped so has a known score: the episode ended or reached the
        depth limit. Leaves cut by the budget, a timeout or an error (the env's or the
        policy's) carry no evidence about their path: no search backs them up and no
        dataset pairs them. The one rule for every search and dataset."""
        return self in EVALUATED


EVALUATED = frozenset({StopReason.DONE, StopReason.DEPTH_LIMIT, StopReason.DISASTER})


@dataclass(eq=False)
class Node:
    parent: Node | None
    index: int  # position among its siblings
    depth: int
    observation: Observation
    reply: Reply | None = None  # the turn that led here (None at the root)
    reward: float = 0.0
    path_return: float = 0.0  # the return of the root-to-here path, by the env's RewardSemantics
    done: bool = False
    success: bool = False
    label: int = -1  # dense search: the child label that generated this node
    terminal: bool = False
    stop: StopReason = StopReason.OPEN
    visits: int = 0
    value_sum: float = 0.0
    value_mean: float | None = None  # set by searches that average (dense, tot); else sum/visits
    env_ms: float = 0.0
    # LLM calls made from this node's prompt (one per sampled reply: its children and the
    # duplicates the search dropped) and the tokens they generated
    llm_calls: int = 0
    llm_tokens: int = 0
    resumed_llm_calls: int = 0  # of llm_calls: replies a checkpoint brought back (not sampled again)
    resumed: bool = False  # this node's reply came from a checkpoint
    children: list[Node] = field(default_factory=list)
    snapshot: Any = None  # env state after this node's step, where the env can snapshot
    id: int = -1  # assigned in canonical (breadth-first) order when the tree is frozen
    _key: tuple[int, ...] | None = field(default=None, init=False, repr=False)  # see key

    @property
    def key(self) -> tuple[int, ...]:
        """Path of sibling indices from the root: stable whatever the scheduling order. Kept
        once known: a node's parent and index never change."""
        if self._key is None:
            self._key = () if self.parent is None else (*self.parent.key, self.index)
        return self._key

    @property
    def value(self) -> float:
        if self.value_mean is not None:
            return self.value_mean
        return self.value_sum / self.visits if self.visits else 0.0

    def path(self) -> list[Node]:
        """Root-to-self list of nodes."""
        out: list[Node] = []
        node: Node | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def actions(self) -> list[str]:
        return [n.reply.action for n in self.path()[1:] if n.reply is not None]

    def close(self, stop: StopReason) -> None:
        self.terminal = True
        self.stop = stop


@dataclass(eq=False)
class Tree:
    task: int
    root: Node
    seed: int
    size: int = 1  # nodes so far
    reward_semantics: RewardSemantics = RewardSemantics.INCREMENT
    data_source: str | None = None  # the env's (None: its family's own tasks)
    deterministic: bool = False  # the env's transitions are (Env.deterministic)

    @classmethod
    def start(cls, task: int, observation: Observation, seed: int,
              reward_semantics: RewardSemantics = RewardSemantics.INCREMENT, data_source: str | None = None,
              deterministic: bool = False) -> Tree:
        root = Node(parent=None, index=0, depth=0, observation=observation)
        return cls(task=task, root=root, seed=seed, reward_semantics=reward_semantics, data_source=data_source,
                   deterministic=deterministic)

    def add_child(self, parent: Node, reply: Reply, transition: Transition, env_ms: float = 0.0) -> Node:
        child = Node(
            parent=parent,
            index=len(parent.children),
            depth=parent.depth + 1,
            observation=transition.observation,
            reply=reply,
            reward=transition.reward,
            path_return=self.reward_semantics.path_return(parent.path_return, transition.reward),
            done=transition.done,
            success=transition.success,
            env_ms=env_ms,
        )
        parent.children.append(child)
        if parent.stop is StopReason.OPEN:
            parent.stop = StopReason.EXPANDED
        self.size += 1
        return child

    def nodes(self) -> Iterator[Node]:
        """Breadth-first, children in index order: the canonical order."""
        frontier = [self.root]
        while frontier:
            yield from frontier
            frontier = [c for n in frontier for c in n.children]

    def freeze(self) -> list[Node]:
        """Assign canonical ids and return the nodes in that order."""
        ordered = list(self.nodes())
        for i, node in enumerate(ordered):
            node.id = i
        return ordered

    def leaves(self) -> list[Node]:
        return [n for n in self.nodes() if not n.children and n.parent is not None]

    @property
    def solved(self) -> bool:
        return any(n.success for n in self.nodes())


def backpropagate(node: Node, reward: float) -> None:
    """MCTS backup: every node from `node` to the root gets a visit and the reward."""
    walker: Node | None = node
    while walker is not None:
        walker.visits += 1
        walker.value_sum += reward
        walker = walker.parent


def average_values(root: Node) -> None:
    """Value of a node = mean of its children's values; a leaf's value = its reward.
    Visits count the leaves below. Iterative post-order so deep trees don't recurse."""
    order: list[Node] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children)
    for node in reversed(order):
        refresh_value(node)


def leaf_score(node: Node) -> float:
    """A terminal node's value: its path's return, with disasters scored 0."""
    return max(node.path_return, 0.0)


def refresh_value(node: Node) -> None:
    """Mean over evaluated children (visits > 0); an evaluated leaf scores its path's return.
    Unfinished leaves (open, cut by budget, timeout or an error) carry no evidence: visits 0."""
    if not node.children:
        evaluated = node.stop.evaluated
        node.visits = 1 if evaluated else 0
        node.value_mean = leaf_score(node) if evaluated else 0.0
        return
    visits, values = 0, []
    for child in node.children:
        if child.visits > 0:
            visits += child.visits
            values.append(child.value)
    node.visits = visits
    node.value_mean = sum(values) / len(values) if values else 0.0


def refresh_path(leaf: Node) -> None:
    """Re-average `leaf` and its ancestors after a run ended at `leaf`."""
    node: Node | None = leaf
    while node is not None:
        refresh_value(node)
        node = node.parent
