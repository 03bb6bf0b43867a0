"""The DPO dataset over random trees: every pair shares its prompt and meets the gap; pairs from
the cut grid of ranked leaves are those of the whole grid; observations are flagged out of the
scored part, and the first-turn variant holds none."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.random_trees import Rows, random_tree, rows_of, trees
from thicket.aggregate.dpo import dpo_table, dpo_tables
from thicket.aggregate.forest import Forest
from thicket.aggregate.pairs import grid_pairs
from thicket.aggregate.params import DPOParams
from thicket.aggregate.view import EVALUATED, TreeView


def plain(messages: list[dict]) -> list[dict]:
    """Messages without their loss flags."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.integers(0, 2), st.integers(0, 5))
def test_every_dpo_pair_shares_its_prompt_and_meets_the_gap(tree, beta, min_visits, cap):
    table, _ = tree
    ref = Rows(table)
    pairs = rows_of(dpo_table(TreeView.of(table), DPOParams(beta=beta, min_visits=min_visits, max_trajectory_pairs_per_task=cap)))
    assert len({p["id"] for p in pairs}) == len(pairs)
    assert sum(p["kind"] == "trajectory" for p in pairs) <= cap
    for p in pairs:
        good, bad, split = ref.path(p["chosen_node"]), ref.path(p["rejected_node"]), p["prompt_node"]
        assert split in good and split in bad and good[good.index(split) + 1] != bad[bad.index(split) + 1]
        assert p["prompt"] == ref.chat(split)
        assert p["prompt"] + plain(p["chosen"]) == ref.path_chat(p["chosen_node"])
        assert p["prompt"] + plain(p["rejected"]) == ref.path_chat(p["rejected_node"])
        assert p["chosen"][-1]["role"] == p["rejected"][-1]["role"] == "assistant"
        chosen, rejected = ref.rows[p["chosen_node"]], ref.rows[p["rejected_node"]]
        if p["kind"] == "step":
            assert chosen["parent"] == rejected["parent"] == split
            assert len(p["chosen"]) == len(p["rejected"]) == 1 and chosen["reply"] != rejected["reply"]
            assert (p["chosen_reward"], p["rejected_reward"]) == (chosen["value"], rejected["value"])
            assert chosen["value"] - rejected["value"] >= beta and chosen["value"] > rejected["value"]
            assert chosen["visits"] >= min_visits and rejected["visits"] >= min_visits
        else:
            assert chosen["success"] and not rejected["success"] and rejected["stop_reason"] in EVALUATED
            assert p["chosen_node"] in ref.leaves() and p["rejected_node"] in ref.leaves()
            assert p["chosen_reward"] == pytest.approx(ref.ret(p["chosen_node"]))
            assert p["chosen_reward"] > p["rejected_reward"]
    # every qualifying sibling pair is there
    expected_steps = 0
    for kids in ref.children.values():
        ok = [k for k in kids if ref.rows[k]["visits"] >= min_visits]
        for i, a in enumerate(ok):
            for b in ok[i + 1 :]:
                va, vb = ref.rows[a]["value"], ref.rows[b]["value"]
                expected_steps += va != vb and abs(va - vb) >= beta and ref.rows[a]["reply"] != ref.rows[b]["reply"]
    assert sum(p["kind"] == "step" for p in pairs) == expected_steps


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from([None, 0.0, 0.25, 0.5]), st.integers(0, 5))
def test_pairs_from_the_cut_grid_are_those_of_the_whole_grid(seed, gap, cap):
    rng = random.Random(seed)
    forest = Forest.of([random_tree(rng.randrange(2**32), rng.randint(1, 40), task=i)[0] for i in range(rng.randint(1, 4))])
    score = np.array([rng.choice((0.0, 0.25, 0.5, 1.0, float("nan"))) for _ in range(forest.size)])
    good = forest.ranked(np.flatnonzero([rng.random() < 0.4 for _ in range(forest.size)]), -score, forest.depth)
    bad = forest.ranked(np.flatnonzero([rng.random() < 0.6 for _ in range(forest.size)]), score, forest.depth)
    expected = []
    for k in range(forest.n_trees):  # the whole grid, walked until `cap` pairs count
        g, b = [v for v in good if forest.tree_of[v] == k], [v for v in bad if forest.tree_of[v] == k]
        walk = [(g[i], b[j]) for total in range(len(g) + len(b)) for i in range(total + 1) for j in [total - i]
                if i < len(g) and j < len(b)]  # by rank sum, then good rank
        ok = [(x, y) for x, y in walk if (score[x] > score[y] if gap is None else score[x] - score[y] > gap)]
        expected += ok[:cap]
    chosen, rejected = grid_pairs(forest, good, bad, score, cap, gap)
    assert list(zip(chosen.tolist(), rejected.tolist())) == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.sampled_from([0.0, 0.5]), st.integers(1, 4))
def test_observations_are_flagged_out_of_dpo_pairs_and_first_turn_pairs_score_none(tree, beta, cap):
    """A trajectory pair runs on through the env's observations: each message's loss flag is true on
    the assistant's turns only, and `dpo_first_turn` cuts every pair to the first turn where its
    sides part (one assistant message a side), once per pair of nodes, never two equal replies."""
    table, _ = tree
    ref = Rows(table)
    full, first = dpo_tables(TreeView.of(table), DPOParams(beta=beta, max_trajectory_pairs_per_task=cap))
    pairs, firsts = rows_of(full), rows_of(first)
    for p in pairs:
        for side in (p["chosen"], p["rejected"]):
            assert [m["loss"] for m in side] == [m["role"] == "assistant" for m in side]
            assert side[0]["loss"] and side[-1]["loss"]
    expected: dict[tuple[int, int], dict] = {}
    for p in pairs:
        good, bad = ref.path(p["chosen_node"]), ref.path(p["rejected_node"])
        at = good.index(p["prompt_node"]) + 1
        if ref.rows[good[at]]["reply"] != ref.rows[bad[at]]["reply"]:
            expected.setdefault((good[at], bad[at]), p)
    assert [(f["chosen_node"], f["rejected_node"]) for f in firsts] == list(expected)
    for f in firsts:
        p = expected[(f["chosen_node"], f["rejected_node"])]
        assert (f["prompt"], f["kind"], f["prompt_node"]) == (p["prompt"], p["kind"], p["prompt_node"])
        assert f["prompt"][-1]["role"] == "user"
        assert f["chosen"] == [{"role": "assistant", "content": ref.rows[f["chosen_node"]]["reply"]}]
        assert f["rejected"] == [{"role": "assistant", "content": ref.rows[f["rejected_node"]]["reply"]}]
        assert f["chosen"] == plain(p["chosen"][:1]) and f["rejected"] == plain(p["rejected"][:1])
        assert (f["chosen_reward"], f["rejected_reward"]) == (p["chosen_reward"], p["rejected_reward"])
    assert len({f["id"] for f in firsts}) == len(firsts)
