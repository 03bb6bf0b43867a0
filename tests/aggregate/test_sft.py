"""The SFT datasets over random trees: the best successful path, as the exact chat (and in
FastChat's layout)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.random_trees import Rows, rows_of, trees
from thicket.aggregate.params import SFTParams
from thicket.aggregate.sft import sft_tables
from thicket.aggregate.view import TreeView


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.sampled_from([None, 0.5, 1.0]))
def test_sft_path_is_the_best_success_as_the_exact_chat(tree, min_reward):
    table, _ = tree
    ref = Rows(table)
    out = sft_tables(TreeView.of(table), SFTParams(min_reward=min_reward))
    ok = [v for v in ref.leaves() if ref.rows[v]["success"] and (min_reward is None or ref.ret(v) >= min_reward)]
    if not ok:
        assert out is None
        return
    best = min(ok, key=lambda v: (-ref.ret(v), ref.rows[v]["depth"], v))
    [row], [fc] = rows_of(out[0]), rows_of(out[1])
    assert row["leaf"] == best and ref.rows[best]["success"]
    assert row["messages"] == ref.path_chat(best)
    assert row["messages"][-1]["role"] == "assistant"
    assert fc["id"] == row["id"]
    assert [(c["from"], c["value"]) for c in fc["conversations"]] == [
        ({"system": "system", "user": "human", "assistant": "gpt"}[m["role"]], m["content"]) for m in row["messages"]
    ]
