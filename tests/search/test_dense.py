"""Dense trees for preference learning on a scripted env and policy: a greedy first run, unique
labels, child-mean values, contrast pairs and the target that stops the search."""

from __future__ import annotations

import pytest

from tests.support.scripted import TemperaturePolicy, grown
from thicket.search.dense import DenseParams, contrast_pairs


async def test_dense_first_run_is_greedy_and_labels_are_unique():
    params = DenseParams(width=2, max_depth=10, run_budget=1, target_pairs=100)
    x = await grown(params, policy=TemperaturePolicy())
    path = [n for n in x.tree.nodes() if n.parent is not None]
    assert len(path) == 3 and all(n.label == 0 and n.reply.temperature == 0.0 for n in path)


async def test_dense_values_are_child_means_and_pairs_meet_the_gap():
    params = DenseParams(width=2, max_depth=10, run_budget=50, target_pairs=100, beta=0.5)
    x = await grown(params, policy=TemperaturePolicy())
    for node in x.tree.nodes():
        assert len({c.label for c in node.children}) == len(node.children)
        seen = [c for c in node.children if c.visits > 0]
        if seen:
            assert node.value == pytest.approx(sum(c.value for c in seen) / len(seen))
    # label 0 spells "a", label 1 "b": the complete tree of 8 words, only "aba" succeeds.
    # Sibling gaps >= 0.5: aba/abb (1 vs 0) and ab/aa (0.5 vs 0); a/b differ by 0.25 only.
    assert x.tree.size == 15
    assert contrast_pairs(x.tree.root, params) == 2


async def test_dense_stops_at_target_pairs():
    params = DenseParams(width=2, max_depth=10, run_budget=50, target_pairs=1, beta=0.5)
    x = await grown(params, policy=TemperaturePolicy())
    assert contrast_pairs(x.tree.root, params) >= 1 and x.tree.size < 15
