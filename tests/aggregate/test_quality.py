"""Search quality in stats.json: distinct successful trajectories against a reference count,
LLM calls from the shards' counts (or, in shards without them, the kept replies), per-call rates."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.random_trees import Rows, random_tree, synthetic_sweep
from thicket.aggregate.driver import aggregate
from thicket.aggregate.forest import Forest
from thicket.aggregate.quality import YIELDS, distinct_successes
from thicket.aggregate.report import report_html


def reference_distinct(table) -> int:
    ref = Rows(table)
    paths = {tuple(ref.rows[v]["action"] for v in ref.path(node)[1:]) for node in range(1, len(ref.rows))
             if ref.rows[node]["success"]}
    return len(paths)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(2, 40)), min_size=1, max_size=4))
def test_distinct_successes_are_the_distinct_action_paths_to_a_success_per_tree(seeds):
    tables = [random_tree(seed, max_nodes, task=task)[0] for task, (seed, max_nodes) in enumerate(seeds)]
    assert distinct_successes(Forest.of(tables)) == sum(reference_distinct(t) for t in tables)


def test_stats_carry_search_quality_and_shards_without_call_counts_count_the_kept_replies(tmp_path):
    sweep = synthetic_sweep(tmp_path, tasks=6)  # random trees: no llm_calls column values
    stats = aggregate(str(sweep), workers=0).stats
    quality = stats["search_quality"]
    assert quality["llm_calls"] == stats["nodes"] - stats["trees"] and not quality["calls_exact"]
    assert quality["tasks_solved"] == stats["solved_trees"]
    assert quality["successful_trajectories"] == stats["success_leaves"]
    assert quality["dpo_trajectory_pairs"] + quality["dpo_step_pairs"] == stats["datasets"]["dpo"]
    assert quality["revision_rows"] == stats["datasets"]["revision"]
    for name in YIELDS:
        assert quality["per_1k_llm_calls"][name] == round(quality[name] * 1000 / quality["llm_calls"], 3)
        assert quality["per_1m_llm_tokens"][name] == round(quality[name] * 1e6 / quality["llm_tokens"], 3)
    on_disk = json.loads((sweep / "datasets" / "stats.json").read_text())
    assert on_disk["search_quality"] == quality
    page = report_html(stats, "synthetic")
    assert "Search quality" in page and "per 1,000 LLM calls" in page
