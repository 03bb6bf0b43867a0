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


async def run(expander: Expander, params: ToTParams) -> None:
    rng = random.Random(expander.seed_for(expander.tree.root, "tot"))
    frontier = [expander.tree.root]
    while frontier and not expander.over_budget():
        await asyncio.gather(*(expander.expand(node, params.branching, temperature=params.temperature)
                               for node in frontier))
        frontier = [c for node in frontier for c in node.children if not c.terminal]
        if params.beam is not None and len(frontier) > params.beam:
            kept = set(rng.sample(range(len(frontier)), params.beam))
            for i, node in enumerate(frontier):
                if i not in kept:
                    node.close(StopReason.BUDGET)
            frontier = [node for i, node in enumerate(frontier) if i in kept]
    close_open_leaves(expander.tree, StopReason.BUDGET)
    average_values(expander.tree.root)
