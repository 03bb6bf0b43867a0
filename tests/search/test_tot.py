"""Tree-of-Thoughts on a scripted env and policy: thoughts then actions breadth first with mean
values, and the beam."""

from __future__ import annotations

import pytest

from tests.support.scripted import grown
from thicket.search.tot import ToTParams
from thicket.search.tree import StopReason


async def test_tot_expands_thoughts_then_actions_breadth_first_with_mean_values():
    x = await grown(ToTParams(branching=2, max_depth=10))
    assert x.tree.size == 15
    assert [c.reply.thought for c in x.tree.root.children] == ["option 0", "option 1"]
    # one propose of `branching` samples per expanded node, each sample a thought and its action
    assert sorted(x.policy.requests) == sorted((len(x.messages(n)), 2) for n in x.tree.nodes() if n.children)
    assert x.tree.root.value == pytest.approx(1 / 8)
    assert x.tree.root.visits == 8


async def test_tot_beam_keeps_at_most_beam_open_nodes_per_level():
    x = await grown(ToTParams(branching=2, beam=2, max_depth=10))
    by_depth = {}
    for node in x.tree.nodes():
        by_depth.setdefault(node.depth, []).append(node)
    assert len([n for n in by_depth[2] if n.children]) <= 2
    assert any(n.stop is StopReason.BUDGET for n in by_depth[2])
