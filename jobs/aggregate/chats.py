"""Chats of a forest's nodes as message ids, turned into Arrow columns with one gather.

Message ids, N nodes and K trees: [0, N) the user turn of node v (its observation as the
model saw it); [N, 2N) the assistant turn that led to v (its reply); [2N, 2N + K) tree k's
system prompt; then extra messages (revision turns). The chat the policy saw at v is the
system prompt, user(root), then per step s of v's path assistant(s), user(s).

Rows are cut out of a grid of each path's turns (see `turns`), so that any chat that runs
along a path (the chat at a node, a continuation past a shared prefix) is one slice of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from thicket.aggregate.forest import Forest

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
LOSS_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("loss", pa.bool_())])
ROLE_NAMES = ("system", "user", "assistant")
ROLES = pa.array(ROLE_NAMES)
SYSTEM, USER, ASSISTANT = range(3)


@dataclass(frozen=True)
class ChatIds:
    """Many chats as one flat array of message ids and each chat's length."""

    ids: np.ndarray
    lengths: np.ndarray

    @classmethod
    def join(cls, *parts: ChatIds) -> ChatIds:
        """Row i: parts[0]'s row i, then parts[1]'s, ... (every part has the same rows)."""
        rows = np.concatenate([np.repeat(np.arange(len(p.lengths)), p.lengths) for p in parts])
        order = np.argsort(rows, kind="stable")
        return cls(np.concatenate([p.ids for p in parts])[order], sum(p.lengths for p in parts))

    def offsets(self) -> pa.Array:
        out = np.zeros(len(self.lengths) + 1, dtype=np.int32)
        np.cumsum(self.lengths, out=out[1:])
        return pa.array(out)


@dataclass
class Chats:
    forest: Forest
    extra: dict[tuple[str, str], int] = field(default_factory=dict)
    _by_id: tuple[int, np.ndarray, pa.Array] | None = None  # (extras, role codes, contents) by message id

    def turns(self, paths: np.ndarray) -> np.ndarray:
        """Per row of `paths` (ancestors by depth, see Forest.ancestors), message ids by
        position: 2d the assistant turn of the step at depth d (at 0, the system prompt),
        2d + 1 its user turn. The chat at the node of depth D is row[:2D + 2]; the turns
        after depth S up to its reply, row[2S + 2:2D + 1]."""
        n = self.forest.size
        grid = np.empty((len(paths), 2 * paths.shape[1]), dtype=np.int64)
        grid[:, 0::2] = n + paths
        grid[:, 1::2] = paths
        grid[:, 0] = 2 * n + self.forest.tree_of[paths[:, 0]]
        return grid

    @staticmethod
    def cut(grid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> ChatIds:
        """Row i: grid[i, lo[i]:hi[i]]."""
        columns = np.arange(grid.shape[1])
        return ChatIds(grid[(columns >= lo[:, None]) & (columns < hi[:, None])], hi - lo)

    def chat(self, node: int) -> ChatIds:
        """The exact chat the policy saw at `node` (its children were sampled from it)."""
        depth = self.forest.depth[node : node + 1]
        return self.cut(self.turns(self.forest.ancestors(np.array([node]))), np.zeros_like(depth), 2 * depth + 2)

    def is_assistant(self, ids: np.ndarray) -> np.ndarray:
        n = self.forest.size
        return (ids >= n) & (ids < 2 * n)

    def add(self, role: str, content: str) -> int:
        """The id of an extra message."""
        first = 2 * self.forest.size + self.forest.n_trees
        return self.extra.setdefault((role, content), first + len(self.extra))

    def messages(self, chat: ChatIds) -> list[dict[str, str]]:
        """One chat as {role, content} dicts (for requests, not for rows)."""
        return self.column(chat).to_pylist()[0]

    def column(self, chats: ChatIds, loss: np.ndarray | None = None) -> pa.Array:
        """A list<struct<role, content[, loss]>> column, one chat per row (and a loss flag
        per message)."""
        if self._by_id is None or self._by_id[0] != len(self.extra):
            self._by_id = (len(self.extra), *self._messages())
        _, codes, contents = self._by_id
        ids = pa.array(chats.ids)
        fields, names = [ROLES.take(pa.array(codes[chats.ids])), contents.take(ids)], ["role", "content"]
        if loss is not None:
            fields.append(pa.array(loss, pa.bool_()))
            names.append("loss")
        return pa.ListArray.from_arrays(chats.offsets(), pa.StructArray.from_arrays(fields, names=names))

    def _messages(self) -> tuple[np.ndarray, pa.Array]:
        """Every message's role code and content, by id."""
        forest, n = self.forest, self.forest.size
        extras: Sequence[tuple[str, str]] = list(self.extra)
        codes = np.repeat(
            np.array([USER, ASSISTANT, SYSTEM, *(ROLE_NAMES.index(role) for role, _ in extras)], dtype=np.int8),
            [n, n, forest.n_trees, *([1] * len(extras))],
        )
        table = forest.table
        texts = pa.concat_arrays(
            [
                table.column("user_message").chunk(0).cast(pa.string()),
                table.column("reply").chunk(0).cast(pa.string()),
                table.column("system_prompt").chunk(0).take(pa.array(forest.roots)).cast(pa.string()),
                pa.array([content for _, content in extras], pa.string()),
            ]
        )
        return codes, texts
