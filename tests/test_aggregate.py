"""`thicket aggregate`: properties of every dataset over random trees, and end to end."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import pty
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted import WordEnv

import thicket.shards.storage as shards
from thicket.aggregate.dpo import dpo_table
from thicket.aggregate.driver import TreeOutput, aggregate
from thicket.aggregate.forest import Forest, MalformedShard
from thicket.aggregate.pairs import grid_pairs
from thicket.aggregate.params import DatasetsSpec, DPOParams, RevisionParams, SFTParams
from thicket.aggregate.revision import REVISION_THOUGHTS, revision_table
from thicket.aggregate.sft import sft_tables
from thicket.aggregate.stats import SweepStats
from thicket.aggregate.tokens import token_rows
from thicket.aggregate.verifier import QUESTION, Judgement, Verifier, VerifierConfig
from thicket.aggregate.view import EVALUATED, TreeView
from thicket.errors import BadInput
from thicket.policy import prompts
from thicket.policy.base import Messages, Policy, Reply
from thicket.search import grow
from thicket.search.dense import DenseParams
from thicket.search.expand import Expander
from thicket.search.mcts import MCTSParams
from thicket.search.sample import SampleParams
from thicket.shards.storage import (
    TREE_SCHEMA,
    CommitStatus,
    commit_key,
    iter_shards,
    read_marker,
    write_shard,
    write_shards,
)
from thicket.shards.table import TreeMeta, rebuild_contexts, tree_table
from thicket.spec import parse_spec
from thicket.storage import open_store
from thicket.storage.store import LocalStore

ROOT = Path(__file__).resolve().parent.parent
THICKET = str(Path(sys.executable).parent / "thicket")
VALUES = (0.0, 0.25, 0.5, 0.75, 1.0)
LEAF_STOPS = ("done", "done", "depth_limit", "budget", "disaster", "error", "timeout")


# ---- random trees, written directly in TREE_SCHEMA --------------------------------------


@dataclass
class Truth:
    """What the generator knows: each node's full context, and per context token whether it
    is a sampled reply token (mask) and its logprob."""

    ctx: dict[int, list[int]] = field(default_factory=dict)
    mask: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[float]] = field(default_factory=dict)


def f32(x: float) -> float:
    return float(np.float32(x))


def random_tree(seed: int, max_nodes: int = 40, task: int = 0, token_ids: bool = True) -> tuple[pa.Table, Truth]:
    rng = random.Random(seed)
    parents, depths = [-1], [0]
    frontier = [0]
    while frontier and len(parents) < max_nodes:
        nxt = []
        for p in frontier:
            for _ in range(rng.choice((0, 1, 2, 3, 3)) if depths[p] < 6 else 0):
                if len(parents) >= max_nodes:
                    break
                parents.append(p)
                depths.append(depths[p] + 1)
                nxt.append(len(parents) - 1)
        frontier = nxt
    n = len(parents)
    has_children = set(parents[1:])
    truth = Truth()
    rows = []
    for v in range(n):
        leaf = v not in has_children and v > 0
        action = rng.choice("abc")
        reply_ids = [rng.randrange(1000) for _ in range(rng.randint(1, 4))] if token_ids and v else []
        if token_ids and v and rng.random() < 0.03:
            reply_ids = []  # a node without sampled ids: its paths yield no token rows
        logprobs = [f32(-rng.random() * 5) for _ in reply_ids]
        prefix_len, suffix = -1, []
        if not leaf and token_ids:
            suffix = [rng.randrange(1000, 2000) for _ in range(rng.randint(1, 4))]
            if v == 0:
                prefix_len, kept = 0, 0
                truth.ctx[v], truth.mask[v], truth.logprobs[v] = list(suffix), [0] * len(suffix), [0.0] * len(suffix)
            else:
                p = parents[v]
                base = truth.ctx[p]
                if rng.random() < 0.05:  # the prompt was truncated: not append-only
                    prefix_len = rng.randrange(len(base))
                    truth.ctx[v] = base[:prefix_len] + suffix
                else:
                    kept = len(reply_ids) - (1 if reply_ids and rng.random() < 0.3 else 0)  # cut by a token
                    prefix_len = len(base) + kept
                    truth.ctx[v] = base + reply_ids[:kept] + suffix
                    if p in truth.mask:  # only along append-only paths
                        truth.mask[v] = truth.mask[p] + [1] * kept + [0] * len(suffix)
                        truth.logprobs[v] = truth.logprobs[p] + logprobs[:kept] + [0.0] * len(suffix)
        stop = rng.choice(LEAF_STOPS) if leaf else ("expanded" if v in has_children else "open")
        reward = 0.0
        if stop == "done":
            reward = rng.choice((0.0, 0.0, 1.0, 1.0, 0.5))
        elif stop == "disaster":
            reward = -1.0
        rows.append(
            {
                "sweep": "s", "env": "word", "algorithm": "mcts", "model": "m", "seed": 0,
                "task": task, "tree": task, "node": v, "parent": parents[v], "depth": depths[v],
                "child_index": 0, "label": -1,
                "system_prompt": "You spell words.", "observation": f"o{v}", "user_message": f"Observation: o{v}",
                "num_valid_actions": 3, "thought": f"t{v}", "action": action,
                "reply": prompts.turn("go", action) if v else "",
                "token_ids": reply_ids, "logprobs": logprobs, "action_token_start": -1,
                "context_prefix_len": prefix_len, "context_suffix_ids": suffix,
                "prompt_tokens": 10, "cached_tokens": rng.choice((None, 0, 5)),
                "finish_reason": "stop", "constrained": rng.random() < 0.2, "temperature": 1.0, "sample_seed": 0,
                "reward": reward, "done": stop in ("done", "disaster"), "success": stop == "done" and reward == 1.0,
                "terminal": leaf and stop != "open", "stop_reason": stop,
                "value": rng.choice(VALUES), "visits": rng.choice((0, 1, 1, 2, 3)),
                "llm_ms": 0.0, "env_ms": 0.0,
            }
        )
    return pa.Table.from_pylist(rows, schema=TREE_SCHEMA), truth


class Rows:
    """Reference helpers over a table's python rows, independent of the code under test."""

    def __init__(self, table: pa.Table) -> None:
        self.rows = table.to_pylist()
        self.children: dict[int, list[int]] = {}
        for r in self.rows[1:]:
            self.children.setdefault(r["parent"], []).append(r["node"])

    def path(self, node: int) -> list[int]:
        out = [node]
        while self.rows[out[-1]]["parent"] >= 0:
            out.append(self.rows[out[-1]]["parent"])
        return out[::-1]

    def chat(self, node: int) -> list[dict]:
        row = self.rows[node]
        if row["parent"] < 0:
            return [{"role": "system", "content": row["system_prompt"]}, {"role": "user", "content": row["user_message"]}]
        return self.chat(row["parent"]) + [
            {"role": "assistant", "content": row["reply"]},
            {"role": "user", "content": row["user_message"]},
        ]

    def path_chat(self, leaf: int) -> list[dict]:
        """The chat at `leaf` without its final observation: ends on the leaf's reply."""
        return self.chat(leaf)[:-1]

    def leaves(self) -> list[int]:
        return [r["node"] for r in self.rows[1:] if r["node"] not in self.children]

    def ret(self, node: int) -> float:
        return sum(f32(self.rows[v]["reward"]) for v in self.path(node))


def rows_of(table: pa.Table | None) -> list[dict]:
    return table.to_pylist() if table is not None else []


trees = st.builds(random_tree, st.integers(0, 2**32 - 1), st.integers(1, 40))


# ---- properties ---------------------------------------------------------------------------


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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.integers(0, 2), st.integers(0, 5))
def test_every_dpo_pair_shares_its_prompt_and_meets_the_gap(tree, beta, min_visits, cap):
    table, _ = tree
    ref = Rows(table)
    pairs = rows_of(dpo_table(TreeView.of(table), DPOParams(beta=beta, min_visits=min_visits, max_trajectory_pairs_per_task=cap)))
    assert len({p["id"] for p in pairs}) == len(pairs)
    assert sum(p["kind"] == "trajectory" for p in pairs) <= cap
    for p in pairs:
        good, bad, split = ref.path(p["chosen_node"]), ref.path(p["rejected_node"]), p["prompt_node"]
        assert split in good and split in bad and good[good.index(split) + 1] != bad[bad.index(split) + 1]
        assert p["prompt"] == ref.chat(split)
        assert p["prompt"] + p["chosen"] == ref.path_chat(p["chosen_node"])
        assert p["prompt"] + p["rejected"] == ref.path_chat(p["rejected_node"])
        assert p["chosen"][-1]["role"] == p["rejected"][-1]["role"] == "assistant"
        chosen, rejected = ref.rows[p["chosen_node"]], ref.rows[p["rejected_node"]]
        if p["kind"] == "step":
            assert chosen["parent"] == rejected["parent"] == split
            assert len(p["chosen"]) == len(p["rejected"]) == 1 and chosen["reply"] != rejected["reply"]
            assert (p["chosen_reward"], p["rejected_reward"]) == (chosen["value"], rejected["value"])
            assert chosen["value"] - rejected["value"] >= beta and chosen["value"] > rejected["value"]
            assert chosen["visits"] >= min_visits and rejected["visits"] >= min_visits
        else:
            assert chosen["success"] and not rejected["success"] and rejected["stop_reason"] in EVALUATED
            assert p["chosen_node"] in ref.leaves() and p["rejected_node"] in ref.leaves()
            assert p["chosen_reward"] == pytest.approx(ref.ret(p["chosen_node"]))
            assert p["chosen_reward"] > p["rejected_reward"]
    # every qualifying sibling pair is there
    expected_steps = 0
    for kids in ref.children.values():
        ok = [k for k in kids if ref.rows[k]["visits"] >= min_visits]
        for i, a in enumerate(ok):
            for b in ok[i + 1 :]:
                va, vb = ref.rows[a]["value"], ref.rows[b]["value"]
                expected_steps += va != vb and abs(va - vb) >= beta and ref.rows[a]["reply"] != ref.rows[b]["reply"]
    assert sum(p["kind"] == "step" for p in pairs) == expected_steps


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.sampled_from([0.0, 0.2, 0.5]), st.sampled_from([0.0, 0.25, 0.5]))
def test_every_revision_is_bad_prefix_then_revision_then_good_suffix(tree, alpha, beta):
    table, _ = tree
    ref = Rows(table)
    rows = rows_of(revision_table(TreeView.of(table), RevisionParams(alpha=alpha, beta=beta, max_per_task=6)))
    if ref.rows[0]["value"] <= 0:
        assert rows == []
    assert len(rows) <= 6
    for r in rows:
        good, bad = ref.path(r["good_leaf"]), ref.path(r["bad_leaf"])
        g, b = ref.rows[good[-1]], ref.rows[bad[-1]]
        assert g["value"] - b["value"] > beta and g["value"] > alpha
        assert g["visits"] >= 1 and b["visits"] >= 1 and {g["stop_reason"], b["stop_reason"]} <= set(EVALUATED)
        split = r["shared_depth"]
        assert good[: split + 1] == bad[: split + 1] and good[split + 1] != bad[split + 1]
        cut = r["transition_depth"]
        assert split < cut <= len(bad) - 1 and bad[cut] == r["transition_node"]
        # the heuristic: the first step whose value falls below the good path's at that depth
        value = [ref.rows[v]["value"] for v in bad], [ref.rows[v]["value"] for v in good]
        below = [d for d in range(split + 1, len(bad)) if value[0][d] < value[1][min(d, len(good) - 1)]]
        assert r["transition_method"] == "heuristic" and cut == (below[0] if below else len(bad) - 1)
        messages = r["messages"]
        prefix = ref.chat(bad[cut])
        assert [{"role": m["role"], "content": m["content"]} for m in messages[: len(prefix)]] == prefix
        assert not any(m["loss"] for m in messages[: len(prefix)])
        turn, ack = messages[len(prefix)], messages[len(prefix) + 1]
        assert turn["role"] == "assistant" and turn["loss"]
        assert turn["content"] in [f"Thought: {t}\nAction: wait" for t in REVISION_THOUGHTS]
        assert ack == {"role": "user", "content": "ok.", "loss": False}
        suffix = messages[len(prefix) + 2 :]
        good_turns = ref.path_chat(good[-1])[len(ref.chat(good[split])) :]
        assert [{"role": m["role"], "content": m["content"]} for m in suffix] == good_turns
        assert all(m["loss"] == (m["role"] == "assistant") for m in suffix)


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
        lambda f: revision_table(f, revision, verifier),
        lambda f: token_rows(f).table,
    ):
        assert same(concat([build(view) for view in alone]), build(forest))
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


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from([None, 0.0, 0.25, 0.5]), st.integers(0, 5))
def test_pairs_from_the_cut_grid_are_those_of_the_whole_grid(seed, gap, cap):
    rng = random.Random(seed)
    forest = Forest.of([random_tree(rng.randrange(2**32), rng.randint(1, 40), task=i)[0] for i in range(rng.randint(1, 4))])
    score = np.array([rng.choice((0.0, 0.25, 0.5, 1.0, float("nan"))) for _ in range(forest.size)])
    good = forest.ranked(np.flatnonzero([rng.random() < 0.4 for _ in range(forest.size)]), -score, forest.depth)
    bad = forest.ranked(np.flatnonzero([rng.random() < 0.6 for _ in range(forest.size)]), score, forest.depth)
    expected = []
    for k in range(forest.n_trees):  # the whole grid, walked until `cap` pairs count
        g, b = [v for v in good if forest.tree_of[v] == k], [v for v in bad if forest.tree_of[v] == k]
        walk = [(g[i], b[j]) for total in range(len(g) + len(b)) for i in range(total + 1) for j in [total - i]
                if i < len(g) and j < len(b)]  # by rank sum, then good rank
        ok = [(x, y) for x, y in walk if (score[x] > score[y] if gap is None else score[x] - score[y] > gap)]
        expected += ok[:cap]
    chosen, rejected = grid_pairs(forest, good, bad, score, cap, gap)
    assert list(zip(chosen.tolist(), rejected.tolist())) == expected


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


# ---- the verifier -----------------------------------------------------------------------


def test_the_verifier_cuts_after_the_first_bad_step():
    table, _ = random_tree(1)
    view = TreeView.of(table)
    params = RevisionParams(alpha=0.0, beta=0.0, max_per_task=8)
    heuristic = rows_of(revision_table(view, params))
    if not heuristic:
        pytest.skip("seed gives no revision pair")  # pragma: no cover
    bad_steps: set[str] = set()
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["model"] == "judge" and body["messages"][-1]["content"] == QUESTION
        last_obs = body["messages"][-2]["content"]  # the judged step's observation
        asked.append(last_obs)
        verdict = "Bad" if last_obs in bad_steps else "Good"
        return httpx.Response(200, json={"choices": [{"message": {"content": f"Judgement: {verdict}"}}]})

    # judge the deepest step of each bad path Bad: the cut lands there, unless an earlier one is
    ref = Rows(table)
    bad_steps = {ref.rows[r["bad_leaf"]]["user_message"] for r in heuristic}
    client = httpx.Client(transport=httpx.MockTransport(answer))
    verifier = Verifier(VerifierConfig("http://verifier/v1", "judge"), client)
    rows = rows_of(revision_table(view, params, verifier))
    assert [r["bad_leaf"] for r in rows] == [r["bad_leaf"] for r in heuristic]
    for r in rows:
        assert r["transition_method"] == "verifier"
        bad = ref.path(r["bad_leaf"])
        first_bad = next(d for d in range(r["shared_depth"] + 1, len(bad)) if ref.rows[bad[d]]["user_message"] in bad_steps)
        assert r["transition_depth"] == first_bad
    assert len(asked) == len(set(asked)) == verifier.calls  # each step is judged once per tree


def test_a_verifier_that_cannot_be_reached_is_reported():
    table, _ = random_tree(1)

    def down(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    client = httpx.Client(transport=httpx.MockTransport(down))
    verifier = Verifier(VerifierConfig("http://verifier/v1", "judge", retries=1), client)
    with pytest.raises(Exception, match="verifier"):
        revision_table(TreeView.of(table), RevisionParams(alpha=0.0, beta=0.0), verifier)


# ---- the driver: parts, manifest, idempotence, spec parameters ------------------------------


def synthetic_sweep(root: Path, tasks: int = 12, datasets: dict | None = None) -> Path:
    sweep = root / "synthetic"
    store = LocalStore(sweep)
    for task in range(tasks):
        table, _ = random_tree(1000 + task, max_nodes=60, task=task)
        write_shard(store, task, table, "test")
    spec = {"name": "synthetic", "tasks": {"env": "frozenlake", "start": 0, "stop": tasks},
            "search": {"algorithm": "mcts"}, "output": str(root)}
    if datasets is not None:
        spec["datasets"] = datasets
    store.put("spec.yaml", json.dumps(spec).encode())
    return sweep


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_aggregation_writes_bounded_parts_a_manifest_last_and_is_idempotent(tmp_path):
    sweep = synthetic_sweep(tmp_path, datasets={"dpo": {"max_trajectory_pairs_per_task": 1}})
    (sweep / "datasets" / "old").mkdir(parents=True)
    (sweep / "datasets" / "old" / "part-00000.parquet").write_bytes(b"stale")
    result = aggregate(str(sweep), max_rows=7)
    out = sweep / "datasets"
    assert not (out / "old" / "part-00000.parquet").exists()
    manifest = json.loads((out / "_SUCCESS.json").read_text())
    assert manifest["params"]["dpo"]["max_trajectory_pairs_per_task"] == 1
    listed = {f["path"] for f in manifest["files"]}
    assert listed == set(files_under(out)) - {"_SUCCESS.json"}
    for f in manifest["files"]:
        data = (out / f["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
        if f["path"].endswith(".parquet"):
            assert pq.read_metadata(out / f["path"]).num_rows == f["rows"] <= 7
    for name, rows in result.rows.items():
        assert rows == sum(f.get("rows", 0) for f in manifest["files"] if f["path"].startswith(name + "/"))
    assert result.rows["tokens"] > 7 and result.rows["dpo"] > 0 and result.rows["sft"] > 0
    dpo = [r for p in sorted(out.glob("dpo/*.parquet")) for r in pq.read_table(p).to_pylist()]
    per_task = {}
    for r in dpo:
        per_task[r["task"]] = per_task.get(r["task"], 0) + (r["kind"] == "trajectory")
    assert max(per_task.values()) <= 1
    stats = json.loads((out / "stats.json").read_text())
    assert stats["trees"] == 12 and stats["datasets"] == dict(sorted(result.rows.items()))
    page = (out / "report.html").read_text()
    assert "<svg" in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing to fetch
    first = files_under(out)
    aggregate(str(sweep), max_rows=7)
    assert files_under(out) == first
    aggregate(str(sweep), max_rows=7, workers=2)  # worker processes build the same rows
    assert files_under(out) == first
    rows = dataset_rows(out)
    small = {"max_rows": 50, "max_bytes": 3_000}  # parts cut by Arrow bytes, which depend on the layout
    aggregate(str(sweep), **small)
    inline = files_under(out)
    assert inline != first
    aggregate(str(sweep), **small, workers=1)
    assert files_under(out) == inline
    many = {**small, "batch_nodes": 100}  # many forests: each tree's rows in the same order
    aggregate(str(sweep), **many)
    inline = files_under(out)
    aggregate(str(sweep), **many, workers=2)
    assert files_under(out) == inline
    assert dataset_rows(out) == rows and json.loads((out / "stats.json").read_text()) == stats


def test_shards_of_an_earlier_encoding_aggregate_beside_current_ones(tmp_path, monkeypatch):
    """A sweep resumed after an upgrade holds shards of both encodings (the earlier: zstd,
    every column a dictionary, statistics and the Arrow schema stored)."""
    current = synthetic_sweep(tmp_path / "current")
    aggregate(str(current))

    def earlier_encoding(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue().to_pybytes()

    mixed = tmp_path / "mixed"
    shutil.copytree(current, mixed)
    shutil.rmtree(mixed / "datasets")
    store = LocalStore(mixed)
    monkeypatch.setattr(shards, "to_parquet", earlier_encoding)
    for task in range(0, 12, 2):  # every other task rewritten the earlier way
        marker = read_marker(store, task)
        table = shards.read_shard(store, marker)
        store.delete(commit_key(task))
        store.delete(marker.data_key)
        write_shard(store, task, table, "earlier")
        assert read_marker(store, task).data_key != marker.data_key  # other bytes
    monkeypatch.undo()
    aggregate(str(mixed))
    assert dataset_rows(mixed / "datasets") == dataset_rows(current / "datasets")


def test_trees_in_batch_files_aggregate_as_trees_in_their_own_files(tmp_path):
    """The same trees, one data file each or several to a file (in batches whose tasks
    interleave across the aggregation's forests), give the same datasets."""
    single = synthetic_sweep(tmp_path / "single")
    batched = tmp_path / "batched"
    store = LocalStore(batched)
    store.put("spec.yaml", (single / "spec.yaml").read_bytes())
    trees = [(ref.task, table) for ref, table in iter_shards(LocalStore(single))]
    for batch in ([0, 5, 11], [1, 2, 3, 4], [6], [7, 8, 9, 10]):
        assert set(write_shards(store, [trees[t] for t in batch], "w").values()) == {CommitStatus.COMMITTED}
    assert len(list(store.list("trees/data/"))) == 4
    for options in ({}, {"batch_nodes": 100}, {"batch_nodes": 100, "workers": 2}):
        aggregate(str(single), **options)
        aggregate(str(batched), **options)
        parts = {k: v for k, v in files_under(single / "datasets").items() if k.endswith(".parquet")}
        assert parts == {k: v for k, v in files_under(batched / "datasets").items() if k.endswith(".parquet")}
        assert len(parts) >= 5


def test_worker_processes_fetch_their_own_shards_from_s3(tmp_path, s3_server, aws_env):
    """S3Store pickles as its URI and settings: each worker process opens its own client."""
    local = synthetic_sweep(tmp_path)
    aggregate(str(local))
    uri = f"s3://{s3_server.make_bucket('agg')}/synthetic"
    store = open_store(uri)
    for path in sorted(local.rglob("*")):
        key = path.relative_to(local).as_posix()
        if path.is_file() and not key.startswith("datasets/"):
            store.put(key, path.read_bytes())
    aggregate(uri, workers=2, batch_nodes=100)  # many forests, each fetched by a worker
    parts = {key: store.get(key) for key in store.list("datasets/") if key.endswith(".parquet")}
    expected = {f"datasets/{k}": v for k, v in files_under(local / "datasets").items() if k.endswith(".parquet")}
    assert len(parts) >= 5 and parts == expected


def dataset_rows(out: Path) -> dict[str, list[dict]]:
    parts = {p.name: sorted(p.glob("*.parquet")) for p in sorted(out.iterdir()) if p.is_dir()}
    return {name: [row for f in files for row in pq.read_table(f).to_pylist()] for name, files in parts.items()}


def test_tables_from_worker_processes_keep_their_arrow_layout():
    texts = pa.array(["a", None, "ccc"]).take(pa.array([2, 0, 0]))  # a bitmap without nulls
    messages = pa.ListArray.from_arrays(pa.array([0, 1, 3], pa.int32()), pa.StructArray.from_arrays([texts], ["c"]))
    table = pa.table({"messages": messages, "texts": texts.take(pa.array([1, 2])), "n": [1, 2]})
    sent = TreeOutput({"x": table}, SweepStats())
    back = pickle.loads(pickle.dumps(sent)).tables["x"]
    assert back.equals(table) and back.schema == table.schema
    assert back.nbytes == table.nbytes != pickle.loads(pickle.dumps(table)).nbytes
    assert pa.concat_tables([back, back]).combine_chunks().nbytes == pa.concat_tables([table, table]).combine_chunks().nbytes


def test_cli_flags_override_the_spec_and_bad_parameters_are_one_line_errors(tmp_path):
    sweep = synthetic_sweep(tmp_path, tasks=3, datasets={"revision": {"alpha": 0.9}})
    result = aggregate(str(sweep), {"revision": {"alpha": 0.1, "beta": None}})
    manifest = json.loads((sweep / "datasets" / "_SUCCESS.json").read_text())
    assert manifest["params"]["revision"] == {"alpha": 0.1, "beta": 0.5, "max_per_task": 4}
    assert result.stats["trees"] == 3
    with pytest.raises(BadInput, match="datasets.dpo.beta"):
        aggregate(str(sweep), {"dpo": {"beta": -1}})
    with pytest.raises(BadInput, match="no committed trees"):
        aggregate(str(tmp_path / "nothing"))
    spec = {"name": "a", "tasks": {"env": "frozenlake", "stop": 2}, "search": {"algorithm": "mcts"},
            "policy": {"kind": "uniform"}, "output": "o"}
    assert parse_spec({**spec, "datasets": {"sft": {"min_reward": 1.0}}}).datasets == DatasetsSpec(sft=SFTParams(min_reward=1.0))
    with pytest.raises(BadInput, match="datasets.sft.typo"):
        parse_spec({**spec, "datasets": {"sft": {"typo": 1}}})


# ---- end to end through the command line -----------------------------------------------------


def thicket(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([THICKET, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def load(folder: Path, name: str, cache: Path):
    import datasets

    files = sorted(str(p) for p in (folder / name).glob("*.parquet"))
    return datasets.load_dataset("parquet", data_files={"train": files}, split="train", cache_dir=str(cache))


def on_a_terminal(*args: str, timeout: float = 120) -> str:
    """What `thicket ARGS` writes to stderr when stderr is a terminal (a pseudo-terminal)."""
    main, side = pty.openpty()
    try:
        done = subprocess.run([THICKET, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=side, timeout=timeout,
                              env={**os.environ, "COLUMNS": "160", "TERM": "xterm"})
        os.close(side)
        side = -1
        out = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other end closed: all read
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(main)
        if side >= 0:
            os.close(side)
    assert done.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_aggregate_shows_its_progress_on_a_terminal_only(tmp_path):
    sweep = synthetic_sweep(tmp_path)
    nodes = sum(m.rows for m in shards.committed_shards(LocalStore(sweep)))
    shown = on_a_terminal("aggregate", str(sweep), "--workers", "0")
    assert "trees" in shown and "12/12" in shown and f"{nodes} nodes" in shown, shown
    assert "12/12" not in on_a_terminal("aggregate", str(sweep), "--no-progress")
    piped = thicket("aggregate", str(sweep))
    assert piped.returncode == 0 and "12/12" not in piped.stderr + piped.stdout


def test_run_then_aggregate_end_to_end_loads_with_hf_datasets_and_reruns_identically(tmp_path):
    spec = tmp_path / "fl.yaml"
    spec.write_text(
        "name: fl\n"
        "tasks: {env: frozenlake, env_args: {size: 4, is_slippery: false}, start: 0, stop: 4, per_index: 4}\n"
        "search: {algorithm: dense, width: 3, max_depth: 8, run_budget: 12, target_pairs: 4}\n"
        "policy: {kind: uniform}\n"
        "output: out\n"
        "datasets: {dpo: {max_trajectory_pairs_per_task: 2}}\n"
    )
    ran = thicket("run", str(spec), "--output", str(tmp_path), "--no-progress")
    assert ran.returncode == 0, ran.stderr
    out = tmp_path / "fl" / "datasets"
    assert "datasets     file://" in ran.stdout and (out / "_SUCCESS.json").is_file()
    manifest = json.loads((out / "_SUCCESS.json").read_text())
    assert manifest["datasets"]["sft"] > 0 and manifest["datasets"]["dpo"] > 0 and manifest["datasets"]["revision"] > 0
    assert manifest["datasets"]["tokens"] == 0  # the uniform policy samples no token ids
    for name in ("sft", "sft_fastchat", "dpo", "revision"):
        ds = load(out, name, tmp_path / "hf")
        assert len(ds) == manifest["datasets"][name]
    assert set(load(out, "dpo", tmp_path / "hf").column_names) >= {"prompt", "chosen", "rejected"}
    first = files_under(out)
    again = thicket("aggregate", str(tmp_path / "fl"))
    assert again.returncode == 0, again.stderr
    assert "sft" in again.stdout and files_under(out) == first
    skipped = thicket("run", str(spec), "--output", str(tmp_path / "b"), "--no-progress", "--no-aggregate", "--indices", "0")
    assert skipped.returncode == 0 and not (tmp_path / "b" / "fl" / "datasets").exists()


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
