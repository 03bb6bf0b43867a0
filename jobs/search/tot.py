"""Tree-of-Thoughts rollouts: at each node sample thoughts, then an action per
thought (each thought and its action in one sample: one propose of `branching` samples,
the action sampled after its thought as in two requests, with no re-tokenized thought
between them); breadth-first to the depth limit, keeping at most `beam` open nodes per
level (a seeded random choice). Node values are the mean of their children's."""

from __future__ import annotations

import asyncio
import random
from typing import Literal

from pydantic import Field

from thicket.search.expand import Expander, close_open_leaves
from thicket.search.params import SearchParams
from thicket.search.tree import StopReason, average_values


class ToTParams(SearchParams):
    algorithm: Literal["tot"] = "tot"
    branching: int = Field(3, ge=1, le=64, description="thoughts sampled per node")
    beam: int | None = Field(None, ge=1, description="open nodes kept per level (None: all)")


async def run(x: Expander, p: ToTParams) -> None:
    rng = random.Random(x.seed_for(x.tree.root, "tot"))
    frontier = [x.tree.root]
    while frontier and not x.over_budget():
        await asyncio.gather(*(x.expand(node, p.branching, temperature=p.temperature) for node in frontier))
        frontier = [c for node in frontier for c in node.children if not c.terminal]
        if p.beam is not None and len(frontier) > p.beam:
            kept = set(rng.sample(range(len(frontier)), p.beam))
            for i, node in enumerate(frontier):
                if i not in kept:
                    node.close(StopReason.BUDGET)
            frontier = [node for i, node in enumerate(frontier) if i in kept]
    close_open_leaves(x.tree, StopReason.BUDGET)
    average_values(x.tree.root)
