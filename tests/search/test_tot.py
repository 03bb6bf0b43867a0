"""Tree-of-Thoughts on a scripted env and policy: thoughts then actions breadth first with mean
values, and the beam."""

from __future__ import annotations

import pytest

from tests.support.scripted import RunningWordEnv, SeededPolicy, WordEnv, grown
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


def child(node, action):
    return next(c for c in node.children if c.reply.action == action)


@pytest.mark.parametrize("seed", range(4))
async def test_tot_rollout_beam_keeps_the_node_whose_simulation_succeeded(seed):
    """beam_score rollout (LATS's simulation as ToT's state evaluator): on a sparse reward every
    open node ties at 0 by progress; one trajectory from each, kept in the tree, tells them apart.
    The cycling policy's single samples are "a": from "a" the simulation spells "aaa" (the
    target), from "b" it spells "baa". Worked by hand: level 1 keeps "a"; level 2 keeps the
    simulation's own "aa" over the new "ab" (whose simulation "aba" failed); level 3 adds "aab"
    ("aaa" repeats the simulation's reply and is dropped)."""
    x = await grown(ToTParams(branching=2, beam=1, beam_score="rollout", max_depth=3),
                    env=WordEnv(target="aaa"), seed=seed)
    root = x.tree.root
    a, b = child(root, "a"), child(root, "b")
    assert x.tree.solved and child(child(a, "a"), "a").success
    assert not b.terminal and [n.reply.action for n in b.children] == ["a"]  # simulated, then left
    assert child(child(b, "a"), "a").stop is StopReason.DONE and not child(child(b, "a"), "a").success
    assert sorted("".join(n.actions()) for n in x.tree.nodes() if not n.children) == ["aaa", "aab", "aba", "baa"]
    assert x.llm_calls == 11  # 2 + simulations 2 + 2, level 2: 2 + simulation 1, level 3: 2
    assert sum(1 for _ in x.tree.nodes()) == 10
    assert not any(n.stop is StopReason.PRUNED for n in x.tree.nodes())


async def test_tot_progress_beam_on_a_sparse_reward_is_a_coin_flip():
    """The contrast to the test above: by progress, "a" and "b" tie at 0, and the seeded
    tie-break keeps "b" for some seeds."""
    kept_b = set()
    for seed in range(8):
        x = await grown(ToTParams(branching=2, beam=1, max_depth=3), env=WordEnv(target="aaa"), seed=seed)
        kept_b.add(child(x.tree.root, "b").stop is not StopReason.PRUNED)
    assert kept_b == {True, False}


async def test_tot_rollout_beam_keeps_to_the_budget_the_same_way_every_time():
    """Where the budget cannot pay for every simulation to its end they run one after another,
    so the tree is the same on every run, and every call paid for is stepped or a dropped repeat."""
    params = ToTParams(branching=2, beam=1, beam_score="rollout", max_depth=6, max_llm_calls=9)
    trees = []
    for _ in range(3):
        x = await grown(params, env=WordEnv(target="abbaba"), policy=SeededPolicy(), seed=5)
        assert x.llm_calls <= 9
        trees.append(sorted((n.key, n.reply.action if n.reply else "", n.stop) for n in x.tree.nodes()))
    assert trees[0] == trees[1] == trees[2]
