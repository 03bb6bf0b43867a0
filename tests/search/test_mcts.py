"""MCTS with Agent-R's semantics on a scripted env and policy: UCT selection, exact visits and
values, terminal nodes, duplicate replies, replay branching, and the same tree for the same seed."""

from __future__ import annotations

import math
import random

import pytest

from tests.support.scripted import FaultyWordEnv, ReplayOnlyWordEnv, RepeatingPolicy, RunningWordEnv, WordEnv, grown
from thicket.envs.protocol import Observation
from thicket.search.mcts import MCTSParams, select, uct_score
from thicket.search.tree import Node, StopReason


def leaves_below(node: Node) -> int:
    return 1 if not node.children else sum(leaves_below(c) for c in node.children)


# ---- MCTS -----------------------------------------------------------------


def make_children(visits_values: list[tuple[int, float, bool]]) -> Node:
    parent = Node(parent=None, index=0, depth=0, observation=Observation("p"))
    parent.visits = sum(v for v, _, _ in visits_values)
    for i, (visits, value_sum, terminal) in enumerate(visits_values):
        child = Node(parent=parent, index=i, depth=1, observation=Observation(str(i)), visits=visits, value_sum=value_sum)
        child.terminal = terminal
        parent.children.append(child)
    return parent


def test_uct_prefers_unvisited_then_scores_by_formula():
    parent = make_children([(2, 1.0, False), (0, 0.0, False), (1, 1.0, False)])
    assert select(parent, 0.25, random.Random(0)) is parent.children[1]
    parent.children[1].visits, parent.children[1].value_sum = 4, 0.0
    parent.visits = 7
    expected = [v / n + 0.25 * math.sqrt(math.log(7) / n) for n, v in [(2, 1.0), (4, 0.0), (1, 1.0)]]
    assert [uct_score(c, 7, 0.25) for c in parent.children] == pytest.approx(expected)
    assert select(parent, 0.25, random.Random(0)) is parent.children[2]


def test_select_skips_terminal_children_and_breaks_ties_with_the_rng():
    parent = make_children([(0, 0.0, True), (0, 0.0, False), (0, 0.0, False)])
    picks = {select(parent, 0.25, random.Random(seed)).index for seed in range(40)}
    assert picks == {1, 2}
    assert select(make_children([(1, 1.0, True), (1, 0.0, True)]), 0.25, random.Random(0)) is None


async def test_mcts_one_iteration_descends_to_terminal_and_backs_up_every_terminal_child():
    x = await grown(MCTSParams(iterations=1, expansions=2, max_depth=10))
    root = x.tree.root
    # root -> 2 children; one is walked down: 2 grandchildren; one of those: 2 leaves (done)
    assert x.tree.size == 7
    assert root.visits == 2  # both leaves of the last expansion were backed up at once
    walked = [n for n in x.tree.nodes() if n.depth == 2 and n.children]
    assert len(walked) == 1 and walked[0].stop is StopReason.EXHAUSTED and walked[0].terminal
    assert all(leaf.stop is StopReason.DONE for leaf in walked[0].children)
    assert root.value_sum == sum(leaf.reward for leaf in walked[0].children)


def agent_r_walks_to_exhaust(branching: int, depth: int) -> int:
    """Agent-R's loop over a complete tree of `branching` children a node whose depth-`depth` nodes
    are terminal (mcts_raw.py: expand, then best_child down to a terminal node; every backup
    marks a node terminal once all its children are): how many iterations until the root is
    terminal. Every walk takes the first open child (ties do not change the count)."""
    terminal: dict[tuple[int, ...], bool] = {}
    expanded: set[tuple[int, ...]] = set()

    def is_terminal(key: tuple[int, ...]) -> bool:
        return len(key) >= depth or terminal.get(key, False)

    def update(key: tuple[int, ...]) -> None:  # backpropagation's update_terminal, leaf to root
        for cut in range(len(key), -1, -1):
            node = key[:cut]
            if node in expanded:
                terminal[node] = all(is_terminal(node + (i,)) for i in range(branching))

    walks = 0
    while not is_terminal(()):
        walks += 1
        node: tuple[int, ...] = ()
        while node is not None and not is_terminal(node):
            if node not in expanded:
                expanded.add(node)
                for i in range(branching):
                    if is_terminal(node + (i,)):
                        update(node + (i,))
            while node is not None and node in expanded and not is_terminal(node):
                open_children = [node + (i,) for i in range(branching) if not is_terminal(node + (i,))]
                if not open_children:
                    terminal[node] = True
                    node = None
                    break
                node = open_children[0]
    return walks


@pytest.mark.parametrize("depth", [3, 4])
async def test_mcts_spends_exactly_the_walks_agent_r_does_to_exhaust_a_tree(depth):
    """A parent becomes terminal during the backup that closes its last open child, so no walk is
    spent finding that out: a complete binary tree of depth 4 (31 nodes) takes Agent-R 8 walks."""
    walks = agent_r_walks_to_exhaust(2, depth)
    assert walks == 2 ** (depth - 1)
    word = "ab" * depth
    short = await grown(MCTSParams(iterations=walks - 1, expansions=2, max_depth=10), env=WordEnv(target=word[:depth]))
    assert not short.tree.root.terminal
    x = await grown(MCTSParams(iterations=walks, expansions=2, max_depth=10), env=WordEnv(target=word[:depth]))
    assert x.tree.root.terminal and x.tree.root.stop is StopReason.EXHAUSTED
    assert x.tree.size == 2 ** (depth + 1) - 1
    assert x.tree.root.visits == 2**depth


async def test_mcts_exhausts_a_small_tree_with_exact_visits_and_values():
    x = await grown(MCTSParams(iterations=4, expansions=2, max_depth=10))
    root = x.tree.root
    assert root.terminal and root.stop is StopReason.EXHAUSTED
    assert x.tree.size == 15  # the complete binary tree of depth 3
    assert root.visits == 8 and root.value_sum == 1.0  # exactly one leaf spells "aba"
    for node in x.tree.nodes():
        assert node.visits == leaves_below(node)
        assert node.value_sum == sum(leaf.reward for leaf in x.tree.leaves() if node in leaf.path())
    assert x.tree.solved


async def test_mcts_depth_limit_and_disaster_are_terminal_with_score_zero():
    x = await grown(MCTSParams(iterations=50, expansions=2, max_depth=2), env=WordEnv(bomb="b"))
    stops = {n.key: n.stop for n in x.tree.nodes()}
    assert stops[(1,)] is StopReason.DISASTER  # "b" is the bomb
    assert all(stops[k] is StopReason.DEPTH_LIMIT for k in stops if len(k) == 2)
    assert x.tree.root.value_sum == 0.0 and x.tree.root.visits == 3


async def test_a_running_score_backs_up_each_leafs_last_score_not_a_sum():
    """RewardSemantics.RUNNING: a leaf's value is its path's final score (ScienceWorld's running
    score); the sum of the scores along the path would count the same progress again and again."""
    x = await grown(MCTSParams(iterations=4, expansions=2, max_depth=10), env=RunningWordEnv(target="aba"))
    leaves = x.tree.leaves()
    assert {leaf.path_return for leaf in leaves} == {leaf.reward for leaf in leaves} == {0.0, 1 / 3, 2 / 3, 1.0}
    assert x.tree.root.value_sum == pytest.approx(sum(leaf.reward for leaf in leaves))
    assert x.tree.root.value_sum < sum(n.reward for leaf in leaves for n in leaf.path())
    best = max(leaves, key=lambda leaf: leaf.path_return)
    assert best.success and best.path_return == 1.0


async def test_env_faults_are_terminal_leaves_that_carry_no_evidence():
    """A leaf the env failed on is stored (ERROR) but never backed up: it is not the policy's
    failure, so it adds no visit and no zero value to its ancestors."""
    x = await grown(MCTSParams(iterations=4, expansions=2, max_depth=10), env=FaultyWordEnv(broken="ab"))
    errors = [n for n in x.tree.nodes() if n.stop is StopReason.ERROR]
    assert [e.key for e in errors] == [(0, 1)] and errors[0].visits == 0 and errors[0].terminal
    evaluated = [leaf for leaf in x.tree.leaves() if leaf.stop.evaluated]
    assert x.tree.root.visits == len(evaluated) == 6
    parent = errors[0].parent
    assert parent.visits == 2 and parent.value_sum == 0.0  # the "aa?" leaves only: "aba" is behind the fault
    assert x.tree.root.terminal


async def test_duplicate_replies_are_dropped():
    x = await grown(MCTSParams(iterations=1, expansions=4, max_depth=10), policy=RepeatingPolicy())
    assert len(x.tree.root.children) == 1


async def test_replay_branching_gives_the_same_tree_as_snapshots():
    a = await grown(MCTSParams(iterations=50, expansions=2, max_depth=10))
    env = ReplayOnlyWordEnv()
    b = await grown(MCTSParams(iterations=50, expansions=2, max_depth=10), env=env)
    assert [(n.key, n.reward, n.visits) for n in a.tree.nodes()] == [(n.key, n.reward, n.visits) for n in b.tree.nodes()]
    assert b.cursor.replayed_steps > 0


# ---- determinism ----------------------------------------------------------


async def test_same_seed_same_tree_and_other_seed_other_tree():
    from thicket.envs import make_env
    from thicket.policy.uniform import UniformPolicy

    async def keys(seed):
        x = await grown(
            MCTSParams(iterations=8, expansions=3, max_depth=8),
            env=make_env("frozenlake", is_slippery=True),
            policy=UniformPolicy(),
            seed=seed,
        )
        return [(n.key, n.reply.action if n.reply else "", n.observation.text, n.visits) for n in x.tree.nodes()]

    assert await keys(1) == await keys(1)
    assert await keys(1) != await keys(2)
