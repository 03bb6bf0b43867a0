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
from thicket.search.tree import Node, StopReason, average_values, refresh_path


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


def sibling_pairs(node: Node, params: DenseParams) -> int:
    """Contrast pairs among `node`'s children."""
    seen = [c for c in node.children if c.visits >= params.min_visits]
    return sum(1 for i, a in enumerate(seen) for b in seen[i + 1 :] if abs(a.value - b.value) >= params.beta)


def contrast_pairs(root: Node, params: DenseParams) -> int:
    pairs, stack = 0, [root]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        pairs += sibling_pairs(node, params)
    return pairs


def spread(nodes: list[Node]) -> float:
    values = [n.value for n in nodes if n.visits > 0]
    return max(values) - min(values) if len(values) >= 2 else 0.0


def base_score(contrast: float, depth: int, params: DenseParams) -> float:
    """A candidate's score is base_score + exploration: the largest value contrast around it
    (among its children or its siblings), its remaining depth, and the exploration bonus."""
    remaining = (params.max_depth - depth) / params.max_depth
    return params.contrast_weight * contrast + params.depth_weight * remaining


def exploration(visits: int, runs: int, params: DenseParams) -> float:
    return params.explore_c * math.sqrt(math.log(runs + 1) / (visits + 1))


def extendable(node: Node, params: DenseParams) -> bool:
    return not node.terminal and node.depth < params.max_depth and bool(free_labels(node, params))


class Frontier:
    """The nodes a run may start from and the tree's contrast pairs, kept up to date run by run.
    A run changes values on its path only (refresh_path), and adds and closes nodes on it, so only
    the path's nodes need a new look, and their children where their siblings' spread changed.
    Candidates are grouped by (visits, base_score): one exact score per group."""

    def __init__(self, params: DenseParams) -> None:
        self.params = params
        self.pairs = 0  # contrast_pairs(root)
        self._pairs: dict[Node, int] = {}  # node -> sibling_pairs(node)
        self._spread: dict[Node, float] = {}  # node -> spread(node.children)
        self._group: dict[Node, tuple[int, float]] = {}  # candidate -> its group
        self._groups: dict[tuple[int, float], set[Node]] = {}

    def update(self, end: Node) -> None:
        """After a run that ended at `end` and refreshed the values on its path."""
        path = end.path()
        changed = [self._refresh(node) for node in path]
        self.place(path[0])
        for i, node in enumerate(path):
            if changed[i]:  # every child's contrast may have changed
                for child in node.children:
                    self.place(child)
            elif i + 1 < len(path):
                self.place(path[i + 1])

    def _refresh(self, node: Node) -> bool:
        """Count `node`'s pairs again; whether the spread of its children changed."""
        pairs = sibling_pairs(node, self.params)
        self.pairs += pairs - self._pairs.get(node, 0)
        self._pairs[node] = pairs
        before, self._spread[node] = self._spread.get(node), spread(node.children)
        return self._spread[node] != before

    def place(self, node: Node) -> None:
        """(Re)file `node` by its current score inputs, or drop it if it is no candidate."""
        group = self._group.pop(node, None)
        if group is not None:
            members = self._groups[group]
            members.discard(node)
            if not members:
                del self._groups[group]
        if not extendable(node, self.params):
            return
        siblings = self._spread[node.parent] if node.parent is not None else 0.0
        contrast = max(self._spread.get(node, 0.0), siblings)
        group = (node.visits, base_score(contrast, node.depth, self.params))
        self._group[node] = group
        self._groups.setdefault(group, set()).add(node)

    def pick(self, runs: int, rng: random.Random) -> Node | None:
        """The candidate with the best score, ties broken by `rng` among them in key order."""
        if not self._groups:
            return None
        scores = {group: group[1] + exploration(group[0], runs, self.params) for group in self._groups}
        best = max(scores.values())
        tied = sorted((n for group, s in scores.items() if s == best for n in self._groups[group]), key=lambda n: n.key)
        return rng.choice(tied)


async def follow(expander: Expander, start: Node, label: int, params: DenseParams,
                 rng: random.Random) -> tuple[Node, bool]:
    """Walk from `start` taking `label`, then random labels, to a terminal node. Returns
    that node and whether the run added a node (else it was already decided)."""
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
    return node, added


async def generate(expander: Expander, node: Node, label: int, params: DenseParams) -> Node | None:
    replies = await expander.propose(node, 1, temperature=label_temperature(label, params), salt=("dense", label))
    if not replies:
        node.close(StopReason.ERROR)
        return None
    return await expander.step(node, replies[0], label=label)


async def run(expander: Expander, params: DenseParams) -> None:
    root = expander.tree.root
    rng = random.Random(expander.seed_for(root, "dense"))
    frontier = Frontier(params)
    end, added = await follow(expander, root, 0, params, rng)
    frontier.update(end)
    runs = int(added)
    while runs < params.run_budget and frontier.pairs < params.target_pairs and not expander.over_budget():
        node = frontier.pick(runs, rng)
        if node is None:
            break
        label = rng.choice(free_labels(node, params))
        end, added = await follow(expander, node, label, params, rng)
        frontier.update(end)
        runs += added
    close_open_leaves(expander.tree, StopReason.BUDGET)
    if root.children:  # the values refresh_path on every leaf would give
        average_values(root)
