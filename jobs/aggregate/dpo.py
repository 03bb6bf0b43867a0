"""DPO preference pairs, in TRL's format: `prompt` (the chat up to the shared prefix),
`chosen` and `rejected` (assistant-ending message lists continuing it).

trajectory (ETO-style): a successful leaf vs an evaluated failed leaf of the same task, with a
  strictly higher return. Successes ranked best first (as SFT), failures lowest return first
  (then fewest steps, lowest id); pairs taken from that grid by rank sum, up to a cap per task.
  Rewards are the paths' returns (Forest.returns: the env's reward semantics).
step (DensePolicy-style): two sibling steps, each evaluated (visits >= min_visits, at least 1:
  leaves the budget, a timeout or an error cut carry no value), whose values differ by >= beta
  (and > 0); chosen = the higher value. Rewards are the two steps' values. Siblings with the same
  reply are one step (Steps: a search without dedupe samples a step again and again), its value
  pooled over them. Two steps with the same parsed action (their thoughts differ) make no pair,
  unless thought_pairs is set and the env is deterministic (see same_action.py).
Per tree, its trajectory pairs come first, then its step pairs.

`chosen` and `rejected` messages carry a `loss` flag: true on the assistant's turns, false on the
environment's (user) turns between them, which a trainer should not score (ETO's trainer masks
them; TRL's DPOTrainer scores every completion token).

`dpo_first_turn` holds step-level preferences, the variant TRL can use as it is: `chosen` and
`rejected` are one assistant message each, two sibling steps. Its pairs are the steps where the
`dpo` pairs part, each pair of steps once whatever its order in them, kept where the two steps'
own values make a step pair (the gap, the visits, differing replies; actions as above): the
preference rests on the steps' values, never on the order of the pair it came from, and its
rewards are those values.

Both datasets hold no prompt with A over B and B over A (see content.PairKeys: across the
whole sweep, contradicting rows are dropped and repeated ones kept once, by the driver).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from thicket.aggregate.chats import LOSS_MESSAGE, MESSAGE, ChatIds, Chats
from thicket.aggregate.content import ContentKeys, PairKeys
from thicket.aggregate.forest import Forest, ranges, shared_depth
from thicket.aggregate.pairs import grid_pairs
from thicket.aggregate.params import DPOParams
from thicket.aggregate.same_action import screen
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
GAP_TOLERANCE = 1e-9  # pooled values are means: a gap of exactly beta must not fall to rounding


@dataclass(frozen=True)
class Pairs:
    """Preference pairs as columns."""

    chosen: np.ndarray
    rejected: np.ndarray
    chosen_reward: np.ndarray
    rejected_reward: np.ndarray

    def __len__(self) -> int:
        return len(self.chosen)

    @classmethod
    def none(cls) -> Pairs:
        nodes, rewards = np.zeros(0, dtype=np.int64), np.zeros(0)
        return cls(nodes, nodes, rewards, rewards)

    def take(self, rows: np.ndarray) -> Pairs:
        return Pairs(self.chosen[rows], self.rejected[rows], self.chosen_reward[rows], self.rejected_reward[rows])


def failures(forest: Forest) -> np.ndarray:
    """Evaluated leaves that did not succeed, grouped by tree, each tree's lowest return first."""
    failed = np.zeros(forest.size, dtype=bool)
    failed[forest.leaves] = True
    failed &= forest.evaluated & ~forest.success
    return forest.ranked(np.flatnonzero(failed), forest.returns, forest.depth)


def trajectory_pairs(forest: Forest, cap: int) -> Pairs:
    won = successes(forest)
    won = won[forest.evaluated[won]]
    good, bad = grid_pairs(forest, won, failures(forest), forest.returns, cap)
    return Pairs(good, bad, forest.returns[good], forest.returns[bad])


@dataclass(frozen=True)
class Steps:
    """Sibling nodes whose replies are the same text are one step: a search without dedupe (as
    `sample`) keeps such duplicates, each an independent sample of that step's outcome. Per node,
    the first node of its step (`first`), and at that node the step's visits and value pooled
    over its nodes, weighted by their visits (for MCTS: the mean of all their evaluated leaves)."""

    first: np.ndarray
    visits: np.ndarray
    value: np.ndarray

    @classmethod
    def of(cls, forest: Forest) -> Steps:
        n = forest.size
        parent = np.where(forest.is_root, -1 - np.arange(n), forest.parent)  # a root is a step of its own
        codes = forest.reply_codes
        order = np.lexsort((np.arange(n), codes, parent))
        starts = np.r_[True, (parent[order][1:] != parent[order][:-1]) | (codes[order][1:] != codes[order][:-1])]
        first = np.empty(n, dtype=np.int64)
        first[order] = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
        visits = np.bincount(first, weights=forest.visits, minlength=n)
        weighted = np.bincount(first, weights=forest.value * forest.visits, minlength=n)
        value = np.where(visits > 0, weighted / np.maximum(visits, 1), forest.value)
        return cls(first, visits.astype(np.int64), value)


def sibling_groups(forest: Forest, eligible: np.ndarray, values: np.ndarray,
                   beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eligible children (ascending) and, per group of siblings, its start and end among them;
    only the groups whose values span at least beta (siblings are contiguous)."""
    kids = np.flatnonzero(eligible & ~forest.is_root)
    none = np.zeros(0, dtype=np.int64)
    if len(kids) < 2:
        return kids, none, none
    parents = forest.parent[kids]
    starts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]])
    ends = np.r_[starts[1:], len(kids)]
    spread = np.maximum.reduceat(values[kids], starts) - np.minimum.reduceat(values[kids], starts)
    keep = (spread >= beta) & (spread > 0)
    return kids, starts[keep], ends[keep]


def step_pairs(forest: Forest, beta: float, min_visits: int, thought_pairs: bool = False,
               tally: Counter[str] | None = None) -> Pairs:
    """Pairs of sibling steps, in order: by parent, then by sibling order of (a, b). A step's
    values pooled over its duplicates span no more than its nodes' own values, so a forest
    whose siblings' values never span beta needs no pooling (nor its replies encoded)."""
    if not len(sibling_groups(forest, forest.visits >= 1, forest.value, beta)[1]):
        return Pairs.none()
    steps = Steps.of(forest)
    own = steps.first == np.arange(forest.size)
    kids, starts, ends = sibling_groups(forest, own & (steps.visits >= max(min_visits, 1)), steps.value, beta)
    sizes = ends - starts
    first = ranges(starts, sizes)  # each kid of a group, then every later sibling as its partner
    later = np.repeat(ends, sizes) - first - 1
    pairs = oriented(steps, kids[np.repeat(first, later)], kids[ranges(first + 1, later)], beta, min_visits)[0]
    return pairs.take(screen(forest, pairs.chosen, pairs.rejected, thought_pairs, tally, "dpo"))


def oriented(steps: Steps, a: np.ndarray, b: np.ndarray, beta: float, min_visits: int) -> tuple[Pairs, np.ndarray]:
    """The sibling steps (a, b) (first nodes of their steps) that make a step pair: two steps,
    both evaluated, pooled values apart by >= beta and > 0; each with the higher value as
    chosen, in the given order; and which of the (a, b) they are."""
    va, vb = steps.value[a], steps.value[b]
    evaluated = (steps.visits[a] >= max(min_visits, 1)) & (steps.visits[b] >= max(min_visits, 1))
    kept = np.flatnonzero(evaluated & (a != b) & (va != vb) & (np.abs(va - vb) >= beta - GAP_TOLERANCE))
    a, b, va, vb = a[kept], b[kept], va[kept], vb[kept]
    a_wins = va > vb
    pairs = Pairs(np.where(a_wins, a, b), np.where(a_wins, b, a), np.maximum(va, vb), np.minimum(va, vb))
    return pairs, kept


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


def pair_rows(forest: Forest, params: DPOParams, chats: Chats, tally: Counter[str] | None = None) -> PairRows | None:
    trajectories = trajectory_pairs(forest, params.max_trajectory_pairs_per_task)
    steps = step_pairs(forest, params.beta, params.min_visits, params.thought_pairs, tally)
    if not len(trajectories) and not len(steps):
        return None
    kind, pairs = by_tree(forest, trajectories, steps)
    n = len(pairs)
    paths = forest.ancestors(np.r_[pairs.chosen, pairs.rejected])
    split = shared_depth(paths[:n], paths[n:], forest.depth[pairs.chosen], forest.depth[pairs.rejected])
    return PairRows(KINDS.take(pa.array(kind)), pairs, split, paths, chats.turns(paths))


@dataclass(frozen=True)
class PreferenceRows:
    """A preference dataset's rows of a forest, and their content keys (the driver drops the
    rows that contradict or repeat others, across the whole sweep)."""

    table: pa.Table
    keys: PairKeys


def dpo_tables(
    forest: Forest, params: DPOParams, chats: Chats | None = None, keys: ContentKeys | None = None,
    tally: Counter[str] | None = None,
) -> tuple[PreferenceRows | None, PreferenceRows | None]:
    """The `dpo` and `dpo_first_turn` rows of a forest (None where it has none); same-action step
    pairs counted in `tally` (see same_action.screen)."""
    chats = chats or Chats(forest)
    rows = pair_rows(forest, params, chats, tally)
    if rows is None:
        return None, None
    keys = keys or ContentKeys.of(forest)
    full = PreferenceRows(pairs_table(forest, rows, chats), PairKeys.of(keys, rows.pairs.chosen, rows.pairs.rejected))
    kind, steps = first_turn_pairs(forest, rows, params, tally)
    if not len(steps):
        return full, None
    first = PreferenceRows(first_turn_table(forest, kind, steps, chats), PairKeys.of(keys, steps.chosen, steps.rejected))
    return full, first


def dpo_table(forest: Forest, params: DPOParams, chats: Chats | None = None) -> pa.Table | None:
    """The `dpo` rows of a forest alone (before the sweep-wide drop of contradicting rows)."""
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


def first_turn_pairs(forest: Forest, rows: PairRows, params: DPOParams,
                     tally: Counter[str] | None = None) -> tuple[pa.Array, Pairs]:
    """The step pairs where the `dpo` pairs part, in the order of the first pair that parts
    there: each pair of sibling steps once, oriented by the steps' own values, kept where
    they make a step pair; (the kind of that first pair, the pairs)."""
    n = len(rows.pairs)
    at = rows.split + 1
    steps = Steps.of(forest)
    a, b = steps.first[rows.paths[np.arange(n), at]], steps.first[rows.paths[n + np.arange(n), at]]
    low, high = np.minimum(a, b), np.maximum(a, b)
    _, first = np.unique(np.c_[low, high], axis=0, return_index=True)
    first = np.sort(first)
    pairs, kept = oriented(steps, low[first], high[first], params.beta, params.min_visits)
    keep = screen(forest, pairs.chosen, pairs.rejected, params.thought_pairs, tally, "dpo_first_turn")
    return rows.kind.take(pa.array(first[kept][keep])), pairs.take(keep)


def first_turn_table(forest: Forest, kind: pa.Array, pairs: Pairs, chats: Chats) -> pa.Table:
    n = len(pairs)
    paths = forest.ancestors(np.r_[pairs.chosen, pairs.rejected])
    turns = chats.turns(paths)
    one = 2 * forest.depth[pairs.chosen]  # the grid position of the two steps' replies
    tree = forest.tree_of[pairs.chosen]
    return pa.table(
        {
            "id": forest.row_ids(pairs.chosen, kind, "/", forest.names(pairs.chosen), "-",
                                 forest.names(pairs.rejected)),
            "kind": kind,
            "task": forest.tasks[tree],
            "tree": forest.trees[tree],
            "prompt_node": forest.local(forest.parent[pairs.chosen]).astype(np.int32),
            "chosen_node": forest.local(pairs.chosen).astype(np.int32),
            "rejected_node": forest.local(pairs.rejected).astype(np.int32),
            "prompt": chats.column(chats.cut(turns[:n], np.zeros_like(one), one)),
            "chosen": chats.column(chats.cut(turns[:n], one, one + 1)),
            "rejected": chats.column(chats.cut(turns[n:], one, one + 1)),
            "chosen_reward": pairs.chosen_reward.astype(np.float32),
            "rejected_reward": pairs.rejected_reward.astype(np.float32),
        },
        schema=FIRST_TURN_SCHEMA,
    )
