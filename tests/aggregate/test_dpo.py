"""The DPO datasets over random trees, against oracles written from the methods' definitions
(ETO's trajectory pairs, DensePolicy's sibling pairs) over the trees' plain rows:

- every `dpo` pair shares its prompt; a trajectory pair is an evaluated success over an
  evaluated failure with a lower return (the path's return by the tree's reward semantics,
  recomputed here from the rewards), a step pair two evaluated siblings whose values differ by
  at least beta, the higher one chosen; every such sibling pair is there;
- `dpo_first_turn` holds each pair of steps where `dpo` pairs part once, oriented by the two
  steps' own values (not by the pair it came from), with those values as rewards;
- across a whole aggregated sweep, no prompt carries A over B and B over A, and no row repeats.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.dataset_checks import steps_of
from tests.support.random_trees import Rows, dataset_rows, random_tree, rows_of, trees
from thicket.aggregate.content import PairKeys
from thicket.aggregate.dpo import dpo_table, dpo_tables
from thicket.aggregate.driver import aggregate
from thicket.aggregate.forest import Forest
from thicket.aggregate.pairs import grid_pairs
from thicket.aggregate.params import DPOParams
from thicket.aggregate.view import TreeView
from thicket.shards.storage import write_shard
from thicket.storage.store import LocalStore

EVALUATED_STOPS = ("done", "depth_limit", "disaster")  # the leaves whose score is known


def plain(messages: list[dict]) -> list[dict]:
    """Messages without their loss flags."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def expected_step_pairs(ref: Rows, beta: float, min_visits: int) -> dict[tuple[int, int], tuple[float, float]]:
    """Every (chosen, rejected) pair of sibling steps by DensePolicy's rule, with their values: both
    evaluated (visits >= 1 and >= min_visits), values apart by >= beta and unequal."""
    out = {}
    for kids in ref.children.values():
        steps = list(steps_of(ref, kids).items())
        for i, (a, (na, va)) in enumerate(steps):
            for b, (nb, vb) in steps[i + 1 :]:
                if min(na, nb) >= max(min_visits, 1) and va != vb and abs(va - vb) >= beta - 1e-9:
                    out[(a, b) if va > vb else (b, a)] = (max(va, vb), min(va, vb))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.sampled_from([0.0, 0.25, 0.5, 1.0]), st.integers(1, 2), st.integers(0, 5))
def test_every_dpo_pair_shares_its_prompt_and_rests_on_its_definition(tree, beta, min_visits, cap):
    table, _ = tree
    ref = Rows(table)
    pairs = rows_of(dpo_table(TreeView.of(table), DPOParams(beta=beta, min_visits=min_visits, max_trajectory_pairs_per_task=cap)))
    assert len({p["id"] for p in pairs}) == len(pairs)
    assert sum(p["kind"] == "trajectory" for p in pairs) <= cap
    for p in pairs:
        good, bad, split = ref.path(p["chosen_node"]), ref.path(p["rejected_node"]), p["prompt_node"]
        assert split in good and split in bad and good[good.index(split) + 1] != bad[bad.index(split) + 1]
        assert p["prompt"] == ref.chat(split)
        assert p["prompt"] + plain(p["chosen"]) == ref.path_chat(p["chosen_node"])
        assert p["prompt"] + plain(p["rejected"]) == ref.path_chat(p["rejected_node"])
        assert p["chosen"][-1]["role"] == p["rejected"][-1]["role"] == "assistant"
        chosen, rejected = ref.rows[p["chosen_node"]], ref.rows[p["rejected_node"]]
        if p["kind"] == "trajectory":
            assert chosen["success"] and not rejected["success"]
            assert chosen["stop_reason"] in EVALUATED_STOPS and rejected["stop_reason"] in EVALUATED_STOPS
            assert p["chosen_node"] in ref.leaves() and p["rejected_node"] in ref.leaves()
            assert p["chosen_reward"] == pytest.approx(ref.ret(p["chosen_node"]), abs=1e-6)
            assert p["rejected_reward"] == pytest.approx(ref.ret(p["rejected_node"]), abs=1e-6)
            assert p["chosen_reward"] > p["rejected_reward"]
    expected = expected_step_pairs(ref, beta, min_visits)
    steps = {(p["chosen_node"], p["rejected_node"]): (p["chosen_reward"], p["rejected_reward"])
             for p in pairs if p["kind"] == "step"}
    assert set(steps) == set(expected)
    for key, rewards in steps.items():
        assert rewards == pytest.approx(expected[key], abs=1e-6)


def test_a_running_score_pair_carries_the_paths_last_scores_not_their_sums():
    """The reported defect: on a running-score env (TextWorld, ScienceWorld) a path's return is its
    last score; a sum of running scores (5.667 for a path scored 1.0) is no return at all."""
    for seed in range(400):
        table, _ = random_tree(seed, 40, semantics="running")
        ref = Rows(table)
        pairs = [p for p in rows_of(dpo_table(TreeView.of(table), DPOParams())) if p["kind"] == "trajectory"]
        summed = {p["chosen_node"]: sum(ref.rows[v]["reward"] for v in ref.path(p["chosen_node"])) for p in pairs}
        if any(abs(s - 1.0) > 1e-6 for s in summed.values()):  # a tree where the two readings differ
            break
    else:
        pytest.fail("no random running-score tree with a pair whose rewards sum past 1")
    for p in pairs:
        assert p["chosen_reward"] == pytest.approx(1.0)  # a success's last score
        assert p["rejected_reward"] == pytest.approx(ref.rows[p["rejected_node"]]["reward"])


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


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees, st.sampled_from([0.0, 0.5]), st.integers(1, 2), st.integers(1, 4))
def test_first_turn_pairs_are_step_preferences_resting_on_the_steps_values(tree, beta, min_visits, cap):
    """`dpo` sides run on through the env's observations, flagged out of the loss; `dpo_first_turn`
    takes, in order, each pair of steps where a `dpo` pair parts, once whatever its order, and
    keeps it where the steps' own values make a step pair: chosen is the step of higher value."""
    table, _ = tree
    ref = Rows(table)
    params = DPOParams(beta=beta, min_visits=min_visits, max_trajectory_pairs_per_task=cap)
    full, first = dpo_tables(TreeView.of(table), params)
    pairs, firsts = rows_of(full and full.table), rows_of(first and first.table)
    for p in pairs:
        for side in (p["chosen"], p["rejected"]):
            assert [m["loss"] for m in side] == [m["role"] == "assistant" for m in side]
            assert side[0]["loss"] and side[-1]["loss"]
    def step(node: int) -> int:  # the first sibling with the same reply
        row = ref.rows[node]
        return next(k for k in ref.children[row["parent"]] if ref.rows[k]["reply"] == row["reply"])

    parts: dict[frozenset[int], dict] = {}
    for p in pairs:
        good, bad = ref.path(p["chosen_node"]), ref.path(p["rejected_node"])
        at = good.index(p["prompt_node"]) + 1
        parts.setdefault(frozenset((step(good[at]), step(bad[at]))), p)
    allowed = expected_step_pairs(ref, beta, min_visits)
    expected = [(a, b) for a, b in allowed if frozenset((a, b)) in parts]
    order = list(parts)
    expected.sort(key=lambda ab: order.index(frozenset(ab)))
    assert [(f["chosen_node"], f["rejected_node"]) for f in firsts] == expected
    for f in firsts:
        chosen, rejected = ref.rows[f["chosen_node"]], ref.rows[f["rejected_node"]]
        assert f["prompt"] == ref.chat(chosen["parent"]) and f["prompt"][-1]["role"] == "user"
        assert f["prompt_node"] == chosen["parent"] == rejected["parent"]
        assert f["chosen"] == [{"role": "assistant", "content": chosen["reply"]}]
        assert f["rejected"] == [{"role": "assistant", "content": rejected["reply"]}]
        pair = (f["chosen_node"], f["rejected_node"])
        assert (f["chosen_reward"], f["rejected_reward"]) == pytest.approx(allowed[pair], abs=1e-6)
        assert f["kind"] == parts[frozenset(pair)]["kind"]
    assert len({f["id"] for f in firsts}) == len(firsts)
    if first is not None:
        assert len(first.keys) == first.table.num_rows


def test_pair_keys_drop_contradictions_everywhere_and_repeats_but_once():
    low = np.array([1, 1, 2, 1, 3, 3], dtype=np.uint64)
    high = np.array([5, 5, 6, 5, 4, 4], dtype=np.uint64)
    forward = np.array([True, True, True, False, True, True])
    keep, contradicting, repeated = PairKeys(low, high, forward).verdict()
    assert keep.tolist() == [False, False, True, False, True, False]
    assert (contradicting, repeated) == (3, 1)


def preference_key(row: dict) -> tuple[str, str, str]:
    return tuple(json.dumps(plain(row[k]) if k != "prompt" else row[k], sort_keys=True)
                 for k in ("prompt", "chosen", "rejected"))


def test_an_aggregated_sweep_holds_no_contradicting_or_repeated_preference(tmp_path):
    """Trees of one task state that repeats (as CliffWalking's every task, or Taxi's and math's
    that wrap) hold the same prompts; their values differ from tree to tree, so one tree may
    prefer A to B and another B to A. Across forests too (one tree a batch): none of both is
    kept, and a pair that repeats is kept once."""
    sweep = tmp_path / "sweep"
    store = LocalStore(sweep)
    tables = []
    for task in range(24):
        table, _ = random_tree(7000 + task % 3, max_nodes=40, task=task)
        rng = random.Random(task)  # the same texts, other values: as a new sample of the same states
        values = [rng.choice((0.0, 0.25, 0.5, 1.0)) for _ in range(table.num_rows)]
        table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.float32()))
        tables.append(table)
        write_shard(store, task, table, "test")
    unfiltered = defaultdict(set)
    for table in tables:
        full, _ = dpo_tables(TreeView.of(table), DPOParams(beta=0.25))
        for row in rows_of(full and full.table):
            p, c, r = preference_key(row)
            unfiltered[p].add((c, r))
    assert any((r, c) in seen for seen in unfiltered.values() for c, r in seen), "the trees must disagree somewhere"
    result = aggregate(str(sweep), overrides={"dpo": {"beta": 0.25}}, batch_nodes=1)
    rows = dataset_rows(sweep / "datasets")
    for name in ("dpo", "dpo_first_turn"):
        seen = defaultdict(set)
        for row in rows.get(name, []):
            p, c, r = preference_key(row)
            assert (c, r) not in seen[p], f"{name}: a repeated pair"
            assert (r, c) not in seen[p], f"{name}: a prompt with A over B and B over A"
            seen[p].add((c, r))
        dropped = result.stats["preference_rows_dropped"][name]
        assert dropped["contradicting"] > 0 and result.rows[name] == len(rows.get(name, []))
    manifest = json.loads((sweep / "datasets" / "_SUCCESS.json").read_text())
    assert manifest["datasets"]["dpo"] == result.rows["dpo"]
