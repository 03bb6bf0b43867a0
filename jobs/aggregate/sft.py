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
from thicket.aggregate.params import SFTParams
from thicket.aggregate.view import TreeView, ranked

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


def successes(view: TreeView, min_reward: float | None = None) -> list[int]:
    """Successful nodes (leaves: the episode ended), best first."""
    ok = view.success.copy()
    ok[0] = False
    if min_reward is not None:
        ok &= view.returns >= min_reward
    return ranked(np.flatnonzero(ok), -view.returns, view.depth)


def row_id(view: TreeView, leaf: int) -> str:
    return f"task-{view.task:08d}/node-{leaf}"


def sft_tables(view: TreeView, params: SFTParams, chats: Chats | None = None) -> tuple[pa.Table, pa.Table] | None:
    best = successes(view, params.min_reward)
    if not best:
        return None
    leaf = best[0]
    chats = chats or Chats(view)
    messages = chats.column([chats.upto_reply(leaf)])
    ids = [row_id(view, leaf)]
    sft = pa.table(
        {
            "id": ids,
            "task": [view.task],
            "tree": [view.tree],
            "leaf": [leaf],
            "reward": [float(view.returns[leaf])],
            "steps": [int(view.depth[leaf])],
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
