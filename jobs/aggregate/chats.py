"""Chats of one tree as lists of message ids, turned into Arrow columns in one go.

Message ids: 0 the system message; 1 + 2v the user turn of node v (its observation);
2 + 2v the assistant turn that led to v (its reply); past 2n, extra messages (revision
turns). Building rows as id lists and gathering the texts with one `take` per column
keeps Python work per row small: a chat is a few list operations, not dicts.
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


@dataclass
class Chats:
    view: TreeView
    extra: dict[tuple[str, str], int] = field(default_factory=dict)
    _memo: dict[int, list[int]] = field(default_factory=dict)
    _cache: tuple[int, pa.Array, pa.Array] | None = None  # (extras, roles by id, contents by id)

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
        ids = pa.array(list(chain.from_iterable(chats)), pa.int64())
        offsets = pa.array(np.r_[0, np.cumsum([len(c) for c in chats])].astype(np.int32))
        roles, contents = self._by_id()
        fields = [roles.take(ids), contents.take(ids)]
        names = ["role", "content"]
        if loss is not None:
            fields.append(pa.array(list(chain.from_iterable(loss)), pa.bool_()))
            names.append("loss")
        return pa.ListArray.from_arrays(offsets, pa.StructArray.from_arrays(fields, names=names))

    def _by_id(self) -> tuple[pa.Array, pa.Array]:
        """Every message's role and content, indexed by message id."""
        if self._cache is not None and self._cache[0] == len(self.extra):
            return self._cache[1], self._cache[2]
        n = self.view.size
        texts = self.view.texts
        extra = list(self.extra)
        # sources: [system, user 0..n-1, reply 0..n-1, extras]; id -> source row
        contents = pa.concat_arrays(
            [
                texts.column("system_prompt").chunk(0).slice(0, 1).cast(pa.string()),
                texts.column("user_message").chunk(0).cast(pa.string()),
                texts.column("reply").chunk(0).cast(pa.string()),
                pa.array([c for _, c in extra], pa.string()),
            ]
        )
        source = np.empty(1 + 2 * n + len(extra), dtype=np.int64)
        source[0] = 0
        source[1 : 2 * n + 1 : 2] = 1 + np.arange(n)  # user turns
        source[2 : 2 * n + 2 : 2] = 1 + n + np.arange(n)  # assistant turns
        source[2 * n + 1 :] = np.arange(1 + 2 * n, 1 + 2 * n + len(extra))
        codes = np.empty(len(source), dtype=np.int64)
        codes[0] = 0
        codes[1 : 2 * n + 1 : 2] = 1
        codes[2 : 2 * n + 2 : 2] = 2
        codes[2 * n + 1 :] = [ROLE_NAMES.index(role) for role, _ in extra]
        by_id = (ROLES.take(pa.array(codes)), contents.take(pa.array(source)))
        self._cache = (len(extra), *by_id)
        return by_id
