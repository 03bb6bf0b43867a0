"""Pairs of one tree's ranked nodes, a good list against a bad one, taken from their grid by
rank sum: (0, 0), then (0, 1), (1, 0), then (0, 2), (1, 1), (2, 0), ... up to a cap per tree.

A pair counts when its scores are far enough apart: good - bad > gap (gap None: good > bad).
Good nodes come best (highest score) first and bad ones worst (lowest) first, so the pairs
that count are a staircase from (0, 0): past the first good that fails against the first
bad, and past the first bad that fails against the first good, none does. The grid is cut
there before it is walked (same pairs, same order; unbounded walks otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from thicket.aggregate.forest import Forest


def diagonal(n_a: int, n_b: int) -> Iterator[tuple[int, int]]:
    """Index pairs (i, j) of an n_a x n_b grid, best-ranked first: by i + j, then i."""
    for total in range(n_a + n_b - 1):
        for i in range(max(0, total - n_b + 1), min(n_a, total + 1)):
            yield i, total - i


def qualifies(good: np.ndarray | float, bad: np.ndarray | float, gap: float | None) -> np.ndarray | bool:
    return good > bad if gap is None else good - bad > gap


def grid_pairs(
    forest: Forest, good: np.ndarray, bad: np.ndarray, score: np.ndarray, cap: int, gap: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per tree, up to `cap` pairs (good node, bad node) that count, in grid order; `good` and
    `bad` grouped by tree (see Forest.ranked), `score` by node. Pairs are grouped by tree."""
    g_bounds, b_bounds = forest.by_tree(good), forest.by_tree(bad)
    trees = np.flatnonzero((np.diff(g_bounds) > 0) & (np.diff(b_bounds) > 0))  # with both
    if cap <= 0 or not len(trees):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # the staircase's edges: per tree, how many goods count against its first bad, and bads against its first good
    best, worst = np.zeros(forest.n_trees), np.zeros(forest.n_trees)
    best[trees], worst[trees] = score[good[g_bounds[trees]]], score[bad[b_bounds[trees]]]
    g_tree, b_tree = forest.tree_of[good], forest.tree_of[bad]
    n_good = np.bincount(g_tree, qualifies(score[good], worst[g_tree], gap), forest.n_trees).astype(int).tolist()
    n_bad = np.bincount(b_tree, qualifies(best[b_tree], score[bad], gap), forest.n_trees).astype(int).tolist()
    goods, bads, scores = good.tolist(), bad.tolist(), score.tolist()
    g_first, b_first = g_bounds.tolist(), b_bounds.tolist()
    pairs: list[tuple[int, int]] = []
    for k in trees.tolist():
        picked = 0
        for i, j in diagonal(n_good[k], n_bad[k]):
            if picked == cap:
                break
            g, b = goods[g_first[k] + i], bads[b_first[k] + j]
            if qualifies(scores[g], scores[b], gap):
                pairs.append((g, b))
                picked += 1
    out = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return out[:, 0], out[:, 1]
