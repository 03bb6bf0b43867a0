"""SFT: the best successful root-to-leaf path of each task, as a chat.

Best = highest return (sum of rewards on the path), then fewest steps, then lowest node id.
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


def sft_tables(forest: Forest, params: SFTParams, chats: Chats | None = None) -> tuple[pa.Table, pa.Table] | None:
    ranked = successes(forest, params.min_reward)
    best = ranked[np.diff(forest.tree_of[ranked], prepend=-1) != 0]  # the first of each tree
    if not len(best):
        return None
    chats = chats or Chats(forest)
    depth = forest.depth[best]
    upto_reply = chats.cut(chats.turns(forest.ancestors(best)), np.zeros_like(depth), 2 * depth + 1)
    messages = chats.column(upto_reply)
    ids = forest.row_ids(best, "node-", forest.names(best))
    tree = forest.tree_of[best]
    sft = pa.table(
        {
            "id": ids,
            "task": forest.tasks[tree],
            "tree": forest.trees[tree],
            "leaf": forest.local(best).astype(np.int32),
            "reward": forest.returns[best].astype(np.float32),
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
