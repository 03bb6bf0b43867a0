"""The token dataset: rows aligned with the contexts the policy sampled from, over random trees,
over trees grown by the real search code, loaded with HF datasets, and from a real vLLM."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.random_trees import Rows, load, rows_of, synthetic_sweep, trees
from tests.support.scripted import WordEnv
from thicket.aggregate.driver import aggregate
from thicket.aggregate.params import SFTParams
from thicket.aggregate.sft import sft_tables
from thicket.aggregate.tokens import token_rows
from thicket.aggregate.verifier import Judgement, Verifier, VerifierConfig
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
    expected = [
        v for v in ref.leaves()
        if all(ref.rows[a]["token_ids"] for a in ref.path(v)[1:]) and all(a in truth.mask for a in ref.path(v)[:-1])
    ]
    assert [r["leaf"] for r in rows] == expected
    assert out.no_token_ids + out.not_append_only + len(rows) == len(ref.leaves())
    for r in rows:
        leaf = ref.rows[r["leaf"]]
        parent = leaf["parent"]
        n_resp = len(r["response_ids"])
        assert len(r["loss_mask"]) == len(r["rollout_logprobs"]) == n_resp
        assert r["prompt_ids"] == ctx[0] == truth.ctx[0]
        tail = len(leaf["token_ids"])
        assert r["prompt_ids"] + r["response_ids"][: n_resp - tail] == ctx[parent] == truth.ctx[parent]
        assert r["response_ids"][n_resp - tail :] == leaf["token_ids"]
        assert r["loss_mask"] == truth.mask[parent][len(ctx[0]) :] + [1] * tail
        assert r["rollout_logprobs"] == pytest.approx(truth.logprobs[parent][len(ctx[0]) :] + leaf["logprobs"])
        assert all(lp == 0.0 for lp, m in zip(r["rollout_logprobs"], r["loss_mask"]) if m == 0)
        path = ref.path(r["leaf"])
        assert r["constrained"] == any(ref.rows[a]["constrained"] for a in path[1:])
        assert r["reward"] == pytest.approx(ref.ret(r["leaf"]))
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


# ---- against a real vLLM server: real chat-template token ids, and the verifier over HTTP ----------


@pytest.mark.vllm
async def test_real_vllm_trees_give_aligned_token_rows_and_a_verifier_cut(vllm_server, tmp_path):
    from thicket.rollout.sweep import run_tasks

    spec = parse_spec(
        {
            "name": "vllm-aggregate",
            "tasks": {"env": "textcraft", "start": 0, "stop": 2},
            "search": {"algorithm": "mcts", "iterations": 3, "expansions": 3, "max_depth": 3},
            "policy": {"kind": "openai", "url": vllm_server.url, "model": vllm_server.served_name,
                       "max_tokens": 24, "max_thought_chars": 12, "concurrency": 16},
            "run": {"progress": False},
            "output": str(tmp_path),
            # every evaluated leaf scores 0 with a random model: accept any pair for revisions
            "datasets": {"revision": {"alpha": -1.0, "beta": 0.0}},
        }
    )
    summary = await run_tasks(spec, [0, 1], progress=False)
    assert not summary.report.failed
    verifier = VerifierConfig(vllm_server.url, vllm_server.served_name)
    result = aggregate(spec.sweep_uri, verifier=verifier, workers=0)
    assert result.stats["tokens_skipped"] == {"no_token_ids": 0, "not_append_only": 0}
    assert result.rows["tokens"] == result.stats["leaves"] > 0
    out = Path(spec.sweep_uri) / "datasets"
    shards = {ref.task: table for ref, table in iter_shards(LocalStore(spec.sweep_uri))}
    for row in pq.read_table(out / "tokens").to_pylist():
        table = shards[row["group_id"]]
        ctx, rows = rebuild_contexts(table), table.to_pylist()
        leaf = rows[row["leaf"]]
        n = len(row["response_ids"]) - len(leaf["token_ids"])
        assert row["prompt_ids"] + row["response_ids"][:n] == ctx[leaf["parent"]]
        assert row["response_ids"][n:] == leaf["token_ids"] and row["rollout_logprobs"][n:] == pytest.approx(leaf["logprobs"])
    # an untrained model solves nothing (root value 0: Agent-R skips the tree), so ask the verifier directly
    assert result.rows["revision"] == 0 or set(result.stats["revision_methods"]) == {"verifier"}
    judge = Verifier(verifier)
    chat = [{"role": "system", "content": "Craft."}, {"role": "user", "content": "Observation: a table."}]
    assert judge.judge(chat) in set(Judgement) and judge.calls == 1
    judge.close()
