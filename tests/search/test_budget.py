"""The LLM-call budget (search.max_llm_calls), the node budget (max_nodes) and the calls each node
records: every sampled reply counts, no search spends more than its budget, every reply it paid
for is stepped and stored (a duplicate reply dropped as Agent-R drops them is the one exception),
and a search the budget stopped says BUDGET, never ERROR."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.scripted import META, CyclingPolicy, RepeatingPolicy, WordEnv, grown
from thicket.search.dense import DenseParams
from thicket.search.mcts import MCTSParams
from thicket.search.sample import SampleParams
from thicket.search.tot import ToTParams
from thicket.search.tree import StopReason
from thicket.shards.table import tree_table

THICKET = str(Path(sys.executable).parent / "thicket")


class CountingPolicy(CyclingPolicy):
    @property
    def sampled(self) -> int:
        return sum(n for _, n in self.requests)


SEARCHES = [
    SampleParams(samples=3, max_depth=4),
    ToTParams(branching=3, max_depth=4),
    MCTSParams(iterations=50, expansions=3, max_depth=4),
    DenseParams(width=3, max_depth=4, run_budget=100, target_pairs=100),
]


def abc_env() -> WordEnv:
    """Three letters: a propose of up to 3 samples (sample i takes letter i) repeats no reply."""
    return WordEnv(target="abca", letters="abc")


@pytest.mark.parametrize("params", SEARCHES, ids=lambda p: p.algorithm)
@pytest.mark.parametrize("budget", [1, 2, 5, 13])
async def test_every_reply_paid_for_is_stepped_and_stored_within_the_budget(params, budget):
    policy = CountingPolicy()
    x = await grown(params.model_copy(update={"max_llm_calls": budget}), abc_env(), policy)
    nodes = list(x.tree.nodes())
    assert sum(node.llm_calls for node in nodes) == x.llm_calls == policy.sampled <= budget
    assert len(nodes) - 1 == policy.sampled  # each reply is a node: none dropped for the budget
    assert not any(node.stop is StopReason.ERROR for node in nodes)
    for node in nodes:
        assert node.llm_calls == len(node.children) or params.algorithm == "dense"  # dense: a call per child too
    unbudgeted = CountingPolicy()
    await grown(params, abc_env(), unbudgeted)
    assert policy.sampled == min(budget, unbudgeted.sampled)  # the search spends all it may
    if unbudgeted.sampled > budget:
        assert any(node.stop is StopReason.BUDGET for node in nodes)


async def test_tot_with_a_budget_of_two_stores_the_two_replies_it_paid_for():
    """The reported case: ToT asked for 3 thoughts, could pay for 2, and stored the root alone."""
    x = await grown(ToTParams(branching=3, max_depth=4, max_llm_calls=2), abc_env(), CountingPolicy())
    assert [c.reply.action for c in x.tree.root.children] == ["a", "b"]
    assert all(c.stop is StopReason.BUDGET for c in x.tree.root.children)


@pytest.mark.parametrize("params", SEARCHES, ids=lambda p: p.algorithm)
@pytest.mark.parametrize("max_nodes", [2, 4, 9])
async def test_the_node_budget_is_kept_without_dropping_replies(params, max_nodes):
    policy = CountingPolicy()
    x = await grown(params.model_copy(update={"max_nodes": max_nodes}), abc_env(), policy)
    assert x.tree.size <= max_nodes
    assert x.tree.size - 1 == policy.sampled
    assert not any(node.stop is StopReason.ERROR for node in x.tree.nodes())


async def test_dropped_duplicates_count_as_calls_and_reach_the_shard():
    policy = RepeatingPolicy()
    x = await grown(MCTSParams(iterations=3, expansions=4, max_depth=3), WordEnv(), policy)
    table = tree_table(x.tree, META)
    calls = table.column("llm_calls").to_pylist()
    assert sum(calls) == x.llm_calls == 4 * x.llm_requests > table.num_rows - 1  # 3 of 4 dropped each time
    parents = set(table.column("parent").to_pylist())
    assert all(count == 0 for node, count in enumerate(calls) if node not in parents)  # calls sit where they were made


def test_a_budgeted_mcts_sweep_through_the_cli_stores_no_error_node(tmp_path):
    """The reported reproduction: MCTS, uniform policy, FrozenLake, max_llm_calls 6 gave 8 error
    nodes in 8 trees (the replies of the last propose were never stepped)."""
    spec = tmp_path / "budget.yaml"
    spec.write_text(
        "name: budget\n"
        "tasks: {env: frozenlake, start: 0, stop: 8}\n"
        "search: {algorithm: mcts, iterations: 30, expansions: 4, max_depth: 12, max_llm_calls: 6}\n"
        f"policy: {{kind: uniform}}\noutput: {tmp_path / 'out'}\nseed: 0\n"
    )
    done = subprocess.run([THICKET, "run", str(spec), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted((tmp_path / "out" / "budget" / "trees").rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f, columns=["task", "parent", "stop_reason", "llm_calls"]) for f in files])
    rows = table.to_pylist()
    assert len({r["task"] for r in rows}) == 8
    assert not [r for r in rows if r["stop_reason"] == "error"]
    for task in range(8):
        mine = [r for r in rows if r["task"] == task]
        paid = sum(r["llm_calls"] for r in mine)
        assert paid == 6  # the budget is spent
        assert 1 <= len(mine) - 1 <= paid  # replies stored: all but duplicates
        assert any(r["stop_reason"] == "budget" for r in mine)
