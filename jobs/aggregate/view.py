"""One committed tree as numpy columns, with paths and chats rebuilt on demand.

Rows are in canonical breadth-first order: a node's id is its row, parents come
before children, depth never decreases and siblings are contiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thicket.search.tree import StopReason

# Leaves whose score is known: the episode ended or hit the depth limit. Leaves cut by the
# budget, a timeout or an error say nothing about the path's quality.
EVALUATED = (StopReason.DONE.value, StopReason.DEPTH_LIMIT.value, StopReason.DISASTER.value)

# The text columns (read with the others, or lazily through read_text).
TEXT_COLUMNS = ("system_prompt", "user_message", "reply")
# ancestors() gathers from a table of every node's path while that holds at most this many ids
ANCESTOR_TABLE_MAX = 1 << 21


class MalformedShard(ValueError):
    pass


def _np(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def list_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list column: row i is values[offsets[i]:offsets[i+1]]."""
    column = table.column(name).combine_chunks()
    return column.offsets.to_numpy().astype(np.int64), column.values.to_numpy(zero_copy_only=False)


def _canonical(parent: np.ndarray, node: np.ndarray, depth: np.ndarray) -> bool:
    n = len(parent)
    return (
        np.array_equal(node, np.arange(n))
        and parent[0] == -1
        and depth[0] == 0
        and bool(np.all((parent[1:] >= 0) & (parent[1:] < np.arange(1, n))))
        and bool(np.all(np.diff(parent[1:]) >= 0))
        and np.array_equal(depth[1:], depth[parent[1:]] + 1)
    )


@dataclass
class TreeView:
    table: pa.Table
    task: int
    tree: int
    parent: np.ndarray  # int64, -1 at the root
    depth: np.ndarray
    reward: np.ndarray  # float64 (from float32)
    success: np.ndarray
    value: np.ndarray
    visits: np.ndarray
    read_text: Callable[[], pa.Table] | None = field(default=None, repr=False)  # TEXT_COLUMNS, if not in table

    @classmethod
    def of(cls, table: pa.Table, read_text: Callable[[], pa.Table] | None = None) -> TreeView:
        if table.num_rows == 0:
            raise MalformedShard("empty shard")
        parent, depth = _np(table, "parent", np.int64), _np(table, "depth", np.int64)
        if not _canonical(parent, _np(table, "node", np.int64), depth):
            raise MalformedShard("rows are not in canonical breadth-first order")
        tree = pc.min_max(table.column("tree"))
        if tree["min"] != tree["max"]:
            raise MalformedShard("a shard holds one tree")
        return cls(
            table=table,
            task=int(table.column("task")[0].as_py()),
            tree=int(tree["min"].as_py()),
            parent=parent,
            depth=depth,
            reward=_np(table, "reward", np.float64),
            success=_np(table, "success", np.bool_),
            value=_np(table, "value", np.float64),
            visits=_np(table, "visits", np.int64),
            read_text=read_text,
        )

    @property
    def size(self) -> int:
        return len(self.parent)

    @cached_property
    def n_children(self) -> np.ndarray:
        return np.bincount(self.parent[1:], minlength=self.size)

    @cached_property
    def leaves(self) -> np.ndarray:
        """Nodes without children, the root excluded."""
        is_leaf = self.n_children == 0
        is_leaf[0] = False
        return np.flatnonzero(is_leaf)

    @cached_property
    def evaluated(self) -> np.ndarray:
        """Per node: its score is known (see EVALUATED)."""
        return pc.is_in(self.table.column("stop_reason"), pa.array(EVALUATED)).to_numpy(zero_copy_only=False)

    @cached_property
    def returns(self) -> np.ndarray:
        """Sum of rewards from the root to each node (a path's return)."""
        return self.top_down(self.reward, np.add)

    def top_down(self, values: np.ndarray, combine: np.ufunc) -> np.ndarray:
        """out[v] = combine(out[parent], values[v]), level by level (depth is sorted)."""
        out = values.copy()
        bounds = np.flatnonzero(np.diff(self.depth)) + 1
        for lo, hi in zip(bounds, [*bounds[1:], self.size]):
            out[lo:hi] = combine(out[self.parent[lo:hi]], values[lo:hi])
        return out

    def children(self, node: int) -> range:
        """Rows of node's children (siblings are contiguous, in breadth-first order)."""
        lo, hi = np.searchsorted(self.parent, [node, node + 1])
        return range(int(lo), int(hi))

    @cached_property
    def _parents(self) -> list[int]:
        return self.parent.tolist()

    def parent_of(self, node: int) -> int:
        return self._parents[node]

    def path(self, node: int) -> list[int]:
        """Node ids from the root to `node`."""
        parents = self._parents
        out = [node]
        while parents[out[-1]] >= 0:
            out.append(parents[out[-1]])
        return out[::-1]

    def ancestors(self, nodes: np.ndarray) -> np.ndarray:
        """A[i, d] = the ancestor of nodes[i] at depth d (nodes[i] itself at its depth), else 0."""
        if self.size * (int(self.depth[-1]) + 1) <= ANCESTOR_TABLE_MAX:
            return self._ancestor_table[nodes]
        depth = self.depth[nodes]
        out = np.zeros((len(nodes), int(depth.max(initial=0)) + 1), dtype=np.int64)
        rows = np.arange(len(nodes))
        node, d = np.asarray(nodes, dtype=np.int64), depth.copy()
        while True:
            live = d >= 0
            if not live.any():
                return out
            out[rows[live], d[live]] = node[live]
            node = np.where(live & (d > 0), self.parent[node], node)
            d = d - 1

    @cached_property
    def _ancestor_table(self) -> np.ndarray:
        """ancestors() of every node, built level by level (a level's nodes are contiguous)."""
        out = np.zeros((self.size, int(self.depth[-1]) + 1), dtype=np.int64)
        bounds = [0, *(np.flatnonzero(np.diff(self.depth)) + 1).tolist(), self.size]
        for d, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if d:
                out[lo:hi] = out[self.parent[lo:hi]]
            out[lo:hi, d] = np.arange(lo, hi)
        return out

    @cached_property
    def texts(self) -> pa.Table:
        source = self.read_text() if self.read_text is not None else self.table.select(list(TEXT_COLUMNS))
        return source.combine_chunks()

    @cached_property
    def message_texts(self) -> pa.Array:
        """Every message text of the tree by message id (see chats.py): the system prompt,
        then per node its user turn and its reply."""
        texts = self.texts
        n = self.size
        by_id = np.empty(1 + 2 * n, dtype=np.int64)  # rows of [system, users, replies]
        by_id[0] = 0
        by_id[1::2] = np.arange(1, n + 1)
        by_id[2::2] = np.arange(n + 1, 2 * n + 1)
        source = pa.concat_arrays(
            [
                texts.column("system_prompt").chunk(0).slice(0, 1).cast(pa.string()),
                texts.column("user_message").chunk(0).cast(pa.string()),
                texts.column("reply").chunk(0).cast(pa.string()),
            ]
        )
        return source.take(pa.array(by_id))

    @cached_property
    def reply_codes(self) -> np.ndarray:
        """Per node, a code of its reply: equal codes, equal replies."""
        encoded = pc.dictionary_encode(self.texts.column("reply"), null_encoding="encode").combine_chunks()
        return encoded.indices.to_numpy(zero_copy_only=False)


def shared_depth(a: list[int], b: list[int]) -> int:
    """Depth of the deepest common node of two root-first paths."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i - 1


def ranked(nodes: np.ndarray, *keys: np.ndarray) -> list[int]:
    """`nodes` sorted by keys (first key first), then by node id."""
    if len(nodes) == 0:
        return []
    order = np.lexsort((nodes, *(k[nodes] for k in reversed(keys))))
    return nodes[order].tolist()


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices start, start+1, ... of each range (start, length), in order."""
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)


def diagonal(n_a: int, n_b: int) -> Iterator[tuple[int, int]]:
    """Index pairs (i, j) of an n_a x n_b grid, best-ranked first: by i + j, then i."""
    for total in range(n_a + n_b - 1):
        for i in range(max(0, total - n_b + 1), min(n_a, total + 1)):
            yield i, total - i
