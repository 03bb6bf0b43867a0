"""The token dataset: rows aligned with the contexts the policy sampled from, over random trees,
over trees grown by the real search code, loaded with HF datasets, and from a real vLLM."""

from __future__ import annotations

from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.random_trees import Rows, load, rows_of, synthetic_sweep, trees
from tests.support.scripted import WordEnv
from thicket.aggregate.driver import aggregate
from thicket.aggregate.params import SFTParams
from thicket.aggregate.sft import sft_tables
from thicket.aggregate.tokens import token_rows
from thicket.aggregate.view import TreeView
from thicket.policy import prompts
from thicket.policy.base import Messages, Policy, Reply
from thicket.search import grow
from thicket.search.dense import DenseParams
from thicket.search.expand import Expander
from thicket.search.mcts import MCTSParams
from thicket.search.sample import SampleParams
from thicket.shards.storage import iter_shards
from thicket.shards.table import TreeMeta, rebuild_contexts, tree_table
from thicket.spec import parse_spec
from thicket.storage.store import LocalStore


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees)
def test_token_rows_align_and_reproduce_the_contexts(tree):
    table, truth = tree
    ref = Rows(table)
    ctx = rebuild_contexts(table)
    out = token_rows(TreeView.of(table))
    rows = out.table.to_pylist() if out.table is not None else []
    # the trajectories that qualify, by the generator's own bookkeeping
    with_ids = [v for v in ref.leaves() if all(ref.rows[a]["token_ids"] for a in ref.path(v)[1:])]
    known = [v for v in with_ids if all(ref.rows[a]["prefill_len"] >= 0 for a in ref.path(v)[1:])]
    expected = [v for v in known if all(a in truth.mask for a in ref.path(v)[:-1])]
    assert [r["leaf"] for r in rows] == expected
    assert (out.no_token_ids, out.prefill_unknown) == (len(ref.leaves()) - len(with_ids), len(with_ids) - len(known))
    assert out.no_token_ids + out.not_append_only + out.prefill_unknown + len(rows) == len(ref.leaves())
    for r in rows:
        leaf = ref.rows[r["leaf"]]
        parent = leaf["parent"]
        n_resp = len(r["response_ids"])
        assert len(r["loss_mask"]) == len(r["rollout_logprobs"]) == len(r["rollout_temperatures"]) == n_resp
        assert r["prompt_ids"] == ctx[0] == truth.ctx[0]
        tail = len(leaf["token_ids"])
        assert r["prompt_ids"] + r["response_ids"][: n_resp - tail] == ctx[parent] == truth.ctx[parent]
        assert r["response_ids"][n_resp - tail :] == leaf["token_ids"]
        leaf_mask = truth.reply_mask[r["leaf"]]  # a prefilled span of the leaf's reply is not sampled
        assert r["loss_mask"] == truth.mask[parent][len(ctx[0]) :] + leaf_mask
        leaf_logprobs = [lp if m else 0.0 for lp, m in zip(leaf["logprobs"], leaf_mask)]
        assert r["rollout_logprobs"] == pytest.approx(truth.logprobs[parent][len(ctx[0]) :] + leaf_logprobs)
        assert r["rollout_temperatures"] == pytest.approx(
            truth.temperatures[parent][len(ctx[0]) :] + [leaf["temperature"] * m for m in leaf_mask])
        assert all(lp == 0.0 for lp, m in zip(r["rollout_logprobs"], r["loss_mask"]) if m == 0)
        path = ref.path(r["leaf"])
        temps = {ref.rows[a]["temperature"] for a in path[1:]}
        assert r["temperature"] == (temps.pop() if len(temps) == 1 else None)
        assert r["constrained"] == any(ref.rows[a]["constrained"] for a in path[1:])
        assert r["reward"] == pytest.approx(ref.ret(r["leaf"]), abs=1e-6)
        assert r["group_id"] == r["tree_id"] == 0 and r["stop_reason"] == leaf["stop_reason"]


# ---- trees grown by the real search code, with a tokenizing policy ------------------------


class TokenizingPolicy(Policy):
    """Renders the chat to ids like a chat template (one id per character, role markers),
    samples the WordEnv's valid actions in turn, and ends each reply with an EOS id the
    template renders differently: the kept prefix then cuts the reply's last token."""

    EOS, END, ASSISTANT = 2, 3, 4

    @staticmethod
    def render(messages: Messages) -> list[int]:
        ids: list[int] = []
        for m in messages:
            role = {"system": 10, "user": 11, "assistant": TokenizingPolicy.ASSISTANT}[m["role"]]
            ids += [role] + [100 + ord(c) for c in m["content"]] + [TokenizingPolicy.END]
        return ids + [TokenizingPolicy.ASSISTANT]

    async def propose(self, messages, n, *, valid_actions, seed, temperature=None):
        prompt = self.render(messages)
        out = []
        for i in range(n):
            action = valid_actions[(seed + i) % len(valid_actions)]
            text = prompts.turn(f"try {i}", action)
            ids = [100 + ord(c) for c in text] + [self.EOS]
            out.append(Reply(text=text, thought=f"try {i}", action=action, token_ids=ids,
                             logprobs=[-0.5 - i] * len(ids), prompt_token_ids=prompt, seed=seed + i))
        return out

    async def act(self, messages, thought, *, valid_actions, seed, temperature=None):
        raise NotImplementedError


@pytest.mark.parametrize(
    "params",
    [
        MCTSParams(iterations=12, expansions=2, max_depth=4),
        DenseParams(width=2, max_depth=4, run_budget=10),
        SampleParams(samples=4, max_depth=4),
    ],
    ids=lambda p: p.algorithm,
)
async def test_grown_trees_give_aligned_token_rows_and_consistent_datasets(params):
    x = await Expander.open(WordEnv(target="abab"), 0, TokenizingPolicy(), 3, max_depth=4, max_nodes=200)
    await grow(x, params)
    table = tree_table(x.tree, TreeMeta("s", "word", params.algorithm, "m", 0, instructions=x.instructions))
    view = TreeView.of(table)
    ctx = rebuild_contexts(table)
    out = token_rows(view)
    assert out.no_token_ids == out.not_append_only == 0
    rows = out.table.to_pylist()
    assert len(rows) == len(view.leaves) > 0
    for r in rows:
        node = next(n for n in x.tree.nodes() if n.id == r["leaf"])
        # prompt + response - the leaf's reply = the ids the leaf was sampled from
        sampled_from = r["prompt_ids"] + r["response_ids"][: -len(node.reply.token_ids)]
        assert sampled_from == node.reply.prompt_token_ids == ctx[node.parent.id]
        masked = [t for t, m in zip(r["response_ids"], r["loss_mask"]) if m]
        # every reply on the path is in the loss, less the EOS the template re-rendered
        replies = [t for n in node.path()[1:-1] for t in n.reply.token_ids[:-1]] + node.reply.token_ids
        assert masked == replies
        assert [lp for lp, m in zip(r["rollout_logprobs"], r["loss_mask"]) if m] == [
            lp for n in node.path()[1:-1] for lp in n.reply.logprobs[:-1]
        ] + node.reply.logprobs
    for row in rows_of((sft_tables(view, SFTParams()) or [None])[0]):
        node = next(n for n in x.tree.nodes() if n.id == row["leaf"])
        assert row["messages"] == x.messages(node.parent) + [{"role": "assistant", "content": node.reply.text}]


def test_token_rows_load_with_hf_datasets(tmp_path):
    sweep = synthetic_sweep(tmp_path, tasks=4)
    result = aggregate(str(sweep))
    ds = load(sweep / "datasets", "tokens", tmp_path / "hf")
    assert len(ds) == result.rows["tokens"] > 0
    row = ds[0]
    assert len(row["response_ids"]) == len(row["loss_mask"]) == len(row["rollout_logprobs"])


# ---- against a real vLLM server: real chat-template token ids, replies act() completed ----------


def chat_at(rows: list[dict], node: int) -> list[dict]:
    """The chat the policy saw at `node`, from the shard's rows."""
    row = rows[node]
    if row["parent"] < 0:
        return [{"role": "system", "content": row["system_prompt"]}, {"role": "user", "content": row["user_message"]}]
    return chat_at(rows, row["parent"]) + [{"role": "assistant", "content": row["reply"]},
                                           {"role": "user", "content": row["user_message"]}]


@pytest.mark.vllm
async def test_real_vllm_token_rows_decode_to_their_chats_with_act_completed_replies(vllm_server, tmp_path):
    """Unbounded thoughts under a small token budget: many constrained replies are cut before
    their action and completed by act() (a prefilled action mark, then one sampled action).
    Every token row is the exact tokens the model saw: decoding prompt + response gives the
    chat template's text of the path's chat then the leaf's reply; every loss-1 token is a
    sampled one, with its sampled logprob; prefilled ids carry loss 0."""
    from thicket.rollout.sweep import run_tasks
    from thicket.vllm_server import server_root

    spec = parse_spec(
        {
            "name": "vllm-tokens",
            "tasks": {"env": "textcraft", "start": 0, "stop": 2},
            "search": {"algorithm": "mcts", "iterations": 3, "expansions": 3, "max_depth": 3},
            "policy": {"kind": "openai", "url": vllm_server.url, "model": vllm_server.served_name,
                       "max_tokens": 12, "max_thought_chars": 0, "concurrency": 16},
            "run": {"progress": False},
            "output": str(tmp_path),
        }
    )
    summary = await run_tasks(spec, [0, 1], progress=False)
    assert not summary.report.failed
    result = aggregate(spec.sweep_uri, workers=0)
    assert result.stats["tokens_skipped"] == {"no_token_ids": 0, "not_append_only": 0, "prefill_unknown": 0}
    assert result.rows["tokens"] == result.stats["leaves"] > 0
    shards = {ref.task: table.to_pylist() for ref, table in iter_shards(LocalStore(spec.sweep_uri))}
    acted = [r for rows in shards.values() for r in rows if r["prefill_start"] >= 0]
    assert acted and all(r["prefill_len"] > 0 for r in acted)
    root = server_root(vllm_server.url)
    async with httpx.AsyncClient(base_url=root, timeout=60) as client:
        async def detokenize(ids: list[int]) -> str:
            answer = await client.post("/detokenize", json={"model": vllm_server.served_name, "tokens": ids})
            answer.raise_for_status()
            return answer.json()["prompt"]

        async def rendered(messages: list[dict]) -> str:
            answer = await client.post("/tokenize", json={"model": vllm_server.served_name, "messages": messages,
                                                          "add_generation_prompt": True})
            answer.raise_for_status()
            return await detokenize(answer.json()["tokens"])

        mark = (await client.post("/tokenize", json={"model": vllm_server.served_name, "prompt": "\nAction: ",
                                                     "add_special_tokens": False})).json()["tokens"]
        for r in acted:
            assert r["token_ids"][r["prefill_start"]: r["prefill_start"] + r["prefill_len"]] in (
                mark, mark[1:])  # "\nAction: ", or "Action: " after a thought that ended its line
            assert (await detokenize(r["token_ids"])).startswith(r["reply"])
        checked = 0
        for row in pq.read_table(Path(spec.sweep_uri) / "datasets" / "tokens").to_pylist():
            rows = shards[row["group_id"]]
            leaf = rows[row["leaf"]]
            text = await detokenize(row["prompt_ids"] + row["response_ids"])
            before = await rendered(chat_at(rows, leaf["parent"]))
            assert text.startswith(before) and text[len(before):].startswith(leaf["reply"])
            tail = len(leaf["token_ids"])
            sampled = [i for i in range(tail) if not (leaf["prefill_start"] >= 0
                       and leaf["prefill_start"] <= i < leaf["prefill_start"] + leaf["prefill_len"])]
            assert row["loss_mask"][-tail:] == [int(i in sampled) for i in range(tail)]
            assert [row["rollout_logprobs"][-tail:][i] for i in sampled] == pytest.approx(
                [leaf["logprobs"][i] for i in sampled])
            assert all(t == pytest.approx(leaf["temperature"]) for t, m in
                       zip(row["rollout_temperatures"][-tail:], row["loss_mask"][-tail:]) if m)
            checked += 1
    assert checked == result.rows["tokens"]
