"""Forests, the trees of a batch built at once: the rows of their trees built one by one, and a
malformed shard named with what is wrong."""

from __future__ import annotations

import hashlib
import json

import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.random_trees import random_tree
from thicket.aggregate.content import PairKeys
from thicket.aggregate.dpo import dpo_table, dpo_tables
from thicket.aggregate.driver import aggregate
from thicket.aggregate.forest import Forest, MalformedShard
from thicket.aggregate.params import DPOParams, RevisionParams, SFTParams
from thicket.aggregate.revision import revision_table
from thicket.aggregate.sft import sft_tables
from thicket.aggregate.stats import SweepStats
from thicket.aggregate.tokens import token_rows
from thicket.aggregate.verifier import Verifier, VerifierConfig
from thicket.aggregate.view import TreeView
from thicket.errors import BadInput
from thicket.shards.storage import write_shard
from thicket.storage.store import LocalStore


# ---- forests: the trees of a batch built at once ------------------------------------------


def judge_by_text(request: httpx.Request) -> httpx.Response:
    """A verifier whose verdict depends only on the judged step's observation."""
    observation = json.loads(request.content)["messages"][-2]["content"]
    verdict = "Bad" if hashlib.sha256(observation.encode()).digest()[0] % 3 == 0 else "Good"
    return httpx.Response(200, json={"choices": [{"message": {"content": f"Judgement: {verdict}"}}]})


def concat(tables: list[pa.Table | None]) -> pa.Table | None:
    present = [t for t in tables if t is not None]
    return pa.concat_tables(present).combine_chunks() if present else None


def same(a: pa.Table | None, b: pa.Table | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.combine_chunks().equals(b))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(1, 40), st.booleans()), min_size=1, max_size=6),
    st.booleans(),
)
def test_a_forest_gives_the_rows_of_its_trees_built_one_by_one(specs, judged):
    tables = [random_tree(seed, n, task=3 * i + 1, token_ids=ids)[0] for i, (seed, n, ids) in enumerate(specs)]
    forest, alone = Forest.of(tables), [TreeView.of(t) for t in tables]
    dpo = DPOParams(beta=0.25, min_visits=1, max_trajectory_pairs_per_task=3)
    revision = RevisionParams(alpha=0.0, beta=0.0, max_per_task=3)
    verifier = None
    if judged:
        verifier = Verifier(VerifierConfig("http://verifier/v1", "judge"), httpx.Client(transport=httpx.MockTransport(judge_by_text)))
    for build in (
        lambda f: (sft_tables(f, SFTParams()) or (None, None))[0],
        lambda f: (sft_tables(f, SFTParams(min_reward=1.0)) or (None, None))[1],
        lambda f: dpo_table(f, dpo),
        lambda f: (lambda rows: rows and rows.table)(dpo_tables(f, dpo)[1]),
        lambda f: revision_table(f, revision, verifier),
        lambda f: token_rows(f).table,
    ):
        assert same(concat([build(view) for view in alone]), build(forest))
    for side in (0, 1):  # content keys name texts, not rows: a forest's are its trees', one by one
        keyed = [rows.keys for rows in (dpo_tables(view, dpo)[side] for view in alone) if rows is not None]
        together_keys = dpo_tables(forest, dpo)[side]
        expected = PairKeys.concat(keyed)
        got = together_keys.keys if together_keys is not None else PairKeys.concat([])
        assert all((getattr(got, k) == getattr(expected, k)).all() for k in ("low", "high", "forward"))
    tokens = [token_rows(view) for view in alone]
    together = token_rows(forest)
    assert together.no_token_ids == sum(t.no_token_ids for t in tokens)
    assert together.not_append_only == sum(t.not_append_only for t in tokens)
    one_by_one = SweepStats()
    for view in alone:
        stats = SweepStats()
        stats.add(view)
        one_by_one.merge(stats)
    at_once = SweepStats()
    at_once.add(forest)
    assert at_once.to_json({}) == one_by_one.to_json({})


def test_a_malformed_shard_is_named_with_what_is_wrong(tmp_path):
    good, _ = random_tree(7, max_nodes=30)
    n = good.num_rows
    column = good.schema.get_field_index

    def with_values(name: str, values: list) -> pa.Table:
        return good.set_column(column(name), name, pa.array(values, good.schema.field(name).type))

    parents, depths = good.column("parent").to_pylist(), good.column("depth").to_pylist()
    last = parents[-1]
    cases = {
        "empty shard": good.slice(0, 0),
        "null parent": with_values("parent", [*parents[:-1], None]),
        "a shard holds one tree": with_values("tree", [0] * (n - 1) + [1]),
        "rows are not in canonical breadth-first order": good.take([0, 2, 1, *range(3, n)]),
    }
    cases["not its own parent"] = with_values("parent", [*parents[:-1], n - 1])
    cases["depth"] = with_values("depth", [*depths[:-1], depths[-1] + 1])
    cases["siblings apart"] = with_values("parent", [*parents[:-2], last, parents[-2]]) if parents[-2] != last else None
    for case, table in cases.items():
        if table is None:
            continue
        message = case if case.startswith(("empty", "null", "a shard")) else "canonical breadth-first order"
        with pytest.raises(MalformedShard, match=message) as raised:
            Forest.of([good, good, table, good])
        assert raised.value.index == 2, case
    store = LocalStore(tmp_path / "sweep")
    for task, table in enumerate([good, good, cases["a shard holds one tree"]]):
        write_shard(store, task, table, "test")
    with pytest.raises(BadInput, match=r"task-00000002\.[\w.]+\.parquet: a shard holds one tree"):
        aggregate(str(tmp_path / "sweep"), workers=0)
