"""DPO preference pairs, in TRL's format: `prompt` (the chat up to the shared prefix),
`chosen` and `rejected` (assistant-ending message lists continuing it).

trajectory (ETO-style): a successful leaf vs an evaluated failed leaf of the same task, with a
  strictly higher return. Successes ranked best first (as SFT), failures lowest return first
  (then fewest steps, lowest id); pairs taken from that grid by rank sum, up to a cap per task.
  Rewards are the paths' returns.
step (DensePolicy-style): siblings with differing replies, each with visits >= min_visits,
  whose values differ (by >= beta); chosen = the higher value. Rewards are node values.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from thicket.aggregate.chats import MESSAGE, ChatIds, Chats, assistant, chat_ids
from thicket.aggregate.params import DPOParams
from thicket.aggregate.sft import successes
from thicket.aggregate.view import TreeView, diagonal, ranked, ranges, shared_depth

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


@dataclass(frozen=True)
class Pair:
    kind: str
    chosen: int
    rejected: int
    chosen_reward: float
    rejected_reward: float


@dataclass(frozen=True)
class StepPairs:
    """Sibling pairs as columns, in order: by parent, then by sibling order of (a, b)."""

    chosen: np.ndarray
    rejected: np.ndarray
    chosen_reward: np.ndarray  # node values
    rejected_reward: np.ndarray

    def __len__(self) -> int:
        return len(self.chosen)


def failures(view: TreeView) -> list[int]:
    """Evaluated leaves that did not succeed, lowest return first."""
    failed = np.zeros(view.size, dtype=bool)
    failed[view.leaves] = True
    failed &= view.evaluated & ~view.success
    return ranked(np.flatnonzero(failed), view.returns, view.depth)


def trajectory_pairs(view: TreeView, cap: int) -> Iterator[Pair]:
    good, bad = successes(view), failures(view)
    made = 0
    for i, j in diagonal(len(good), len(bad)):
        if made >= cap:
            return
        r_good, r_bad = float(view.returns[good[i]]), float(view.returns[bad[j]])
        if r_good > r_bad:
            made += 1
            yield Pair("trajectory", good[i], bad[j], r_good, r_bad)


def sibling_groups(view: TreeView, eligible: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eligible children (ascending) and, per group of siblings, its start and end among them;
    only the groups whose values span at least beta (siblings are contiguous)."""
    kids = np.flatnonzero(eligible)
    kids = kids[kids > 0]
    none = np.zeros(0, dtype=np.int64)
    if len(kids) < 2:
        return kids, none, none
    parents = view.parent[kids]
    starts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]])
    ends = np.r_[starts[1:], len(kids)]
    values = view.value[kids]
    spread = np.maximum.reduceat(values, starts) - np.minimum.reduceat(values, starts)
    keep = (spread >= beta) & (spread > 0)
    return kids, starts[keep], ends[keep]


def step_pairs(view: TreeView, beta: float, min_visits: int) -> StepPairs:
    kids, starts, ends = sibling_groups(view, view.visits >= min_visits, beta)
    sizes = ends - starts
    first = ranges(starts, sizes)  # each kid of a group, then every later sibling as its partner
    later = np.repeat(ends, sizes) - first - 1
    a, b = kids[np.repeat(first, later)], kids[ranges(first + 1, later)]
    va, vb = view.value[a], view.value[b]
    ok = (va != vb) & ~(np.abs(va - vb) < beta)
    a, b, va, vb = a[ok], b[ok], va[ok], vb[ok]
    if len(a):  # replies are decoded only for trees with candidate pairs
        differ = view.reply_codes[a] != view.reply_codes[b]
        a, b, va, vb = a[differ], b[differ], va[differ], vb[differ]
    a_wins = va > vb
    return StepPairs(
        np.where(a_wins, a, b), np.where(a_wins, b, a), np.where(vb > va, vb, va), np.where(vb < va, vb, va)
    )


def dpo_table(view: TreeView, params: DPOParams, chats: Chats | None = None) -> pa.Table | None:
    trajectories = list(trajectory_pairs(view, params.max_trajectory_pairs_per_task))
    steps = step_pairs(view, params.beta, params.min_visits)
    if not trajectories and not len(steps):
        return None
    chats = chats or Chats(view)
    split_nodes, chosen, rejected = [], [], []
    for p in trajectories:
        good, bad = view.path(p.chosen), view.path(p.rejected)
        split = shared_depth(good, bad)
        split_nodes.append(good[split])
        chosen.append(chats.continuation(good[split + 1 :]))
        rejected.append(chats.continuation(bad[split + 1 :]))
    # siblings: the prompt is their parent's chat, each side one assistant turn
    one_turn = np.ones(len(steps), dtype=np.int64)
    chosen_chats = ChatIds.concat([ChatIds.of(chosen), ChatIds(assistant(steps.chosen), one_turn)])
    rejected_chats = ChatIds.concat([ChatIds.of(rejected), ChatIds(assistant(steps.rejected), one_turn)])
    prompt_nodes = np.r_[np.array(split_nodes, dtype=np.int64), view.parent[steps.chosen]]
    chosen_nodes = np.r_[np.array([p.chosen for p in trajectories], dtype=np.int64), steps.chosen]
    rejected_nodes = np.r_[np.array([p.rejected for p in trajectories], dtype=np.int64), steps.rejected]
    kinds = ["trajectory"] * len(trajectories) + ["step"] * len(steps)
    prefix = f"task-{view.task:08d}/"
    n = len(kinds)
    return pa.table(
        {
            "id": [f"{prefix}{k}/{c}-{r}" for k, c, r in zip(kinds, chosen_nodes.tolist(), rejected_nodes.tolist())],
            "kind": kinds,
            "task": np.full(n, view.task),
            "tree": np.full(n, view.tree),
            "prompt_node": prompt_nodes.astype(np.int32),
            "chosen_node": chosen_nodes.astype(np.int32),
            "rejected_node": rejected_nodes.astype(np.int32),
            "prompt": chats.column_of(chat_ids(view, prompt_nodes)),
            "chosen": chats.column_of(chosen_chats),
            "rejected": chats.column_of(rejected_chats),
            "chosen_reward": np.r_[[p.chosen_reward for p in trajectories], steps.chosen_reward].astype(np.float32),
            "rejected_reward": np.r_[[p.rejected_reward for p in trajectories], steps.rejected_reward].astype(np.float32),
        },
        schema=DPO_SCHEMA,
    )
