"""MCTS with progressive widening (mcts_pw) on the scripted word env: one LLM call per step of
a walk, every walk backed up from a terminal node, the widening rule, exhaustion, budgets, and
the same tree for the same seed. Oracles: the definitions in jobs/search/mcts_pw.py's
docstring (counts over the grown tree), not the code's own bookkeeping."""

from __future__ import annotations

import math

import pytest

from tests.support.scripted import RepeatingPolicy, SeededPolicy, WordEnv, grown
from thicket.search.mcts import MCTSParams
from thicket.search.mcts_pw import MCTSPWParams
from thicket.search.tree import Node, StopReason


def evaluated_leaves(node: Node) -> list[Node]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if not n.children and n.stop.evaluated:
            out.append(n)
        stack.extend(n.children)
    return out


async def test_a_walk_from_a_fresh_root_is_one_call_per_step_down_to_a_terminal_node():
    x = await grown(MCTSPWParams(iterations=1, max_depth=10), env=WordEnv(target="abab"), policy=SeededPolicy())
    assert x.llm_calls == 4 and x.tree.size == 5  # a chain: root and four spelled letters
    [leaf] = evaluated_leaves(x.tree.root)
    assert leaf.depth == 4 and leaf.stop is StopReason.DONE
    assert all(node.visits == 1 for node in leaf.path())  # the walk's return backed up to the root


async def test_visits_and_values_are_the_backed_up_terminal_returns():
    x = await grown(MCTSPWParams(iterations=12, max_depth=10), env=WordEnv(target="abab"), policy=SeededPolicy())
    for node in x.tree.nodes():
        below = evaluated_leaves(node)
        assert node.visits == len(below)
        assert node.value_sum == pytest.approx(sum(max(leaf.path_return, 0.0) for leaf in below))
    assert 0 < x.tree.root.visits <= 12  # a walk that ends on a repeated sample backs nothing up


@pytest.mark.parametrize("c,alpha", [(1.0, 0.5), (2.0, 0.5), (1.0, 0.3)])
async def test_a_node_widens_past_its_allowance_only_when_its_children_are_terminal(c, alpha):
    params = MCTSPWParams(iterations=40, max_depth=10, widen_c=c, widen_alpha=alpha)
    x = await grown(params, env=WordEnv(target="abcabc", letters="abc"), policy=SeededPolicy())
    widened_when_stuck = 0
    for node in x.tree.nodes():
        allowance = max(1, math.ceil(c * node.visits**alpha))
        if len(node.children) > allowance:  # the newest child came when every older one was terminal
            assert all(child.terminal for child in node.children[:-1]), node.key
            widened_when_stuck += 1
    assert x.tree.root.visits > 20 and widened_when_stuck < 10


async def test_a_small_tree_is_exhausted_whole():
    params = MCTSPWParams(iterations=400, max_depth=10, close_after=20)  # 2**-20: a missed letter is unlikely
    x = await grown(params, env=WordEnv(target="aba"), policy=SeededPolicy())
    root = x.tree.root
    assert root.terminal and root.stop is StopReason.EXHAUSTED
    assert x.tree.size == 15 and len(evaluated_leaves(root)) == 8  # the complete binary tree of depth 3
    assert x.llm_calls >= x.tree.size - 1  # repeated samples were paid for and dropped
    assert x.tree.solved


@pytest.mark.parametrize("close_after", [1, 3])
async def test_repeated_samples_close_a_node_and_its_parent_then_widens_by_its_own_repeats(close_after):
    params = MCTSPWParams(iterations=50, max_depth=10, close_after=close_after)
    x = await grown(params, env=WordEnv(target="aba"), policy=RepeatingPolicy())
    # walk 1 spells "aaa"; later walks go down to "aa", widen it and get "a" again until the
    # close_after-th repeat closes it; then "a" (all its children terminal) widens, and so on up
    assert x.tree.size == 4 and x.llm_calls == 3 + 3 * close_after
    assert [n.stop for n in x.tree.nodes()] == [StopReason.EXHAUSTED] * 3 + [StopReason.DONE]


async def test_the_budget_is_kept_and_leaves_no_error_nor_closed_inner_node():
    params = MCTSPWParams(iterations=1000, max_depth=10, max_llm_calls=23)
    x = await grown(params, env=WordEnv(target="abcabc", letters="abc"), policy=SeededPolicy())
    assert x.llm_calls == 23
    assert not [n for n in x.tree.nodes() if n.stop is StopReason.ERROR]
    assert all(n.stop in (StopReason.EXPANDED, StopReason.EXHAUSTED) for n in x.tree.nodes() if n.children)


async def test_at_equal_calls_it_ends_more_trajectories_than_agent_r_mcts():
    """The point of the variant: Agent-R's MCTS pays N_GEN calls a level on a fresh path."""
    env_args = {"target": "abcabc", "letters": "abc"}
    pw = await grown(MCTSPWParams(iterations=1000, max_depth=10, max_llm_calls=48), env=WordEnv(**env_args),
                     policy=SeededPolicy())
    agent_r = await grown(MCTSParams(iterations=1000, expansions=4, max_depth=10, max_llm_calls=48),
                          env=WordEnv(**env_args), policy=SeededPolicy())
    assert pw.llm_calls == agent_r.llm_calls == 48
    assert len(evaluated_leaves(pw.tree.root)) >= 6 > len(evaluated_leaves(agent_r.tree.root)) / 2


async def test_same_seed_same_tree_and_other_seed_other_tree():
    def shape(x):
        return [(n.key, n.reply.action if n.reply else None, n.visits) for n in x.tree.nodes()]

    params = MCTSPWParams(iterations=20, max_depth=10)
    env = dict(target="abcabc", letters="abc")
    a = await grown(params, env=WordEnv(**env), policy=SeededPolicy(), seed=1)
    b = await grown(params, env=WordEnv(**env), policy=SeededPolicy(), seed=1)
    c = await grown(params, env=WordEnv(**env), policy=SeededPolicy(), seed=2)
    assert shape(a) == shape(b) and shape(a) != shape(c)
