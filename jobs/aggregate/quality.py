"""Search quality: what a sweep's search bought per LLM call and per generated token.

For each sweep: tasks solved, successful trajectories (root-to-success paths), distinct
successful trajectories (distinct action sequences per task), DPO pairs (trajectory and
step) and revision rows, each as a count, per 1,000 LLM calls and per 1M generated tokens.

LLM calls and their tokens are the shards' `llm_calls` / `llm_tokens` (every sampled reply,
duplicates the search dropped included). Shards written before those columns count the
replies kept in the tree instead (`calls_exact` is then false): dropped duplicates go uncounted.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow.compute as pc

from thicket.aggregate.forest import Forest

YIELDS = ("tasks_solved", "successful_trajectories", "distinct_successful_trajectories", "dpo_trajectory_pairs",
          "dpo_step_pairs", "revision_rows")


@dataclass
class SearchQuality:
    """What the trees hold of it; the dataset rows come in at to_json."""

    llm_calls: int = 0
    llm_tokens: int = 0
    distinct_successes: int = 0
    uncounted_nodes: int = 0  # nodes of shards without llm_calls (their kept children were counted)

    def add(self, forest: Forest) -> None:
        table = forest.table
        calls, tokens = table.column("llm_calls"), table.column("llm_tokens")
        known = pc.is_valid(calls).to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(table.column("token_ids")).fill_null(0).to_numpy().astype(np.int64)
        fallback = ~forest.is_root & ~known[np.maximum(forest.parent, 0)]  # replies whose parent has no count
        self.llm_calls += int(pc.sum(calls).as_py() or 0) + int(fallback.sum())
        self.llm_tokens += int(pc.sum(tokens).as_py() or 0) + int(lengths[fallback].sum())
        self.uncounted_nodes += int((~known).sum())
        self.distinct_successes += distinct_successes(forest)

    def merge(self, other: SearchQuality) -> None:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))

    def to_json(self, solved_trees: int, success_leaves: int, dpo_kinds: dict[str, int],
                revision_rows: int) -> dict[str, Any]:
        counts = {
            "tasks_solved": solved_trees,
            "successful_trajectories": success_leaves,
            "distinct_successful_trajectories": self.distinct_successes,
            "dpo_trajectory_pairs": dpo_kinds.get("trajectory", 0),
            "dpo_step_pairs": dpo_kinds.get("step", 0),
            "revision_rows": revision_rows,
        }
        return {
            "llm_calls": self.llm_calls,
            "llm_tokens": self.llm_tokens,
            "calls_exact": self.uncounted_nodes == 0,
            **counts,
            "per_1k_llm_calls": _per(counts, self.llm_calls, 1_000),
            "per_1m_llm_tokens": _per(counts, self.llm_tokens, 1_000_000),
        }


def _per(counts: dict[str, int], spent: int, unit: int) -> dict[str, float | None]:
    return {name: round(value * unit / spent, 3) if spent else None for name, value in counts.items()}


def distinct_successes(forest: Forest) -> int:
    """Successful nodes whose action sequence from the root differs from every other's in their tree."""
    wins = np.flatnonzero(forest.success & ~forest.is_root)
    if len(wins) == 0:
        return 0
    codes = pc.dictionary_encode(forest.table.column("action")).combine_chunks().indices
    actions = codes.to_numpy(zero_copy_only=False).astype(np.int64)
    paths = actions[forest.ancestors(wins)]
    depth = forest.depth[wins]
    paths[np.arange(paths.shape[1])[None, :] > depth[:, None]] = -1
    keys = np.column_stack([forest.tree_of[wins], depth, paths])
    return len(np.unique(keys, axis=0))


def quality_html(stats: dict[str, Any]) -> str:
    """The search-quality table of report.html (empty for stats without it)."""
    quality = stats.get("search_quality")
    if not quality:
        return ""
    exact = "" if quality["calls_exact"] else " (older shards: duplicates the search dropped are not counted)"
    head = "<tr><th></th><th>count</th><th>per 1,000 LLM calls</th><th>per 1M generated tokens</th></tr>"
    rows = [
        f"<tr><th>{html.escape(name.replace('_', ' '))}</th><td>{quality[name]}</td>"
        f"<td>{_cell(quality['per_1k_llm_calls'][name])}</td><td>{_cell(quality['per_1m_llm_tokens'][name])}</td></tr>"
        for name in YIELDS
    ]
    spent = f"{quality['llm_calls']:,} LLM calls, {quality['llm_tokens']:,} generated tokens{exact}"
    return f"<h2>Search quality</h2><p>{html.escape(spent)}</p><table>{head}{''.join(rows)}</table>"


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"



def quality_line(stats: dict[str, Any], llm: bool = True) -> str:
    """The search-quality line of a run's summary (`llm` false: the policy's samples are no LLM's)."""
    quality = stats["search_quality"]
    per_call = quality["per_1k_llm_calls"]
    pairs = quality["dpo_trajectory_pairs"] + quality["dpo_step_pairs"]
    if not quality["llm_calls"]:
        return "search       no LLM calls"
    calls = "LLM calls" if llm else "policy samples (no LLM)"
    return (f"search       {quality['llm_calls']} {calls}: {quality['distinct_successful_trajectories']} distinct "
            f"successes ({_cell(per_call['distinct_successful_trajectories'])} per 1,000 calls), {pairs} DPO pairs "
            f"({_cell((per_call['dpo_trajectory_pairs'] or 0) + (per_call['dpo_step_pairs'] or 0))} per 1,000)")
