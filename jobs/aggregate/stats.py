"""Sweep statistics, accumulated a forest (a batch of trees) at a time in bounded memory."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thicket.aggregate.forest import Forest
from thicket.aggregate.policy_figures import PolicyFigures
from thicket.aggregate.quality import SearchQuality

OWN_TASKS = "the family's own tasks"  # the data source of an env that names none


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
    reward_semantics: Counter[str] = field(default_factory=Counter)  # trees by how their rewards add up
    data_sources: Counter[str] = field(default_factory=Counter)  # trees by "env: where its tasks came from"
    algorithms: Counter[str] = field(default_factory=Counter)
    # What the datasets' row counts don't say:
    dpo_kinds: Counter[str] = field(default_factory=Counter)
    same_action_pairs: Counter[str] = field(default_factory=Counter)  # "{dataset}/{dropped|kept}" (same_action.py)
    revision_methods: Counter[str] = field(default_factory=Counter)
    tokens_skipped: Counter[str] = field(default_factory=Counter)
    quality: SearchQuality = field(default_factory=SearchQuality)
    resumed: Counter[str] = field(default_factory=Counter)  # trees, nodes and LLM calls checkpoints brought back
    policy: PolicyFigures = field(default_factory=PolicyFigures)

    def add(self, forest: Forest) -> None:
        t = forest.table
        roots = pa.array(forest.roots)
        self.tasks.update(forest.tasks.tolist())
        self.trees += forest.n_trees
        self.nodes += forest.size
        self.envs.update(_counts_of(t.column("env").take(roots)))
        semantics = t.column("reward_semantics").take(roots) if "reward_semantics" in t.column_names else None
        self.reward_semantics.update(_counts_of(pc.fill_null(semantics, "legacy")) if semantics is not None
                                     else {"legacy": forest.n_trees})
        self.data_sources.update(_data_sources(t, roots))
        self.algorithms.update(_counts_of(t.column("algorithm").take(roots)))
        self.depth.update(_counts(forest.depth))
        self.leaf_depth.update(_counts(forest.depth[forest.leaves]))
        self.branching.update(_counts(forest.n_children[forest.n_children > 0]))
        self.leaves += len(forest.leaves)
        solved = forest.success & ~forest.is_root
        self.success_leaves += int(solved.sum())
        tokens = np.add.reduceat(_lengths(t.column("token_ids")), forest.roots)
        self.generated_tokens += int(tokens.sum())
        solved_tokens = tokens[np.bincount(forest.tree_of[solved], minlength=forest.n_trees) > 0].tolist()
        self.solved_trees += len(solved_tokens)
        self.solved_tree_tokens += sum(solved_tokens)
        self.tokens_per_success.update(log2_bucket(n) for n in solved_tokens)
        known = pc.is_valid(t.column("cached_tokens"))
        self.prompt_tokens_known += int(pc.sum(pc.filter(t.column("prompt_tokens"), known)).as_py() or 0)
        self.cached_tokens += int(pc.sum(t.column("cached_tokens")).as_py() or 0)
        self.stop_reasons.update(_counts_of(t.column("stop_reason").take(pa.array(forest.leaves))))
        self.quality.add(forest)
        self.policy.add(forest)
        self.resumed.update(_resumed(forest))

    def merge(self, other: SweepStats) -> None:
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, set):
                mine |= theirs
            elif isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, SearchQuality | PolicyFigures):
                mine.merge(theirs)
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
            "reward_semantics": dict(sorted(self.reward_semantics.items())),
            "data_sources": dict(sorted(self.data_sources.items())),
            "algorithms": dict(sorted(self.algorithms.items())),
            "datasets": dict(sorted(datasets.items())),
            "dpo_pairs": {kind: self.dpo_kinds[kind] for kind in ("step", "trajectory")},
            "preference_rows_same_action": {name: {what: self.same_action_pairs[f"{name}/{what}"]
                                                   for what in ("dropped", "kept")}
                                            for name in ("dpo", "dpo_first_turn")},
            "revision_methods": dict(sorted(self.revision_methods.items())),
            "tokens_skipped": {why: self.tokens_skipped[why]
                               for why in ("no_token_ids", "not_append_only", "prefill_unknown")},
            "search_quality": self.quality.to_json(self.solved_trees, self.success_leaves, self.dpo_kinds,
                                                   datasets.get("revision", 0)),
            "policy": self.policy.to_json(),
            "resumed": {what: self.resumed[what] for what in ("trees", "nodes", "llm_calls")},
        }


def _resumed(forest: Forest) -> dict[str, int]:
    """Trees resumed from a checkpoint, the nodes it brought back and the LLM calls it saved."""
    t = forest.table
    calls = pc.fill_null(t.column("resumed_llm_calls"), 0).to_numpy()
    nodes = pc.fill_null(t.column("resumed"), False).to_numpy(zero_copy_only=False)
    per_tree = np.add.reduceat(calls, forest.roots) if len(calls) else calls
    return {"trees": int((per_tree > 0).sum()), "nodes": int(nodes.sum()), "llm_calls": int(calls.sum())}


def _counts(values: np.ndarray) -> dict[int, int]:
    if len(values) == 0:
        return {}
    counts = np.bincount(values)
    return {int(k): int(counts[k]) for k in np.flatnonzero(counts)}


def _lengths(lists: pa.ChunkedArray) -> np.ndarray:
    """Each list's length (nulls count 0)."""
    return pc.list_value_length(lists).fill_null(0).to_numpy().astype(np.int64)


def _counts_of(values) -> dict[str, int]:
    return {item["values"]: item["counts"] for item in pc.value_counts(values).to_pylist()}


def _data_sources(table: pa.Table, roots: pa.Array) -> dict[str, int]:
    """Trees by "env: data source" (null, and shards older than the column: the family's own tasks)."""
    envs = table.column("env").take(roots)
    sources = table.column("data_source").take(roots) if "data_source" in table.column_names else None
    named = pc.fill_null(sources, OWN_TASKS) if sources is not None else pa.array([OWN_TASKS] * len(roots))
    return _counts_of(pc.binary_join_element_wise(pc.cast(envs, pa.string()), pc.cast(named, pa.string()), ": "))


def _pairs(counter: Counter[int]) -> list[list[int]]:
    """A histogram as sorted [bucket, count] pairs (JSON keys would sort as strings)."""
    return [[int(k), int(v)] for k, v in sorted(counter.items())]
