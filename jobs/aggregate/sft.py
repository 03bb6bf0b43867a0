"""SFT: successful root-to-leaf paths of each task, as chats.

Best = highest return (the path's return by the env's reward semantics), then fewest steps,
then lowest node id. SFTParams.rows picks the paths: `best`, the best one per task; `distinct`,
per task the best of each distinct action sequence that succeeded (paths are distinct when their
parsed actions differ at some step, or they differ in length; replies differing only in their
thoughts are one sequence). A task's rows come best first.
Rows: TRL conversational `messages` (the exact chat the policy saw + the final assistant
turn) and the same chat in FastChat's `conversations` layout.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thicket.aggregate.chats import MESSAGE, ROLES, Chats
from thicket.aggregate.forest import Forest
from thicket.aggregate.params import SFTParams

SFT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("task", pa.int64()),
        ("tree", pa.int64()),
        ("leaf", pa.int32()),
        ("reward", pa.float32()),
        ("steps", pa.int32()),
        ("messages", pa.list_(MESSAGE)),
    ]
)
TURN = pa.struct([("from", pa.string()), ("value", pa.string())])
FASTCHAT_ROLES = pa.array(["system", "human", "gpt"])  # by ROLES
FASTCHAT_SCHEMA = pa.schema([("id", pa.string()), ("conversations", pa.list_(TURN))])


def successes(forest: Forest, min_reward: float | None = None) -> np.ndarray:
    """Successful nodes (leaves: the episode ended), grouped by tree, each tree's best first."""
    ok = forest.success & ~forest.is_root
    if min_reward is not None:
        ok &= forest.returns >= min_reward
    return forest.ranked(np.flatnonzero(ok), -forest.returns, forest.depth)


def first_per_tree(forest: Forest, ranked: np.ndarray) -> np.ndarray:
    return ranked[np.diff(forest.tree_of[ranked], prepend=-1) != 0]


def first_per_action_path(forest: Forest, ranked: np.ndarray) -> np.ndarray:
    """Of nodes grouped by tree, the first of each (tree, action sequence from the root), in order."""
    if not len(ranked):
        return ranked
    paths = forest.action_codes[forest.ancestors(ranked)]
    depth = forest.depth[ranked]
    paths[np.arange(paths.shape[1])[None, :] > depth[:, None]] = -1
    _, first = np.unique(np.column_stack([forest.tree_of[ranked], depth, paths]), axis=0, return_index=True)
    return ranked[np.sort(first)]


def selected(forest: Forest, params: SFTParams) -> np.ndarray:
    """The successful nodes whose paths make SFT rows, grouped by tree, each tree's best first."""
    ranked = successes(forest, params.min_reward)
    return first_per_tree(forest, ranked) if params.rows == "best" else first_per_action_path(forest, ranked)


def sft_tables(forest: Forest, params: SFTParams, chats: Chats | None = None) -> tuple[pa.Table, pa.Table] | None:
    leaves = selected(forest, params)
    if not len(leaves):
        return None
    chats = chats or Chats(forest)
    depth = forest.depth[leaves]
    upto_reply = chats.cut(chats.turns(forest.ancestors(leaves)), np.zeros_like(depth), 2 * depth + 1)
    messages = chats.column(upto_reply)
    ids = forest.row_ids(leaves, "node-", forest.names(leaves))
    tree = forest.tree_of[leaves]
    sft = pa.table(
        {
            "id": ids,
            "task": forest.tasks[tree],
            "tree": forest.trees[tree],
            "leaf": forest.local(leaves).astype(np.int32),
            "reward": forest.returns[leaves].astype(np.float32),
            "steps": depth.astype(np.int32),
            "messages": messages,
        },
        schema=SFT_SCHEMA,
    )
    return sft, pa.table({"id": ids, "conversations": fastchat(messages)}, schema=FASTCHAT_SCHEMA)


def fastchat(messages: pa.ListArray) -> pa.ListArray:
    flat = messages.flatten()
    roles = FASTCHAT_ROLES.take(pc.index_in(flat.field("role"), ROLES))
    turns = pa.StructArray.from_arrays([roles, flat.field("content")], fields=list(TURN))
    return pa.ListArray.from_arrays(messages.offsets, turns)
