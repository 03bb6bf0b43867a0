"""Chats of one tree as lists of message ids, turned into Arrow columns in one go.

Message ids: 0 the system message; 1 + 2v the user turn of node v (its observation);
2 + 2v the assistant turn that led to v (its reply); past 2n, extra messages (revision
turns). Rows are built as id arrays (numpy for many chats at once, lists for a few),
and a column's texts are gathered with one `take` from the tree's message texts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import pyarrow as pa

from thicket.aggregate.view import TreeView

SYSTEM = 0
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
LOSS_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("loss", pa.bool_())])
ROLE_NAMES = ("system", "user", "assistant")
ROLES = pa.array(ROLE_NAMES)


def user(node: int) -> int:
    return 1 + 2 * node


def assistant(node: int) -> int:
    return 2 + 2 * node


@dataclass(frozen=True)
class ChatIds:
    """Many chats as one flat array of message ids and each chat's length."""

    ids: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, chats: list[list[int]]) -> ChatIds:
        lengths = np.fromiter(map(len, chats), np.int64, len(chats))
        return cls(np.fromiter(chain.from_iterable(chats), np.int64, int(lengths.sum())), lengths)

    @classmethod
    def concat(cls, parts: list[ChatIds]) -> ChatIds:
        return cls(np.concatenate([p.ids for p in parts]), np.concatenate([p.lengths for p in parts]))


def chat_ids(view: TreeView, nodes: np.ndarray) -> ChatIds:
    """The chat the policy saw at each of `nodes`: system, user(root), then per step of the
    path assistant(step), user(step)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    lengths = 2 + 2 * view.depth[nodes]
    steps = view.ancestors(nodes)[:, 1:]
    grid = np.empty((len(nodes), 2 + 2 * steps.shape[1]), dtype=np.int64)
    grid[:, 0] = SYSTEM
    grid[:, 1] = user(0)
    grid[:, 2::2] = 2 + 2 * steps
    grid[:, 3::2] = 1 + 2 * steps
    return ChatIds(grid[np.arange(grid.shape[1]) < lengths[:, None]], lengths)


@dataclass
class Chats:
    view: TreeView
    extra: dict[tuple[str, str], int] = field(default_factory=dict)
    _memo: dict[int, list[int]] = field(default_factory=dict)
    _by_id: tuple[int, pa.Array, pa.Array] | None = None  # (extras, roles, contents) by message id

    def chat(self, node: int) -> list[int]:
        """The exact chat the policy saw at `node` (its children were sampled from it)."""
        memo = self._memo
        if not memo:
            memo[0] = [SYSTEM, user(0)]
        missing = []
        while node not in memo:
            missing.append(node)
            node = self.view.parent_of(node)
        for step in reversed(missing):
            memo[step] = [*memo[node], assistant(step), user(step)]
            node = step
        return memo[node]

    def upto_reply(self, node: int) -> list[int]:
        """The chat that ends on the reply leading to `node` (without its observation)."""
        return [*self.chat(self.view.parent_of(node)), assistant(node)]

    @staticmethod
    def continuation(path: list[int]) -> list[int]:
        """Turns for consecutive steps `path`, ending on the last assistant turn."""
        out: list[int] = []
        for step in path:
            out += (assistant(step), user(step))
        return out[:-1]

    def is_assistant(self, message: int) -> bool:
        return 0 < message <= 2 * self.view.size and message % 2 == 0

    def messages(self, chat: list[int]) -> list[dict[str, str]]:
        """One chat as {role, content} dicts (for requests, not for rows)."""
        return self.column([chat]).to_pylist()[0]

    def add(self, role: str, content: str) -> int:
        """The id of an extra message."""
        return self.extra.setdefault((role, content), 1 + 2 * self.view.size + len(self.extra))

    def column(self, chats: list[list[int]], loss: list[list[bool]] | None = None) -> pa.Array:
        """A list<struct<role, content[, loss]>> column, one chat per row."""
        flags = None if loss is None else np.fromiter(chain.from_iterable(loss), np.bool_)
        return self.column_of(ChatIds.of(chats), flags)

    def column_of(self, chats: ChatIds, loss: np.ndarray | None = None) -> pa.Array:
        """As column(), from id arrays (and a loss flag per message)."""
        roles, contents = self._gather(chats.ids)
        fields, names = [roles, contents], ["role", "content"]
        if loss is not None:
            fields.append(pa.array(loss, pa.bool_()))
            names.append("loss")
        offsets = np.zeros(len(chats.lengths) + 1, dtype=np.int32)
        np.cumsum(chats.lengths, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.StructArray.from_arrays(fields, names=names))

    def _gather(self, ids: np.ndarray) -> tuple[pa.Array, pa.Array]:
        """Each message's role and content, in order."""
        if self._by_id is None or self._by_id[0] != len(self.extra):
            self._by_id = (len(self.extra), *self._messages())
        rows = pa.array(ids)
        return self._by_id[1].take(rows), self._by_id[2].take(rows)

    def _messages(self) -> tuple[pa.Array, pa.Array]:
        """Every message's role and content, by id."""
        ids = np.arange(1 + 2 * self.view.size)
        codes = np.where(ids == SYSTEM, ROLE_NAMES.index("system"), 2 - (ids & 1))  # odd: user, even: assistant
        texts = self.view.message_texts
        if self.extra:
            extras = list(self.extra)
            codes = np.r_[codes, [ROLE_NAMES.index(role) for role, _ in extras]]
            texts = pa.concat_arrays([texts, pa.array([c for _, c in extras], pa.string())])
        return ROLES.take(pa.array(codes)), texts
