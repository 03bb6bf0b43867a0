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


async def run(x: Expander, p: SampleParams) -> None:
    firsts = await x.expand(x.tree.root, p.samples, temperature=p.temperature)
    await asyncio.gather(*(continue_alone(x, node, p) for node in firsts))
    close_open_leaves(x.tree, StopReason.BUDGET)
    average_values(x.tree.root)


async def continue_alone(x: Expander, node: Node, p: SampleParams) -> None:
    while not node.terminal:
        children = await x.expand(node, 1, temperature=p.temperature)
        if not children:
            if not node.terminal:
                node.close(StopReason.ERROR)
            return
        node = children[0]
