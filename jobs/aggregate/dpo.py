"""DPO preference pairs, in TRL's format: `prompt` (the chat up to the shared prefix),
`chosen` and `rejected` (assistant-ending message lists continuing it).

trajectory (ETO-style): a successful leaf vs an evaluated failed leaf of the same task, with a
  strictly higher return. Successes ranked best first (as SFT), failures lowest return first
  (then fewest steps, lowest id); pairs taken from that grid by rank sum, up to a cap per task.
  Rewards are the paths' returns.
step (DensePolicy-style): siblings with differing replies, each with visits >= min_visits,
  whose values differ (by >= beta); chosen = the higher value. Rewards are node values.
Per tree, its trajectory pairs come first, then its step pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from thicket.aggregate.chats import MESSAGE, Chats
from thicket.aggregate.forest import Forest, ranges, shared_depth
from thicket.aggregate.pairs import grid_pairs
from thicket.aggregate.params import DPOParams
from thicket.aggregate.sft import successes

DPO_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("kind", pa.string()),  # trajectory | step
        ("task", pa.int64()),
        ("tree", pa.int64()),
        ("prompt_node", pa.int32()),  # the last node of the shared prefix
        ("chosen_node", pa.int32()),  # the last node of each side
        ("rejected_node", pa.int32()),
        ("prompt", pa.list_(MESSAGE)),
        ("chosen", pa.list_(MESSAGE)),
        ("rejected", pa.list_(MESSAGE)),
        ("chosen_reward", pa.float32()),
        ("rejected_reward", pa.float32()),
    ]
)
KINDS = pa.array(["trajectory", "step"])


@dataclass(frozen=True)
class Pairs:
    """Preference pairs as columns."""

    chosen: np.ndarray
    rejected: np.ndarray
    chosen_reward: np.ndarray
    rejected_reward: np.ndarray

    def __len__(self) -> int:
        return len(self.chosen)


def failures(forest: Forest) -> np.ndarray:
    """Evaluated leaves that did not succeed, grouped by tree, each tree's lowest return first."""
    failed = np.zeros(forest.size, dtype=bool)
    failed[forest.leaves] = True
    failed &= forest.evaluated & ~forest.success
    return forest.ranked(np.flatnonzero(failed), forest.returns, forest.depth)


def trajectory_pairs(forest: Forest, cap: int) -> Pairs:
    good, bad = grid_pairs(forest, successes(forest), failures(forest), forest.returns, cap)
    return Pairs(good, bad, forest.returns[good], forest.returns[bad])


def sibling_groups(forest: Forest, eligible: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eligible children (ascending) and, per group of siblings, its start and end among them;
    only the groups whose values span at least beta (siblings are contiguous)."""
    kids = np.flatnonzero(eligible & ~forest.is_root)
    none = np.zeros(0, dtype=np.int64)
    if len(kids) < 2:
        return kids, none, none
    parents = forest.parent[kids]
    starts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]])
    ends = np.r_[starts[1:], len(kids)]
    values = forest.value[kids]
    spread = np.maximum.reduceat(values, starts) - np.minimum.reduceat(values, starts)
    keep = (spread >= beta) & (spread > 0)
    return kids, starts[keep], ends[keep]


def step_pairs(forest: Forest, beta: float, min_visits: int) -> Pairs:
    """Sibling pairs, in order: by parent, then by sibling order of (a, b)."""
    kids, starts, ends = sibling_groups(forest, forest.visits >= min_visits, beta)
    sizes = ends - starts
    first = ranges(starts, sizes)  # each kid of a group, then every later sibling as its partner
    later = np.repeat(ends, sizes) - first - 1
    a, b = kids[np.repeat(first, later)], kids[ranges(first + 1, later)]
    va, vb = forest.value[a], forest.value[b]
    ok = (va != vb) & ~(np.abs(va - vb) < beta)
    a, b, va, vb = a[ok], b[ok], va[ok], vb[ok]
    if len(a):  # replies are encoded only for forests with candidate pairs
        differ = forest.reply_codes[a] != forest.reply_codes[b]
        a, b, va, vb = a[differ], b[differ], va[differ], vb[differ]
    a_wins = va > vb
    return Pairs(np.where(a_wins, a, b), np.where(a_wins, b, a), np.where(vb > va, vb, va), np.where(vb < va, vb, va))


def by_tree(forest: Forest, trajectories: Pairs, steps: Pairs) -> tuple[np.ndarray, Pairs]:
    """Both kinds of pairs together, per tree its trajectory pairs then its step pairs:
    (each pair's kind, as an index into KINDS; the pairs)."""
    kind = np.repeat(np.arange(2, dtype=np.int8), [len(trajectories), len(steps)])
    chosen = np.r_[trajectories.chosen, steps.chosen]
    order = np.argsort(forest.tree_of[chosen], kind="stable")
    return kind[order], Pairs(
        chosen[order],
        np.r_[trajectories.rejected, steps.rejected][order],
        np.r_[trajectories.chosen_reward, steps.chosen_reward][order],
        np.r_[trajectories.rejected_reward, steps.rejected_reward][order],
    )


def dpo_table(forest: Forest, params: DPOParams, chats: Chats | None = None) -> pa.Table | None:
    trajectories = trajectory_pairs(forest, params.max_trajectory_pairs_per_task)
    steps = step_pairs(forest, params.beta, params.min_visits)
    if not len(trajectories) and not len(steps):
        return None
    chats = chats or Chats(forest)
    kind, pairs = by_tree(forest, trajectories, steps)
    chosen, rejected, n = pairs.chosen, pairs.rejected, len(pairs)
    paths = forest.ancestors(np.r_[chosen, rejected])
    chosen_depth, rejected_depth = forest.depth[chosen], forest.depth[rejected]
    split = shared_depth(paths[:n], paths[n:], chosen_depth, rejected_depth)  # the prompt's last node
    turns = chats.turns(paths)
    tree = forest.tree_of[chosen]
    kinds = KINDS.take(pa.array(kind))
    return pa.table(
        {
            "id": forest.row_ids(chosen, kinds, "/", forest.names(chosen), "-", forest.names(rejected)),
            "kind": kinds,
            "task": forest.tasks[tree],
            "tree": forest.trees[tree],
            "prompt_node": forest.local(paths[np.arange(n), split]).astype(np.int32),
            "chosen_node": forest.local(chosen).astype(np.int32),
            "rejected_node": forest.local(rejected).astype(np.int32),
            "prompt": chats.column(chats.cut(turns[:n], np.zeros_like(split), 2 * split + 2)),
            "chosen": chats.column(chats.cut(turns[:n], 2 * split + 2, 2 * chosen_depth + 1)),
            "rejected": chats.column(chats.cut(turns[n:], 2 * split + 2, 2 * rejected_depth + 1)),
            "chosen_reward": pairs.chosen_reward.astype(np.float32),
            "rejected_reward": pairs.rejected_reward.astype(np.float32),
        },
        schema=DPO_SCHEMA,
    )
