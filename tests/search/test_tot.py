"""Tree-of-Thoughts on a scripted env and policy: thoughts then actions breadth first with mean
values, and the beam."""

from __future__ import annotations

import pytest

from tests.support.scripted import RunningWordEnv, grown
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


def levels(tree) -> dict[int, list]:
    by_depth: dict[int, list] = {}
    for node in tree.nodes():
        by_depth.setdefault(node.depth, []).append(node)
    return by_depth


@pytest.mark.parametrize("score", ["progress", "random"])
async def test_tot_beam_keeps_at_most_beam_open_nodes_per_level(score):
    x = await grown(ToTParams(branching=2, beam=2, beam_score=score, max_depth=10))
    by_depth = levels(x.tree)
    assert len([n for n in by_depth[2] if n.children]) == 2
    assert sum(n.stop is StopReason.PRUNED for n in by_depth[2]) == 2


async def test_tot_beam_keeps_the_nodes_of_most_progress():
    """ToT's beam keeps the states its evaluator values most; with beam_score progress the
    evaluator is the env's own running score: a beam of 1 follows the target letter by letter."""
    target = "abbab"
    x = await grown(ToTParams(branching=2, beam=1, max_depth=10), env=RunningWordEnv(target=target))
    by_depth = levels(x.tree)
    for depth in range(1, len(target)):
        kept = [n for n in by_depth[depth] if n.stop is not StopReason.PRUNED]
        assert len(kept) == 1 and kept[0].path_return == max(n.path_return for n in by_depth[depth])
    assert x.tree.solved
    assert [n.reply.action for n in next(n for n in x.tree.nodes() if n.success).path()[1:]] == list(target)


async def test_tot_random_beam_ignores_progress():
    """A random beam is a seeded choice: across seeds it keeps nodes of less progress too."""
    kept_less = False
    for seed in range(12):
        x = await grown(ToTParams(branching=2, beam=1, beam_score="random", max_depth=10),
                        env=RunningWordEnv(target="abbab"), seed=seed)
        first = [n for n in x.tree.root.children if n.stop is not StopReason.PRUNED]
        kept_less |= first[0].path_return < max(n.path_return for n in x.tree.root.children)
    assert kept_less
