"""Independent trajectories (the baseline) on a scripted env and policy."""

from __future__ import annotations

from tests.support.scripted import grown
from thicket.search.sample import SampleParams
from thicket.search.tree import StopReason


async def test_sample_grows_independent_chains():
    x = await grown(SampleParams(samples=3, max_depth=10))
    assert len(x.tree.root.children) == 3
    for child in x.tree.root.children:
        node = child
        while node.children:
            assert len(node.children) == 1
            node = node.children[0]
        assert node.stop is StopReason.DONE and node.depth == 3
