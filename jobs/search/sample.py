"""Independent trajectories (the baseline): `samples` turns at the root, then each
trajectory goes on alone, one turn at a time, until it ends."""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import Field

from thicket.search.expand import Expander, close_open_leaves
from thicket.search.params import SearchParams
from thicket.search.tree import Node, StopReason, average_values


class SampleParams(SearchParams):
    algorithm: Literal["sample"] = "sample"
    samples: int = Field(4, ge=1, le=256, description="independent trajectories per task")
    dedupe: bool = False  # independent samples may repeat each other


async def run(expander: Expander, params: SampleParams) -> None:
    firsts = await expander.expand(expander.tree.root, params.samples, temperature=params.temperature)
    await asyncio.gather(*(continue_alone(expander, node, params) for node in firsts))
    close_open_leaves(expander.tree, StopReason.BUDGET)
    average_values(expander.tree.root)


async def continue_alone(expander: Expander, node: Node, params: SampleParams) -> None:
    while not node.terminal:
        children = await expander.expand(node, 1, temperature=params.temperature)
        if not children:
            if not node.terminal:
                node.close(StopReason.ERROR)
            return
        node = children[0]
