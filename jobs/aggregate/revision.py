"""Agent-R revision trajectories: a bad path cut at its transition point, a revision turn,
then the good path from where the two part.

Trees whose root value <= 0 are skipped. Paths end at evaluated leaves with visits >= 1;
good ones (value > alpha) best first, bad ones worst first (then fewest steps, lowest id);
pairs (value_good - value_bad > beta) from that grid by rank sum, up to a cap per task.

Transition point (the last bad step kept), searched after the shared prefix:
  verifier: the first step judged "Bad" (none: the bad leaf);
  heuristic: the first step whose value falls below the good path's value at the same
  depth (past the good leaf: its value); none: the bad leaf.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from thicket.aggregate.chats import LOSS_MESSAGE, Chats
from thicket.aggregate.params import RevisionParams
from thicket.aggregate.verifier import Judgement, Verifier
from thicket.aggregate.view import TreeView, diagonal, ranked, shared_depth

REVISION_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("task", pa.int64()),
        ("tree", pa.int64()),
        ("good_leaf", pa.int32()),
        ("bad_leaf", pa.int32()),
        ("shared_depth", pa.int32()),  # depth of the last node the two paths share
        ("transition_node", pa.int32()),  # the last bad node kept
        ("transition_depth", pa.int32()),
        ("transition_method", pa.string()),  # verifier | heuristic
        ("good_value", pa.float32()),
        ("bad_value", pa.float32()),
        ("messages", pa.list_(LOSS_MESSAGE)),
    ]
)

REVISION_THOUGHTS = (
    "I realize my approach was flawed. I need to revise it.",
    "I took the wrong actions. I need to rethink my approach.",
    "My previous actions were not leading to the goal. I should change course.",
    "I made a mistake in my earlier steps. Let me correct my plan.",
    "This path is not working. I need to go back to a better plan.",
)
WAIT_ACK = "ok."


def revision_thought(tree: int, good: int, bad: int) -> str:
    digest = hashlib.blake2b(f"{tree}:{good}:{bad}".encode(), digest_size=4).digest()
    return REVISION_THOUGHTS[int.from_bytes(digest, "big") % len(REVISION_THOUGHTS)]


def candidate_pairs(view: TreeView, params: RevisionParams) -> list[tuple[int, int]]:
    if view.value[0] <= 0 or params.max_per_task == 0:
        return []
    ends = np.zeros(view.size, dtype=bool)
    ends[view.leaves] = True
    ends &= view.evaluated & (view.visits >= 1)
    good = ranked(np.flatnonzero(ends & (view.value > params.alpha)), -view.value, view.depth)
    bad = ranked(np.flatnonzero(ends), view.value, view.depth)
    out: list[tuple[int, int]] = []
    for i, j in diagonal(len(good), len(bad)):
        if len(out) >= params.max_per_task:
            break
        if view.value[good[i]] - view.value[bad[j]] > params.beta:
            out.append((good[i], bad[j]))
    return out


Cut = Callable[[TreeView, list[int], list[int], int], int]


def heuristic_cut(view: TreeView, good: list[int], bad: list[int], split: int) -> int:
    for d in range(split + 1, len(bad)):
        if view.value[bad[d]] < view.value[good[min(d, len(good) - 1)]]:
            return d
    return len(bad) - 1


def verifier_cut(verifier: Verifier, chats: Chats) -> Cut:
    judged: dict[int, Judgement] = {}  # a step's judgement depends only on its own chat

    def cut(view: TreeView, good: list[int], bad: list[int], split: int) -> int:
        for d in range(split + 1, len(bad)):
            node = bad[d]
            if node not in judged:
                judged[node] = verifier.judge(chats.messages(chats.chat(node)))
            if judged[node] is Judgement.BAD:
                return d
        return len(bad) - 1

    return cut


@dataclass(frozen=True)
class Revision:
    good: int
    bad: int
    split: int
    cut: int
    cut_node: int
    messages: list[int]
    loss: list[bool]


def revise(view: TreeView, chats: Chats, good_leaf: int, bad_leaf: int, cut_at: Cut) -> Revision:
    good, bad = view.path(good_leaf), view.path(bad_leaf)
    split = shared_depth(good, bad)
    cut = cut_at(view, good, bad, split)
    prefix = chats.chat(bad[cut])
    thought = revision_thought(view.tree, good_leaf, bad_leaf)
    turn = chats.add("assistant", f"Thought: {thought}\nAction: wait")
    ack = chats.add("user", WAIT_ACK)
    suffix = chats.continuation(good[split + 1 :])
    messages = [*prefix, turn, ack, *suffix]
    loss = [False] * len(prefix) + [True, False] + [chats.is_assistant(m) for m in suffix]
    return Revision(good_leaf, bad_leaf, split, cut, bad[cut], messages, loss)


def revision_table(
    view: TreeView, params: RevisionParams, verifier: Verifier | None = None, chats: Chats | None = None
) -> pa.Table | None:
    pairs = candidate_pairs(view, params)
    if not pairs:
        return None
    chats = chats or Chats(view)
    cut_at: Cut = verifier_cut(verifier, chats) if verifier is not None else heuristic_cut
    revisions = [revise(view, chats, good, bad, cut_at) for good, bad in pairs]
    n = len(revisions)
    return pa.table(
        {
            "id": [f"task-{view.task:08d}/revision/{r.good}-{r.bad}" for r in revisions],
            "task": np.full(n, view.task),
            "tree": np.full(n, view.tree),
            "good_leaf": [r.good for r in revisions],
            "bad_leaf": [r.bad for r in revisions],
            "shared_depth": [r.split for r in revisions],
            "transition_node": [r.cut_node for r in revisions],
            "transition_depth": [r.cut for r in revisions],
            "transition_method": ["verifier" if verifier is not None else "heuristic"] * n,
            "good_value": [float(view.value[r.good]) for r in revisions],
            "bad_value": [float(view.value[r.bad]) for r in revisions],
            "messages": chats.column([r.messages for r in revisions], [r.loss for r in revisions]),
        },
        schema=REVISION_SCHEMA,
    )
