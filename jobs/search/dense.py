"""Dense trees for preference learning (DensePolicy).

Every node has up to `width` children, one per label: label 0 is greedy (T=0),
the others sample at `temperatures` in rotation. The first run follows label 0
from the root to the end. Then, until `target_pairs` contrast pairs exist or
`run_budget` runs are spent, the search picks the node to extend by a score
mixing the largest value contrast around it, its remaining depth and an
exploration bonus, gives it an unused label, and follows random labels from
there to the end. A run that only walks existing nodes is already decided and
not counted. Values are 0/1 at leaves and the mean of the children above.
"""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import Field

from thicket.search.expand import Expander, close_open_leaves
from thicket.search.params import SearchParams
from thicket.search.tree import Node, StopReason, refresh_path


class DenseParams(SearchParams):
    algorithm: Literal["dense"] = "dense"
    width: int = Field(3, ge=2, le=16, description="children per node (DensePolicy's base)")
    temperatures: list[float] = Field([1.0, 0.5, 0.7], min_length=1, description="labels 1.. in rotation")
    run_budget: int = Field(1000, ge=1, description="runs (root-to-leaf walks that add nodes) at most")
    target_pairs: int = Field(16, ge=1, description="stop once this many contrast pairs exist")
    beta: float = Field(0.5, gt=0.0, le=1.0, description="value gap that makes a sibling pair")
    min_visits: int = Field(1, ge=1, description="evaluated leaves needed under each side of a pair")
    contrast_weight: float = Field(1.0, ge=0.0)
    depth_weight: float = Field(0.5, ge=0.0)
    explore_c: float = Field(0.5, ge=0.0)


def label_temperature(label: int, params: DenseParams) -> float:
    return 0.0 if label == 0 else params.temperatures[(label - 1) % len(params.temperatures)]


def child_with_label(node: Node, label: int) -> Node | None:
    return next((c for c in node.children if c.label == label), None)


def free_labels(node: Node, params: DenseParams) -> list[int]:
    used = {c.label for c in node.children}
    return [label for label in range(params.width) if label not in used]


def contrast_pairs(root: Node, params: DenseParams) -> int:
    pairs, stack = 0, [root]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        seen = [c for c in node.children if c.visits >= params.min_visits]
        pairs += sum(
            1 for i, a in enumerate(seen) for b in seen[i + 1 :] if abs(a.value - b.value) >= params.beta
        )
    return pairs


def spread(nodes: list[Node]) -> float:
    values = [n.value for n in nodes if n.visits > 0]
    return max(values) - min(values) if len(values) >= 2 else 0.0


def extension_score(node: Node, runs: int, params: DenseParams) -> float:
    siblings = node.parent.children if node.parent is not None else [node]
    contrast = max(spread(node.children), spread(siblings))
    remaining = (params.max_depth - node.depth) / params.max_depth
    bonus = math.sqrt(math.log(runs + 1) / (node.visits + 1))
    return params.contrast_weight * contrast + params.depth_weight * remaining + params.explore_c * bonus


def pick_node(root: Node, runs: int, params: DenseParams, rng: random.Random) -> Node | None:
    candidates, stack = [], [root]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if not node.terminal and node.depth < params.max_depth and free_labels(node, params):
            candidates.append(node)
    if not candidates:
        return None
    scores = [extension_score(n, runs, params) for n in candidates]
    best = max(scores)
    tied = sorted((n for n, s in zip(candidates, scores) if s == best), key=lambda n: n.key)
    return rng.choice(tied)


async def follow(expander: Expander, start: Node, label: int, params: DenseParams, rng: random.Random) -> bool:
    """Walk from `start` taking `label`, then random labels, to a terminal node.
    Returns whether the run added a node (else it was already decided)."""
    node, added = start, False
    while not node.terminal:
        child = child_with_label(node, label)
        if child is None:
            if expander.over_budget():
                node.close(StopReason.BUDGET)
                break
            child = await generate(expander, node, label, params)
            if child is None:
                break
            added = True
        node = child
        label = rng.randrange(params.width)
    refresh_path(node)
    return added


async def generate(expander: Expander, node: Node, label: int, params: DenseParams) -> Node | None:
    replies = await expander.propose(node, 1, temperature=label_temperature(label, params), salt=("dense", label))
    if not replies:
        node.close(StopReason.ERROR)
        return None
    return await expander.step(node, replies[0], label=label)


async def run(expander: Expander, params: DenseParams) -> None:
    root = expander.tree.root
    rng = random.Random(expander.seed_for(root, "dense"))
    runs = int(await follow(expander, root, 0, params, rng))
    while (runs < params.run_budget and contrast_pairs(root, params) < params.target_pairs
           and not expander.over_budget()):
        node = pick_node(root, runs, params, rng)
        if node is None:
            break
        label = rng.choice(free_labels(node, params))
        if await follow(expander, node, label, params, rng):
            runs += 1
    close_open_leaves(expander.tree, StopReason.BUDGET)
    for leaf in expander.tree.leaves():
        refresh_path(leaf)
