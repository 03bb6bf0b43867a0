"""Consecutive committed trees as one set of columns, so that rows are built for many trees
with each numpy and Arrow call (their fixed cost is then shared by thousands of nodes).

Tree k holds rows starts[k]:starts[k+1] of the table, its root first, in the tree's
canonical breadth-first order: a node's id within its tree is its row there, parents come
before children, depth never decreases and siblings are contiguous. Nodes here are global
rows, `parent` included (-1 at the roots). Every dataset's rows come out tree by tree, the
same as if each tree were built alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thicket.search.tree import EVALUATED as EVALUATED_STOPS

# Leaves whose score is known (StopReason.evaluated): the episode ended or hit the depth limit.
# Leaves cut by the budget, a timeout or an error say nothing about the path's quality.
EVALUATED = tuple(sorted(stop.value for stop in EVALUATED_STOPS))
ID_COLUMNS = ("task", "tree", "node", "parent", "depth")
# Shards written before path_return was stored: the families whose reward was a running score then.
LEGACY_RUNNING_SCORE_ENVS = ("sciworld", "textworld")


class MalformedShard(ValueError):
    """A shard that is not one tree in canonical order; `index`: which of the tables."""

    def __init__(self, message: str, index: int = 0) -> None:
        super().__init__(message)
        self.index = index


def _np(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def list_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list column: row i is values[offsets[i]:offsets[i+1]]."""
    column = table.column(name).combine_chunks()
    return column.offsets.to_numpy().astype(np.int64), column.values.to_numpy(zero_copy_only=False)


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices start, start+1, ... of each range (start, length), in order."""
    out = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    out += np.arange(len(out), dtype=out.dtype)
    return out


def shared_depth(paths_a: np.ndarray, paths_b: np.ndarray, depth_a: np.ndarray, depth_b: np.ndarray) -> np.ndarray:
    """Per row, the depth of the deepest node two root-first paths of one tree share (paths
    as Forest.ancestors gives them, with the depths of their last nodes)."""
    columns = np.arange(paths_a.shape[1])
    same = (paths_a == paths_b) & (columns <= np.minimum(depth_a, depth_b)[:, None])
    return np.argmin(np.c_[same, np.zeros(len(same), dtype=bool)], axis=1) - 1


@dataclass
class Forest:
    table: pa.Table  # every column in one chunk
    starts: np.ndarray  # int64, one per tree and the total: tree k is rows starts[k]:starts[k+1]
    tasks: np.ndarray  # int64 per tree
    trees: np.ndarray  # int64 per tree
    parent: np.ndarray  # int64 global rows, -1 at the roots
    depth: np.ndarray  # int64
    reward: np.ndarray  # float64 (from float32)
    success: np.ndarray
    value: np.ndarray
    visits: np.ndarray

    @classmethod
    def of(cls, tables: Sequence[pa.Table]) -> Self:
        """The trees of `tables` (one each), checked; MalformedShard names the first bad one."""
        for index, table in enumerate(tables):
            _check_columns(table, tables[0].schema, index)
        table = pa.concat_tables(tables).combine_chunks()
        starts = np.zeros(len(tables) + 1, dtype=np.int64)
        np.cumsum([t.num_rows for t in tables], out=starts[1:])
        tree_of = np.repeat(np.arange(len(tables)), np.diff(starts))
        local_parent, depth, trees = (_np(table, name, np.int64) for name in ("parent", "depth", "tree"))
        disordered = _disordered(starts, tree_of, _np(table, "node", np.int64), local_parent, depth)
        mixed = trees != trees[starts[:-1]][tree_of]
        bad = np.flatnonzero(disordered | mixed)
        if len(bad):
            k = int(tree_of[bad[0]])
            if disordered[starts[k] : starts[k + 1]].any():
                raise MalformedShard("rows are not in canonical breadth-first order", k)
            raise MalformedShard("a shard holds one tree", k)
        parent = local_parent + starts[:-1][tree_of]
        parent[starts[:-1]] = -1
        return cls(
            table=table,
            starts=starts,
            tasks=_np(table, "task", np.int64)[starts[:-1]],
            trees=trees[starts[:-1]],
            parent=parent,
            depth=depth,
            reward=_np(table, "reward", np.float64),
            success=_np(table, "success", np.bool_),
            value=_np(table, "value", np.float64),
            visits=_np(table, "visits", np.int64),
        )

    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def n_trees(self) -> int:
        return len(self.starts) - 1

    @property
    def roots(self) -> np.ndarray:
        return self.starts[:-1]

    @cached_property
    def tree_of(self) -> np.ndarray:
        """Per node, the index of its tree."""
        return np.repeat(np.arange(self.n_trees), np.diff(self.starts))

    @cached_property
    def root_of(self) -> np.ndarray:
        return self.roots[self.tree_of]

    @cached_property
    def is_root(self) -> np.ndarray:
        return self.parent < 0

    def local(self, nodes: np.ndarray) -> np.ndarray:
        """Node ids within their trees."""
        return nodes - self.root_of[nodes]

    @cached_property
    def n_children(self) -> np.ndarray:
        return np.bincount(self.parent[~self.is_root], minlength=self.size)

    @cached_property
    def leaves(self) -> np.ndarray:
        """Nodes without children, the roots excluded."""
        return np.flatnonzero((self.n_children == 0) & ~self.is_root)

    @cached_property
    def evaluated(self) -> np.ndarray:
        """Per node: its score is known (see EVALUATED)."""
        return pc.is_in(self.table.column("stop_reason"), pa.array(EVALUATED)).to_numpy(zero_copy_only=False)

    @cached_property
    def levels(self) -> list[np.ndarray]:
        """The nodes of each depth, depth 0 (the roots) first."""
        order = np.argsort(self.depth, kind="stable")
        bounds = np.searchsorted(self.depth[order], np.arange(int(self.depth.max()) + 2))
        return [order[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]

    @cached_property
    def returns(self) -> np.ndarray:
        """Each node's path return, as its shard recorded it (RewardSemantics.path_return: the
        sum of rewards, or a running score's last value): what every dataset's reward is."""
        if "path_return" not in self.table.column_names:
            return self._legacy_returns()
        stored = self.table.column("path_return")
        out = stored.to_numpy(zero_copy_only=False).astype(np.float64)
        if stored.null_count:
            missing = np.isnan(out)
            out[missing] = self._legacy_returns()[missing]
        return out

    def _legacy_returns(self) -> np.ndarray:
        """Returns of shards older than path_return: a running score's last value for the
        families that reported one, else the sum of rewards along the path."""
        summed = self.reward.copy()
        for level in self.levels[1:]:
            summed[level] += summed[self.parent[level]]
        running = pc.is_in(self.table.column("env"), pa.array(LEGACY_RUNNING_SCORE_ENVS)).to_numpy(zero_copy_only=False)
        out = np.where(running, self.reward, summed)
        out[self.roots] = 0.0
        return out

    def ancestors(self, nodes: np.ndarray) -> np.ndarray:
        """A[i, d] = the ancestor of nodes[i] at depth d (nodes[i] itself at its depth); past
        its depth, its tree's root."""
        nodes = np.asarray(nodes, dtype=np.int64)
        depth = self.depth[nodes]
        out = np.empty((len(nodes), int(depth.max(initial=0)) + 1), dtype=np.int64)
        out[:] = self.root_of[nodes][:, None]
        node = nodes.copy()
        for d in range(out.shape[1] - 1, 0, -1):
            at = np.flatnonzero(depth >= d)
            out[at, d] = node[at]
            node[at] = self.parent[node[at]]
        return out

    def ranked(self, nodes: np.ndarray, *keys: np.ndarray) -> np.ndarray:
        """`nodes` grouped by tree (in order), each tree's sorted by keys (first key first),
        then by node id."""
        order = np.lexsort((nodes, *(k[nodes] for k in reversed(keys)), self.tree_of[nodes]))
        return nodes[order]

    def by_tree(self, nodes: np.ndarray) -> np.ndarray:
        """For nodes grouped by tree: bounds, tree k's are nodes[bounds[k]:bounds[k+1]]."""
        return np.searchsorted(self.tree_of[nodes], np.arange(self.n_trees + 1))

    @cached_property
    def reply_codes(self) -> np.ndarray:
        """Per node, a code of its reply: within a tree, equal codes, equal replies."""
        encoded = pc.dictionary_encode(self.table.column("reply"), null_encoding="encode").combine_chunks()
        return encoded.indices.to_numpy(zero_copy_only=False)

    @cached_property
    def action_codes(self) -> np.ndarray:
        """Per node, a code of its parsed action: equal codes, equal actions."""
        encoded = pc.dictionary_encode(self.table.column("action"), null_encoding="encode").combine_chunks()
        return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)

    @cached_property
    def deterministic(self) -> np.ndarray:
        """Per node, whether its tree's env declared its transitions deterministic (Env.deterministic;
        shards older than the column: not declared)."""
        if "deterministic" not in self.table.column_names:
            return np.zeros(self.size, dtype=bool)
        return pc.fill_null(self.table.column("deterministic"), False).to_numpy(zero_copy_only=False).astype(bool)

    def row_ids(self, nodes: np.ndarray, *parts: pa.Array | str) -> pa.Array:
        """Per node, "task-{task:08d}/" of its tree, then `parts` (a string, or one per node)."""
        prefixes = pa.array([f"task-{t:08d}/" for t in self.tasks.tolist()], pa.string())
        return pc.binary_join_element_wise(prefixes.take(pa.array(self.tree_of[nodes])), *parts, "")

    def names(self, nodes: np.ndarray) -> pa.Array:
        """Node ids within their trees, as strings."""
        return pc.cast(pa.array(self.local(nodes)), pa.string())


def _check_columns(table: pa.Table, schema: pa.Schema, index: int) -> None:
    if table.num_rows == 0:
        raise MalformedShard("empty shard", index)
    if not table.schema.equals(schema):
        raise MalformedShard("its columns differ from the other shards'", index)
    for name in ID_COLUMNS:
        if table.column(name).null_count:
            raise MalformedShard(f"null {name}", index)


def _disordered(
    starts: np.ndarray, tree_of: np.ndarray, node: np.ndarray, parent: np.ndarray, depth: np.ndarray
) -> np.ndarray:
    """Per row, whether it breaks its tree's canonical breadth-first order: its node id is
    its row in the tree, the root has no parent and depth 0, any other node's parent is an
    earlier row, one level up, and siblings are contiguous (parents never decrease)."""
    n = len(node)
    local = np.arange(n) - starts[:-1][tree_of]
    root = local == 0
    ok = (node == local) & np.where(root, (parent == -1) & (depth == 0), (parent >= 0) & (parent < local))
    later = ~root
    later[0] = False
    ok[1:] &= ~(later[1:] & later[:-1] & (parent[1:] < parent[:-1]))
    above = np.where(ok & ~root, parent - local, 0) + np.arange(n)  # the parent's row (where valid)
    ok &= root | (depth == depth[above] + 1)
    return ~ok
