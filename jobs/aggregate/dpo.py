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

from thicket.aggregate.chats import MESSAGE, Chats
from thicket.aggregate.params import DPOParams
from thicket.aggregate.sft import successes
from thicket.aggregate.view import TreeView, diagonal, ranked, shared_depth

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


def contrasting_parents(view: TreeView, eligible: np.ndarray, beta: float) -> list[int]:
    """Parents whose eligible children's values span at least beta (siblings are contiguous)."""
    kids = np.flatnonzero(eligible)
    kids = kids[kids > 0]
    if len(kids) < 2:
        return []
    parents = view.parent[kids]
    starts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]])
    values = view.value[kids]
    spread = np.maximum.reduceat(values, starts) - np.minimum.reduceat(values, starts)
    return parents[starts[(spread >= beta) & (spread > 0)]].tolist()


def step_pairs(view: TreeView, beta: float, min_visits: int) -> Iterator[Pair]:
    eligible = view.visits >= min_visits
    for parent in contrasting_parents(view, eligible, beta):
        kids = [k for k in view.children(parent) if eligible[k]]
        for x, a in enumerate(kids):
            for b in kids[x + 1 :]:
                va, vb = float(view.value[a]), float(view.value[b])
                if va == vb or abs(va - vb) < beta or view.replies[a] == view.replies[b]:
                    continue
                chosen, rejected = (a, b) if va > vb else (b, a)
                yield Pair("step", chosen, rejected, max(va, vb), min(va, vb))


def dpo_table(view: TreeView, params: DPOParams) -> pa.Table | None:
    pairs = [
        *trajectory_pairs(view, params.max_trajectory_pairs_per_task),
        *step_pairs(view, params.beta, params.min_visits),
    ]
    if not pairs:
        return None
    chats = Chats(view)
    prompt_nodes, prompts, chosen, rejected = [], [], [], []
    for p in pairs:
        if p.kind == "step":  # siblings: the prompt is their parent's chat
            split_node, good, bad = view.parent_of(p.chosen), [p.chosen], [p.rejected]
        else:
            good, bad = view.path(p.chosen), view.path(p.rejected)
            split = shared_depth(good, bad)
            split_node, good, bad = good[split], good[split + 1 :], bad[split + 1 :]
        prompt_nodes.append(split_node)
        prompts.append(chats.chat(split_node))
        chosen.append(chats.continuation(good))
        rejected.append(chats.continuation(bad))
    return pa.table(
        {
            "id": [f"task-{view.task:08d}/{p.kind}/{p.chosen}-{p.rejected}" for p in pairs],
            "kind": [p.kind for p in pairs],
            "task": np.full(len(pairs), view.task),
            "tree": np.full(len(pairs), view.tree),
            "prompt_node": prompt_nodes,
            "chosen_node": [p.chosen for p in pairs],
            "rejected_node": [p.rejected for p in pairs],
            "prompt": chats.column(prompts),
            "chosen": chats.column(chosen),
            "rejected": chats.column(rejected),
            "chosen_reward": [p.chosen_reward for p in pairs],
            "rejected_reward": [p.rejected_reward for p in pairs],
        },
        schema=DPO_SCHEMA,
    )
