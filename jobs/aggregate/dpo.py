"""DPO preference pairs, in TRL's format: `prompt` (the chat up to the shared prefix),
`chosen` and `rejected` (assistant-ending message lists continuing it).

trajectory (ETO-style): a successful leaf vs an evaluated failed leaf of the same task, with a
  strictly higher return. Successes ranked best first (as SFT), failures lowest return first
  (then fewest steps, lowest id); pairs taken from that grid by rank sum, up to a cap per task.
  Rewards are the paths' returns.
step (DensePolicy-style): siblings with differing replies, each with visits >= min_visits,
  whose values differ (by >= beta); chosen = the higher value. Rewards are node values.
Per tree, its trajectory pairs come first, then its step pairs.

`chosen` and `rejected` messages carry a `loss` flag: true on the assistant's turns, false on the
environment's (user) turns between them, which a trainer should not score (ETO's trainer masks
them; TRL's DPOTrainer scores every completion token). `dpo_first_turn` is the variant TRL can use
as it is: every pair cut to the first turn where its two sides part, so `chosen` and `rejected` are
one assistant message each (pairs that cut to the same two nodes, or to the same reply text, once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from thicket.aggregate.chats import LOSS_MESSAGE, MESSAGE, ChatIds, Chats
from thicket.aggregate.forest import Forest, ranges, shared_depth
from thicket.aggregate.pairs import grid_pairs
from thicket.aggregate.params import DPOParams
from thicket.aggregate.sft import successes



def pair_schema(side: pa.DataType) -> pa.Schema:
    """A pairs table whose `chosen` and `rejected` are lists of `side` messages."""
    return pa.schema(
        [
            ("id", pa.string()),
            ("kind", pa.string()),  # trajectory | step
            ("task", pa.int64()),
            ("tree", pa.int64()),
            ("prompt_node", pa.int32()),  # the last node of the shared prefix
            ("chosen_node", pa.int32()),  # the last node of each side
            ("rejected_node", pa.int32()),
            ("prompt", pa.list_(MESSAGE)),
            ("chosen", pa.list_(side)),
            ("rejected", pa.list_(side)),
            ("chosen_reward", pa.float32()),
            ("rejected_reward", pa.float32()),
        ]
    )


DPO_SCHEMA = pair_schema(LOSS_MESSAGE)  # chosen/rejected messages with a per-turn loss flag
FIRST_TURN_SCHEMA = pair_schema(MESSAGE)  # chosen/rejected: one assistant message each
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


@dataclass(frozen=True)
class PairRows:
    """Pairs laid out along their paths: per pair, its two sides' leaves and the depth of the
    prompt's last node; the message-id grid of the chosen paths, then the rejected ones."""

    kind: pa.Array
    pairs: Pairs
    split: np.ndarray
    paths: np.ndarray
    turns: np.ndarray


def pair_rows(forest: Forest, params: DPOParams, chats: Chats) -> PairRows | None:
    trajectories = trajectory_pairs(forest, params.max_trajectory_pairs_per_task)
    steps = step_pairs(forest, params.beta, params.min_visits)
    if not len(trajectories) and not len(steps):
        return None
    kind, pairs = by_tree(forest, trajectories, steps)
    n = len(pairs)
    paths = forest.ancestors(np.r_[pairs.chosen, pairs.rejected])
    split = shared_depth(paths[:n], paths[n:], forest.depth[pairs.chosen], forest.depth[pairs.rejected])
    return PairRows(KINDS.take(pa.array(kind)), pairs, split, paths, chats.turns(paths))


def dpo_tables(
    forest: Forest, params: DPOParams, chats: Chats | None = None
) -> tuple[pa.Table | None, pa.Table | None]:
    """The `dpo` and `dpo_first_turn` rows of a forest (None where it has none)."""
    chats = chats or Chats(forest)
    rows = pair_rows(forest, params, chats)
    if rows is None:
        return None, None
    return pairs_table(forest, rows, chats), first_turn_table(forest, rows, chats)


def dpo_table(forest: Forest, params: DPOParams, chats: Chats | None = None) -> pa.Table | None:
    """The `dpo` rows of a forest alone."""
    chats = chats or Chats(forest)
    rows = pair_rows(forest, params, chats)
    return None if rows is None else pairs_table(forest, rows, chats)


def _side(chats: Chats, grid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> pa.Array:
    """Messages grid[i, lo[i]:hi[i]] per row, each with its loss flag (true on assistant turns)."""
    cut: ChatIds = chats.cut(grid, lo, hi)
    return chats.column(cut, chats.is_assistant(cut.ids))


def pairs_table(forest: Forest, rows: PairRows, chats: Chats) -> pa.Table:
    pairs, split, paths, turns = rows.pairs, rows.split, rows.paths, rows.turns
    chosen, rejected, n = pairs.chosen, pairs.rejected, len(pairs)
    tree = forest.tree_of[chosen]
    return pa.table(
        {
            "id": forest.row_ids(chosen, rows.kind, "/", forest.names(chosen), "-", forest.names(rejected)),
            "kind": rows.kind,
            "task": forest.tasks[tree],
            "tree": forest.trees[tree],
            "prompt_node": forest.local(paths[np.arange(n), split]).astype(np.int32),
            "chosen_node": forest.local(chosen).astype(np.int32),
            "rejected_node": forest.local(rejected).astype(np.int32),
            "prompt": chats.column(chats.cut(turns[:n], np.zeros_like(split), 2 * split + 2)),
            "chosen": _side(chats, turns[:n], 2 * split + 2, 2 * forest.depth[chosen] + 1),
            "rejected": _side(chats, turns[n:], 2 * split + 2, 2 * forest.depth[rejected] + 1),
            "chosen_reward": pairs.chosen_reward.astype(np.float32),
            "rejected_reward": pairs.rejected_reward.astype(np.float32),
        },
        schema=DPO_SCHEMA,
    )


def first_turns(forest: Forest, rows: PairRows) -> np.ndarray:
    """The pairs kept in `dpo_first_turn`: the first of those that part at the same two nodes,
    and only where the two first replies differ."""
    n = len(rows.pairs)
    at = rows.split + 1
    chosen, rejected = rows.paths[np.arange(n), at], rows.paths[n + np.arange(n), at]
    _, first = np.unique(np.c_[chosen, rejected], axis=0, return_index=True)
    keep = np.sort(first)
    return keep[forest.reply_codes[chosen[keep]] != forest.reply_codes[rejected[keep]]]


def first_turn_table(forest: Forest, rows: PairRows, chats: Chats) -> pa.Table | None:
    keep = first_turns(forest, rows)
    if not len(keep):
        return None
    n, split = len(rows.pairs), rows.split[keep]
    chosen = rows.paths[keep, split + 1]
    rejected = rows.paths[n + keep, split + 1]
    kind, tree = rows.kind.take(pa.array(keep)), forest.tree_of[chosen]
    one = 2 * split + 2  # the grid position of the first assistant turn past the prompt
    return pa.table(
        {
            "id": forest.row_ids(chosen, kind, "/", forest.names(chosen), "-", forest.names(rejected)),
            "kind": kind,
            "task": forest.tasks[tree],
            "tree": forest.trees[tree],
            "prompt_node": forest.local(rows.paths[keep, split]).astype(np.int32),
            "chosen_node": forest.local(chosen).astype(np.int32),
            "rejected_node": forest.local(rejected).astype(np.int32),
            "prompt": chats.column(chats.cut(rows.turns[keep], np.zeros_like(split), one)),
            "chosen": chats.column(chats.cut(rows.turns[keep], one, one + 1)),
            "rejected": chats.column(chats.cut(rows.turns[n + keep], one, one + 1)),
            "chosen_reward": rows.pairs.chosen_reward[keep].astype(np.float32),
            "rejected_reward": rows.pairs.rejected_reward[keep].astype(np.float32),
        },
        schema=FIRST_TURN_SCHEMA,
    )
