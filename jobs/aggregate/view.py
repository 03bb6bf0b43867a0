"""One committed tree: a forest of one, with its task and tree id as numbers (`thicket show`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from thicket.aggregate.forest import EVALUATED, Forest, MalformedShard

__all__ = ["EVALUATED", "MalformedShard", "TreeView"]


class TreeView(Forest):
    @classmethod
    def of(cls, table: pa.Table) -> TreeView:  # type: ignore[override]
        return super().of([table])

    @property
    def task(self) -> int:
        return int(self.tasks[0])

    @property
    def tree(self) -> int:
        return int(self.trees[0])

    def children(self, node: int) -> range:
        """Rows of node's children (siblings are contiguous, in breadth-first order)."""
        lo, hi = np.searchsorted(self.parent, [node, node + 1])
        return range(int(lo), int(hi))
