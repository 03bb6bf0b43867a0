"""MCTS that spends one LLM call per step of a walk: progressive widening (`mcts_pw`).

Agent-R's MCTS (mcts.py) samples N_GEN turns at every node a walk meets, so a walk
down a fresh path costs N_GEN calls a level: at 64 calls a task and depth 12 it makes
one or two walks. Here a node visited n times may have up to
ceil(widen_c * n ** widen_alpha) children (progressive widening, Couëtoux et al. 2011);
a walk that reaches a node allowed another child samples one turn there and goes on
from it. From a fresh node a walk is therefore one sampled trajectory down to a
terminal node (a rollout kept in the tree, as LATS keeps its simulations), whose
return is backed up along the walk. Later walks follow UCT (unvisited first, random
tie-break) through what earlier walks grew and widen where they return often.

A node whose children are all terminal widens on its next visit. Once `close_after`
samples there have repeated a sibling's reply (duplicates are dropped, as in mcts.py),
the node is closed (EXHAUSTED). Its parent is not closed with it (as Agent-R's is): a
parent left with terminal children only widens on its next visit in turn, and is closed
by its own repeats. A walk that ends on a repeated sample backs nothing up. Values are sum / visits
over backed-up terminal returns, as in mcts.py; an ERROR leaf is never backed up.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Literal

from pydantic import Field

from thicket.search.expand import Expander, close_open_leaves
from thicket.search.mcts import close_exhausted, select
from thicket.search.params import SearchParams
from thicket.search.tree import Node, StopReason, backpropagate, leaf_score


class MCTSPWParams(SearchParams):
    algorithm: Literal["mcts_pw"] = "mcts_pw"
    iterations: int = Field(64, ge=1, description="walks from the root, each one down to a terminal node")
    widen_c: float = Field(1.0, gt=0.0, description="children allowed at n visits: ceil(widen_c * n ** widen_alpha)")
    widen_alpha: float = Field(0.5, ge=0.0, le=1.0, description="the widening exponent")
    uct_c: float = Field(0.25, ge=0.0, description="UCT exploration constant")
    close_after: int = Field(3, ge=1, description="repeated samples at a node whose children are all terminal "
                                                  "before it is closed")


def allowed_children(node: Node, params: MCTSPWParams) -> int:
    return max(1, math.ceil(params.widen_c * node.visits ** params.widen_alpha))


async def run(expander: Expander, params: MCTSPWParams) -> None:
    root = expander.tree.root
    rng = random.Random(expander.seed_for(root, "mcts_pw"))
    repeats: Counter[Node] = Counter()  # repeated samples at nodes whose children were all terminal
    for _ in range(params.iterations):
        if root.terminal or expander.over_budget():
            break
        await walk(expander, params, rng, repeats)
    close_open_leaves(expander.tree, StopReason.BUDGET)


async def walk(expander: Expander, params: MCTSPWParams, rng: random.Random, repeats: Counter[Node]) -> None:
    node = expander.tree.root
    while not node.terminal:
        stuck = all(child.terminal for child in node.children)  # no child to walk on to
        if stuck or len(node.children) < allowed_children(node, params):
            if expander.over_budget():
                return  # an unfinished walk: the search closes what is open
            widened = await widen(expander, node, params, repeats)
            if widened is not None:
                if widened.terminal:
                    if widened.stop.evaluated:
                        backpropagate(widened, leaf_score(widened))
                    return
                node = widened
                continue
            if node.terminal or stuck:
                return
        nxt = select(node, params.uct_c, rng)
        if nxt is None:
            close_exhausted(node)
            return
        node = nxt


async def widen(expander: Expander, node: Node, params: MCTSPWParams, repeats: Counter[Node]) -> Node | None:
    """One new child of `node` (one sampled turn, stepped), or None: the sample repeated a
    sibling (a node whose children are all terminal is closed at its `close_after`-th
    repeat, not its ancestors) or yielded nothing (a childless node is then an ERROR leaf)."""
    children = await expander.expand(node, 1, temperature=params.temperature, salt=node.llm_calls)
    if children:
        return children[0]
    if node.terminal:
        return None
    if not node.children:
        node.close(StopReason.ERROR)  # its parent widens on its next visit, if it has no open child
    elif all(child.terminal for child in node.children):
        repeats[node] += 1
        if repeats[node] >= params.close_after:
            node.close(StopReason.EXHAUSTED)
    return None
