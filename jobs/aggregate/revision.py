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

import numpy as np
import pyarrow as pa

from thicket.aggregate.chats import LOSS_MESSAGE, ChatIds, Chats
from thicket.aggregate.forest import Forest, shared_depth
from thicket.aggregate.pairs import grid_pairs
from thicket.aggregate.params import RevisionParams
from thicket.aggregate.verifier import Judgement, Verifier

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


def candidate_pairs(forest: Forest, params: RevisionParams) -> tuple[np.ndarray, np.ndarray]:
    """(good leaves, bad leaves), grouped by tree."""
    ends = np.zeros(forest.size, dtype=bool)
    ends[forest.leaves] = True
    ends &= forest.evaluated & (forest.visits >= 1) & (forest.value[forest.root_of] > 0)
    good = forest.ranked(np.flatnonzero(ends & (forest.value > params.alpha)), -forest.value, forest.depth)
    bad = forest.ranked(np.flatnonzero(ends), forest.value, forest.depth)
    return grid_pairs(forest, good, bad, forest.value, params.max_per_task, params.beta)


def heuristic_cuts(
    forest: Forest, good: np.ndarray, bad: np.ndarray, good_depth: np.ndarray, bad_depth: np.ndarray, split: np.ndarray
) -> np.ndarray:
    """Per pair of paths (see Forest.ancestors), the depth of the last bad step kept."""
    depths = np.arange(bad.shape[1])
    good_at = good[np.arange(len(good))[:, None], np.minimum(depths, good_depth[:, None])]
    falls = (depths > split[:, None]) & (depths <= bad_depth[:, None]) & (forest.value[bad] < forest.value[good_at])
    return np.where(falls.any(axis=1), np.argmax(falls, axis=1), bad_depth)


def verifier_cuts(
    chats: Chats, verifier: Verifier, bad: np.ndarray, bad_depth: np.ndarray, split: np.ndarray
) -> np.ndarray:
    """Per bad path, the depth of its first step after `split` the verifier judges Bad (none: the leaf)."""
    judged: dict[int, Judgement] = {}  # a step's judgement depends only on its own chat
    cuts = bad_depth.copy()
    for row, (path, start, leaf_depth) in enumerate(zip(bad.tolist(), split.tolist(), bad_depth.tolist())):
        for d in range(start + 1, leaf_depth + 1):
            node = path[d]
            if node not in judged:
                judged[node] = verifier.judge(chats.messages(chats.chat(node)))
            if judged[node] is Judgement.BAD:
                cuts[row] = d
                break
    return cuts


def revised_chats(
    chats: Chats, paths: np.ndarray, thoughts: list[int], good_depth: np.ndarray, split: np.ndarray, cut: np.ndarray
) -> tuple[ChatIds, np.ndarray]:
    """Per pair (paths: the good ones, then the bad ones): the bad path's chat up to its cut,
    the revision turn and its acknowledgement, then the good path's turns past the split;
    and per message whether it is trained on (the revision turn, the good path's replies)."""
    n = len(thoughts)
    turns = chats.turns(paths)
    prefix = chats.cut(turns[n:], np.zeros_like(cut), 2 * cut + 2)
    revision = ChatIds(np.c_[thoughts, np.full(n, chats.add("user", WAIT_ACK))].ravel(), np.full(n, 2))
    suffix = chats.cut(turns[:n], 2 * split + 2, 2 * good_depth + 1)
    loss = ChatIds.join(
        ChatIds(np.zeros(len(prefix.ids), dtype=bool), prefix.lengths),
        ChatIds(np.tile([True, False], n), revision.lengths),
        ChatIds(chats.is_assistant(suffix.ids), suffix.lengths),
    )
    return ChatIds.join(prefix, revision, suffix), loss.ids


def revision_table(
    forest: Forest, params: RevisionParams, verifier: Verifier | None = None, chats: Chats | None = None
) -> pa.Table | None:
    good, bad = candidate_pairs(forest, params)
    n = len(good)
    if not n:
        return None
    chats = chats or Chats(forest)
    paths = forest.ancestors(np.r_[good, bad])
    good_depth, bad_depth = forest.depth[good], forest.depth[bad]
    split = shared_depth(paths[:n], paths[n:], good_depth, bad_depth)
    if verifier is None:
        cut = heuristic_cuts(forest, paths[:n], paths[n:], good_depth, bad_depth, split)
    else:
        cut = verifier_cuts(chats, verifier, paths[n:], bad_depth, split)
    tree = forest.tree_of[good]
    local_good, local_bad = forest.local(good), forest.local(bad)
    thoughts = [
        chats.add("assistant", f"Thought: {revision_thought(t, g, b)}\nAction: wait")
        for t, g, b in zip(forest.trees[tree].tolist(), local_good.tolist(), local_bad.tolist())
    ]
    messages, loss = revised_chats(chats, paths, thoughts, good_depth, split, cut)
    return pa.table(
        {
            "id": forest.row_ids(good, "revision/", forest.names(good), "-", forest.names(bad)),
            "task": forest.tasks[tree],
            "tree": forest.trees[tree],
            "good_leaf": local_good.astype(np.int32),
            "bad_leaf": local_bad.astype(np.int32),
            "shared_depth": split.astype(np.int32),
            "transition_node": forest.local(paths[n:][np.arange(n), cut]).astype(np.int32),
            "transition_depth": cut.astype(np.int32),
            "transition_method": ["verifier" if verifier is not None else "heuristic"] * n,
            "good_value": forest.value[good].astype(np.float32),
            "bad_value": forest.value[bad].astype(np.float32),
            "messages": chats.column(messages, loss),
        },
        schema=REVISION_SCHEMA,
    )
