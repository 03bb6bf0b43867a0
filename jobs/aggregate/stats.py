"""Sweep statistics, accumulated one tree at a time in bounded memory."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thicket.aggregate.view import TreeView


def log2_bucket(value: int) -> int:
    """The power of two a positive count falls under (0 stays 0): 1, 2, 4, 8, ..."""
    return 0 if value <= 0 else 1 << (int(value) - 1).bit_length()


@dataclass
class SweepStats:
    tasks: set[int] = field(default_factory=set)
    trees: int = 0
    nodes: int = 0
    solved_trees: int = 0
    success_leaves: int = 0
    leaves: int = 0
    generated_tokens: int = 0
    solved_tree_tokens: int = 0
    prompt_tokens_known: int = 0  # prompt tokens of requests whose cached share is known
    cached_tokens: int = 0
    depth: Counter[int] = field(default_factory=Counter)  # nodes per depth
    leaf_depth: Counter[int] = field(default_factory=Counter)
    branching: Counter[int] = field(default_factory=Counter)  # expanded nodes per child count
    tokens_per_success: Counter[int] = field(default_factory=Counter)  # solved trees per log2 bucket
    stop_reasons: Counter[str] = field(default_factory=Counter)  # of leaves
    envs: Counter[str] = field(default_factory=Counter)
    algorithms: Counter[str] = field(default_factory=Counter)
    # What the datasets' row counts don't say:
    dpo_kinds: Counter[str] = field(default_factory=Counter)
    revision_methods: Counter[str] = field(default_factory=Counter)
    tokens_skipped: Counter[str] = field(default_factory=Counter)

    def add(self, view: TreeView) -> None:
        t = view.table
        self.tasks.add(view.task)
        self.trees += 1
        self.nodes += view.size
        self.envs[t.column("env")[0].as_py()] += 1
        self.algorithms[t.column("algorithm")[0].as_py()] += 1
        self.depth.update(_counts(view.depth))
        self.leaf_depth.update(_counts(view.depth[view.leaves]))
        self.branching.update(_counts(view.n_children[view.n_children > 0]))
        self.leaves += len(view.leaves)
        solved_leaves = int(view.success[1:].sum())
        self.success_leaves += solved_leaves
        tokens = _total_length(t.column("token_ids"))
        self.generated_tokens += tokens
        if solved_leaves:
            self.solved_trees += 1
            self.solved_tree_tokens += tokens
            self.tokens_per_success[log2_bucket(tokens)] += 1
        known = pc.is_valid(t.column("cached_tokens"))
        self.prompt_tokens_known += int(pc.sum(pc.filter(t.column("prompt_tokens"), known)).as_py() or 0)
        self.cached_tokens += int(pc.sum(t.column("cached_tokens")).as_py() or 0)
        self.stop_reasons.update(_counts_of(t.column("stop_reason").take(view.leaves)))

    def merge(self, other: SweepStats) -> None:
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, set):
                mine |= theirs
            elif isinstance(mine, Counter):
                mine.update(theirs)
            else:
                setattr(self, f.name, mine + theirs)

    def to_json(self, datasets: dict[str, int]) -> dict[str, object]:
        return {
            "tasks": len(self.tasks),
            "trees": self.trees,
            "nodes": self.nodes,
            "leaves": self.leaves,
            "solved_trees": self.solved_trees,
            "success_rate": self.solved_trees / self.trees if self.trees else None,
            "success_leaves": self.success_leaves,
            "generated_tokens": self.generated_tokens,
            "tokens_per_success": (
                self.solved_tree_tokens / self.solved_trees if self.solved_trees and self.generated_tokens else None
            ),
            "cached_token_share": self.cached_tokens / self.prompt_tokens_known if self.prompt_tokens_known else None,
            "depth_histogram": _pairs(self.depth),
            "leaf_depth_histogram": _pairs(self.leaf_depth),
            "branching_histogram": _pairs(self.branching),
            "tokens_per_success_histogram": _pairs(self.tokens_per_success),
            "stop_reasons": dict(sorted(self.stop_reasons.items())),
            "envs": dict(sorted(self.envs.items())),
            "algorithms": dict(sorted(self.algorithms.items())),
            "datasets": dict(sorted(datasets.items())),
            "dpo_pairs": {kind: self.dpo_kinds[kind] for kind in ("step", "trajectory")},
            "revision_methods": dict(sorted(self.revision_methods.items())),
            "tokens_skipped": {why: self.tokens_skipped[why] for why in ("no_token_ids", "not_append_only")},
        }


def _counts(values: np.ndarray) -> dict[int, int]:
    if len(values) == 0:
        return {}
    counts = np.bincount(values)
    return {int(k): int(counts[k]) for k in np.flatnonzero(counts)}


def _total_length(lists: pa.ChunkedArray) -> int:
    """Sum of the lists' lengths (nulls count 0)."""
    if lists.null_count or lists.num_chunks != 1:
        return int(pc.sum(pc.list_value_length(lists)).as_py() or 0)
    offsets = lists.chunk(0).offsets
    return offsets[len(offsets) - 1].as_py() - offsets[0].as_py()


def _counts_of(values) -> dict[str, int]:
    return {item["values"]: item["counts"] for item in pc.value_counts(values).to_pylist()}


def _pairs(counter: Counter[int]) -> list[list[int]]:
    """A histogram as sorted [bucket, count] pairs (JSON keys would sort as strings)."""
    return [[int(k), int(v)] for k, v in sorted(counter.items())]
