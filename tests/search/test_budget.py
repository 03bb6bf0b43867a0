"""The LLM-call budget (search.max_llm_calls) and the calls each node records: every sampled
reply counts, duplicates the search dropped included, and no search spends more than its budget."""

from __future__ import annotations

import pytest

from tests.support.scripted import META, CyclingPolicy, RepeatingPolicy, WordEnv, grown
from thicket.search.dense import DenseParams
from thicket.search.mcts import MCTSParams
from thicket.search.sample import SampleParams
from thicket.search.tot import ToTParams
from thicket.shards.table import tree_table


class CountingPolicy(CyclingPolicy):
    @property
    def sampled(self) -> int:
        return sum(n for _, n in self.requests)


SEARCHES = [
    SampleParams(samples=4, max_depth=4),
    ToTParams(branching=2, max_depth=4),
    MCTSParams(iterations=50, expansions=3, max_depth=4),
    DenseParams(width=3, max_depth=4, run_budget=100, target_pairs=100),
]


@pytest.mark.parametrize("params", SEARCHES, ids=lambda p: p.algorithm)
@pytest.mark.parametrize("budget", [1, 5, 13])
async def test_no_search_spends_more_llm_calls_than_its_budget(params, budget):
    policy = CountingPolicy()
    x = await grown(params.model_copy(update={"max_llm_calls": budget}), WordEnv(target="abba"), policy)
    recorded = sum(node.llm_calls for node in x.tree.nodes())
    assert recorded == x.llm_calls == policy.sampled <= budget
    unbudgeted = CountingPolicy()
    await grown(params, WordEnv(target="abba"), unbudgeted)
    assert policy.sampled == min(budget, unbudgeted.sampled)  # the same search, cut where the budget ends


async def test_dropped_duplicates_count_as_calls_and_reach_the_shard():
    policy = RepeatingPolicy()
    x = await grown(MCTSParams(iterations=3, expansions=4, max_depth=3), WordEnv(), policy)
    table = tree_table(x.tree, META)
    calls = table.column("llm_calls").to_pylist()
    assert sum(calls) == x.llm_calls == 4 * x.llm_requests > table.num_rows - 1  # 3 of 4 dropped each time
    parents = set(table.column("parent").to_pylist())
    assert all(count == 0 for node, count in enumerate(calls) if node not in parents)  # calls sit where they were made
