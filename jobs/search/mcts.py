"""MCTS with Agent-R's semantics.

Each iteration walks down from the root. A node without children is expanded
(N_GEN turns, duplicate reply texts dropped); a child the env ended, or that
reached the depth limit, is terminal and its score is backed up at once. The
walk then selects among non-terminal children by UCT (unvisited first, random
tie-break) and goes on until it meets a node whose children are all terminal;
that node becomes terminal too. There is no random rollout: values come from
terminal nodes only, and a negative env score counts as 0 (a disaster).
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


def uct_score(child: Node, parent_visits: int, c: float) -> float:
    if child.visits == 0:
        return math.inf
    exploit = child.value_sum / child.visits
    return exploit + c * math.sqrt(math.log(max(parent_visits, 1)) / child.visits)


def select(node: Node, c: float, rng: random.Random) -> Node | None:
    """The open child with the best UCT score (random among ties), or None."""
    candidates = [child for child in node.children if not child.terminal]
    if not candidates:
        return None
    scores = [uct_score(child, node.visits, c) for child in candidates]
    best = max(scores)
    return rng.choice([child for child, s in zip(candidates, scores) if s == best])


async def run(x: Expander, p: MCTSParams) -> None:
    root = x.tree.root
    rng = random.Random(x.seed_for(root, "mcts"))
    for _ in range(p.iterations):
        if root.terminal or x.over_budget():
            break
        await walk(x, p, rng)
    close_open_leaves(x.tree, StopReason.BUDGET)


async def walk(x: Expander, p: MCTSParams, rng: random.Random) -> None:
    node = x.tree.root
    while not node.terminal:
        if not node.children:
            children = await x.expand(node, p.expansions, temperature=p.temperature)
            if not children:
                if not node.terminal:  # the policy produced nothing usable
                    node.close(StopReason.ERROR)
                return
            for child in children:
                if child.terminal:
                    backpropagate(child, leaf_score(child))
        nxt = select(node, p.uct_c, rng)
        if nxt is None:
            node.close(StopReason.EXHAUSTED)
            return
        node = nxt
