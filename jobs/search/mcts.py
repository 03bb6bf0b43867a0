"""MCTS with Agent-R's semantics.

Each iteration walks down from the root. A node without children is expanded
(N_GEN turns, duplicate reply texts dropped); a child the env ended, or that
reached the depth limit, is terminal and its score (its path's return) is backed
up at once. As in Agent-R's backpropagation, a node whose children are all
terminal becomes terminal at once (EXHAUSTED), and so on up the tree, so no later
walk is spent finding that out. The walk then selects among non-terminal children
by UCT (unvisited first, random tie-break) until a terminal node. There is no
random rollout: values come from terminal nodes only, and a negative env score
counts as 0 (a disaster). A leaf the env failed on (ERROR) is terminal but carries
no evidence: it is never backed up (visits stay 0).

Depth: thicket's max_depth counts actions (a path has at most max_depth); Agent-R
ends a path when its depth exceeds MAX_DEPTH, so its MAX_DEPTH = N is max_depth N + 1.
"""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import Field

from thicket.search.expand import Expander, close_open_leaves
from thicket.search.params import SearchParams
from thicket.search.tree import Node, StopReason, backpropagate, leaf_score


class MCTSParams(SearchParams):
    algorithm: Literal["mcts"] = "mcts"
    iterations: int = Field(30, ge=1, description="walks from the root (ITERA)")
    expansions: int = Field(4, ge=1, le=64, description="turns sampled per expansion (N_GEN)")
    uct_c: float = Field(0.25, ge=0.0, description="UCT exploration constant")


def uct_score(child: Node, parent_visits: int, exploration: float) -> float:
    if child.visits == 0:
        return math.inf
    exploit = child.value_sum / child.visits
    return exploit + exploration * math.sqrt(math.log(max(parent_visits, 1)) / child.visits)


def select(node: Node, exploration: float, rng: random.Random) -> Node | None:
    """The open child with the best UCT score (random among ties), or None."""
    candidates = [child for child in node.children if not child.terminal]
    if not candidates:
        return None
    scores = [uct_score(child, node.visits, exploration) for child in candidates]
    best = max(scores)
    return rng.choice([child for child, s in zip(candidates, scores) if s == best])


def close_exhausted(node: Node) -> None:
    """Close `node` and then each ancestor whose children are all terminal (Agent-R's
    update_terminal, run along the path a backup takes)."""
    walker: Node | None = node
    while walker is not None and not walker.terminal and walker.children and all(c.terminal for c in walker.children):
        walker.close(StopReason.EXHAUSTED)
        walker = walker.parent


async def run(expander: Expander, params: MCTSParams) -> None:
    root = expander.tree.root
    rng = random.Random(expander.seed_for(root, "mcts"))
    for _ in range(params.iterations):
        if root.terminal or expander.over_budget():
            break
        await walk(expander, params, rng)
    close_open_leaves(expander.tree, StopReason.BUDGET)


async def walk(expander: Expander, params: MCTSParams, rng: random.Random) -> None:
    node = expander.tree.root
    while not node.terminal:
        if not node.children:
            children = await expander.expand(node, params.expansions, temperature=params.temperature)
            if not children:
                if not node.terminal:  # the policy produced nothing usable
                    node.close(StopReason.ERROR)
                if node.parent is not None:
                    close_exhausted(node.parent)
                return
            for child in children:
                if child.terminal and child.stop.evaluated:
                    backpropagate(child, leaf_score(child))
            close_exhausted(node)
            if node.terminal:
                return
        nxt = select(node, params.uct_c, rng)
        if nxt is None:  # every child terminal
            close_exhausted(node)
            return
        node = nxt
