"""A finished tree as a shard table (thicket.shards.table): one row per node in canonical order,
prompt ids through the compressed context columns, rows that rebuild the exact chat."""

from __future__ import annotations

import pytest

from tests.support.scripted import META, CyclingPolicy, WordEnv, small_tree
from thicket.policy.base import Reply
from thicket.search import grow
from thicket.search.expand import Expander
from thicket.search.mcts import MCTSParams
from thicket.shards.storage import TREE_SCHEMA
from thicket.shards.table import TreeMeta, rebuild_contexts, tree_table


async def test_table_has_one_row_per_node_in_canonical_order(tmp_path):
    tree = await small_tree()
    table = tree_table(tree, META)
    assert table.schema == TREE_SCHEMA and table.num_rows == tree.size == 15
    rows = table.to_pylist()
    assert [r["node"] for r in rows] == list(range(15))
    assert rows[0]["parent"] == -1 and all(r["parent"] < r["node"] for r in rows[1:])
    assert [r["depth"] for r in rows] == sorted(r["depth"] for r in rows)
    leaves = [r for r in rows if r["terminal"] and r["depth"] == 3]
    assert len(leaves) == 8 and sum(r["success"] for r in leaves) == 1
    assert rows[0]["visits"] == 8 and rows[0]["value"] == pytest.approx(1 / 8)


async def test_prompt_ids_round_trip_through_the_compressed_columns():
    tree = await small_tree()
    prompts: dict[int, list[int]] = {}
    counter = iter(range(10_000))
    for node in tree.nodes():  # a fake tokenizer: the context grows by reply ids + 3 new ids
        base = [] if node.parent is None else prompts[id(node.parent)] + node.reply.token_ids
        prompts[id(node)] = base + [next(counter) for _ in range(3)]
        for child in node.children:
            child.reply = Reply(
                text=child.reply.text,
                thought=child.reply.thought,
                action=child.reply.action,
                token_ids=[next(counter) for _ in range(2)],
                prompt_token_ids=None,
            )
    for node in tree.nodes():
        for child in node.children:
            child.reply.prompt_token_ids = prompts[id(node)]
    table = tree_table(tree, META)
    suffix_lengths = [len(s) for s in table.column("context_suffix_ids").to_pylist()]
    assert max(suffix_lengths) == 3  # append-only: only the new turn is stored
    rebuilt = rebuild_contexts(table)
    for node, context in zip(tree.nodes(), rebuilt):
        if node.children:
            assert context == prompts[id(node)]
        else:
            assert context is None


async def test_rows_rebuild_the_exact_chat_the_policy_saw():
    x = await Expander.open(WordEnv(), 0, CyclingPolicy(), 0, max_depth=10, max_nodes=100, show_valid_actions=True)
    await grow(x, MCTSParams(iterations=3, expansions=2, max_depth=10))
    meta = TreeMeta("s", "word", "mcts", "m", 0, instructions=x.instructions, show_valid_actions=True)
    rows = tree_table(x.tree, meta).to_pylist()

    def chat(i: int) -> list[dict]:
        row = rows[i]
        if row["parent"] < 0:
            return [{"role": "system", "content": row["system_prompt"]}, {"role": "user", "content": row["user_message"]}]
        return chat(row["parent"]) + [
            {"role": "assistant", "content": row["reply"]},
            {"role": "user", "content": row["user_message"]},
        ]

    for node in x.tree.nodes():
        assert chat(node.id) == x.messages(node)
    assert "Valid actions: a | b" in rows[0]["user_message"]
