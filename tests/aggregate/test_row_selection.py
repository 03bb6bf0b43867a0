"""What a row is worth, stated and selectable, against brute force over the trees' plain rows:

- SFT `rows: best` keeps each task's best success; `rows: distinct` the best path of each distinct
  action sequence that succeeded (FastChat rows follow);
- step pairs whose two sides take the same action (their thoughts differ) are absent by default,
  present with `thought_pairs` where the env is deterministic (real FrozenLake trees), never in a
  slippery one, and counted in stats.json; shards record whether the env declared itself deterministic.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.dataset_checks import steps_of
from tests.support.env_server import started
from tests.support.random_trees import Rows, random_tree, rows_of
from thicket.aggregate.dpo import dpo_tables
from thicket.aggregate.driver import aggregate
from thicket.aggregate.forest import Forest
from thicket.aggregate.params import DPOParams, SFTParams
from thicket.aggregate.sft import sft_tables
from thicket.envs.client import ClientConfig, EnvClient
from thicket.envs.toytext import FrozenLakeText
from thicket.errors import BadInput
from thicket.policy import prompts
from thicket.policy.base import Policy, Reply
from thicket.search import grow
from thicket.search.expand import Expander
from thicket.search.mcts import MCTSParams
from thicket.shards.storage import iter_shards, write_shard
from thicket.shards.table import TreeMeta, tree_table
from thicket.storage.store import LocalStore

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")


# ---- SFT: best or distinct -------------------------------------------------------------------


def actions(ref: Rows, node: int) -> tuple[str, ...]:
    return tuple(ref.rows[v]["action"] for v in ref.path(node)[1:])


def expected_sft(table, rows: str, min_reward: float | None) -> list[int]:
    """The leaves of a tree's SFT rows, in order: its successes (return >= min_reward), best first
    (highest return, fewest steps, lowest id); `best` the first, `distinct` the first of each
    action sequence."""
    ref = Rows(table)
    won = [v for v in range(1, len(ref.rows)) if ref.rows[v]["success"]
           and (min_reward is None or ref.ret(v) >= min_reward)]
    won.sort(key=lambda v: (-ref.ret(v), ref.rows[v]["depth"], v))
    if rows == "best":
        return won[:1]
    seen: dict[tuple[str, ...], int] = {}
    for v in won:
        seen.setdefault(actions(ref, v), v)
    return list(seen.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=4), st.sampled_from(["best", "distinct"]),
       st.sampled_from([None, 0.5, 1.0]))
def test_sft_rows_are_the_best_success_or_the_best_of_each_distinct_action_sequence(seeds, rows, min_reward):
    tables = [random_tree(seed, 60, task=task)[0] for task, seed in enumerate(seeds)]
    out = sft_tables(Forest.of(tables), SFTParams(rows=rows, min_reward=min_reward))
    expected = [(task, leaf) for task, table in enumerate(tables) for leaf in expected_sft(table, rows, min_reward)]
    if not expected:
        assert out is None
        return
    sft, fastchat = rows_of(out[0]), rows_of(out[1])
    assert [(r["task"], r["leaf"]) for r in sft] == expected
    for r in sft:
        ref = Rows(tables[r["task"]])
        assert r["messages"] == ref.path_chat(r["leaf"]) and r["steps"] == len(actions(ref, r["leaf"]))
    if rows == "distinct":  # no two rows of a task take the same actions
        paths = [(r["task"], actions(Rows(tables[r["task"]]), r["leaf"])) for r in sft]
        assert len(set(paths)) == len(paths)
    assert [f["id"] for f in fastchat] == [r["id"] for r in sft]


def test_distinct_sft_rows_count_the_distinct_successes_of_stats(tmp_path):
    """With no min_reward, `distinct` gives one row per distinct successful action sequence: the
    count search_quality reports (reckoned apart from the SFT rows)."""
    sweep = tmp_path / "sweep"
    store = LocalStore(sweep)
    for task in range(8):
        write_shard(store, task, random_tree(500 + task, 60, task=task)[0], "test")
    store.put("spec.yaml", yaml.safe_dump({"name": "s", "datasets": {"sft": {"rows": "distinct"}}}).encode())
    stats = aggregate(str(sweep), workers=0).stats
    assert stats["datasets"]["sft"] == stats["search_quality"]["distinct_successful_trajectories"]
    assert stats["datasets"]["sft"] > stats["solved_trees"]  # some task has two successful sequences
    card = (sweep / "datasets" / "README.md").read_text()
    assert "rows: distinct" in card


def test_a_bad_rows_value_is_a_one_line_error_naming_the_field(tmp_path):
    sweep = tmp_path / "sweep"
    store = LocalStore(sweep)
    write_shard(store, 0, random_tree(1, 20)[0], "test")
    store.put("spec.yaml", yaml.safe_dump({"name": "s", "datasets": {"sft": {"rows": "all"}}}).encode())
    with pytest.raises(BadInput, match=r"datasets\.sft\.rows"):
        aggregate(str(sweep), workers=0)
    ran = subprocess.run([THICKET, "aggregate", str(sweep), "--sft-rows", "all"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 2 and "--sft-rows" in ran.stderr


# ---- same-action step pairs, on real FrozenLake trees ----------------------------------------


class HunchPolicy(Policy):
    """Sample i picks a valid action at random and one of three thoughts: siblings often take one
    action with different thoughts."""

    name = "hunch"

    async def propose(self, messages, n, *, valid_actions, seed, temperature=None) -> list[Reply]:
        out = []
        for i in range(n):
            rng = random.Random(seed + i)
            action, thought = rng.choice(valid_actions), f"hunch {rng.randrange(3)}"
            out.append(Reply(text=prompts.turn(thought, action), thought=thought, action=action, seed=seed + i))
        return out

    async def act(self, messages, thought, *, valid_actions, seed, temperature=None) -> Reply:
        raise AssertionError("propose's replies are whole turns")


META = TreeMeta(sweep="s", env="frozenlake", algorithm="mcts", model="m", seed=0)


async def _grown(task: int, slippery: bool):
    x = await Expander.open(FrozenLakeText(size=4, is_slippery=slippery), task, HunchPolicy(), 0,
                            max_depth=8, max_nodes=300)
    await grow(x, MCTSParams(iterations=40, expansions=4, max_depth=8))
    return tree_table(x.tree, META)


def frozenlake_trees(slippery: bool, tasks: int = 3) -> list:
    return [asyncio.run(_grown(task, slippery)) for task in range(tasks)]


def step_pairs_by_action(table, beta: float) -> dict[tuple[int, int], bool]:
    """Every (chosen, rejected) step pair of DensePolicy's rule (sibling steps, both evaluated,
    values apart by >= beta and unequal), and whether its two sides take the same action."""
    ref = Rows(table)
    out = {}
    for kids in ref.children.values():
        steps = list(steps_of(ref, kids).items())
        for i, (a, (na, va)) in enumerate(steps):
            for b, (nb, vb) in steps[i + 1:]:
                if min(na, nb) >= 1 and va != vb and abs(va - vb) >= beta - 1e-9:
                    out[(a, b) if va > vb else (b, a)] = ref.rows[a]["action"] == ref.rows[b]["action"]
    return out


def same_action_rows(table, rows: list[dict]) -> int:
    ref = Rows(table)
    return sum(ref.rows[r["chosen_node"]]["action"] == ref.rows[r["rejected_node"]]["action"] for r in rows)


@pytest.fixture(scope="module")
def still_lake() -> list:
    return frozenlake_trees(slippery=False)


def test_shards_record_whether_the_env_is_deterministic(still_lake):
    slippery = frozenlake_trees(slippery=True, tasks=1)
    assert set(still_lake[0].column("deterministic").to_pylist()) == {True}
    assert set(slippery[0].column("deterministic").to_pylist()) == {False}


def test_an_env_server_says_whether_the_env_is_deterministic():
    server = started(["frozenlake"])
    try:
        async def declared(slippery: bool) -> tuple[bool, bool]:
            client = EnvClient(ClientConfig(server.url))
            try:
                info = await client.describe("frozenlake", {"is_slippery": slippery})
                env = await client.env("frozenlake", {"is_slippery": slippery})
                return info.deterministic, env.deterministic
            finally:
                await client.aclose()

        assert asyncio.run(declared(False)) == (True, True)
        assert asyncio.run(declared(True)) == (False, False)
    finally:
        server.stop()


@pytest.mark.parametrize("thought_pairs", [False, True])
def test_same_action_step_pairs_are_dropped_unless_asked_for_in_a_deterministic_env(still_lake, thought_pairs):
    params = DPOParams(beta=0.0, thought_pairs=thought_pairs)
    for table in still_lake:
        tally: Counter[str] = Counter()
        full, first = dpo_tables(Forest.of([table]), params, tally=tally)
        steps = [r for r in rows_of(full and full.table) if r["kind"] == "step"]
        expected = step_pairs_by_action(table, 0.0)
        same = sum(expected.values())
        wanted = {pair for pair, alike in expected.items() if thought_pairs or not alike}
        assert {(r["chosen_node"], r["rejected_node"]) for r in steps} == wanted
        assert tally["dpo/kept" if thought_pairs else "dpo/dropped"] == same
        assert tally["dpo/dropped" if thought_pairs else "dpo/kept"] == 0
        firsts = rows_of(first and first.table)
        assert same_action_rows(table, firsts) == (tally["dpo_first_turn/kept"] if thought_pairs else 0)
    assert sum(sum(step_pairs_by_action(t, 0.0).values()) for t in still_lake) > 0  # the case arose


def test_a_slippery_env_keeps_no_same_action_pair_even_when_asked():
    """There the two sides may land in different states by chance: their gap is no preference."""
    lake = frozenlake_trees(slippery=True)
    for table in lake:
        tally: Counter[str] = Counter()
        full, first = dpo_tables(Forest.of([table]), DPOParams(beta=0.0, thought_pairs=True), tally=tally)
        steps = [r for r in rows_of(full and full.table) if r["kind"] == "step"]
        expected = step_pairs_by_action(table, 0.0)
        assert {(r["chosen_node"], r["rejected_node"]) for r in steps} == {p for p, alike in expected.items() if not alike}
        assert same_action_rows(table, rows_of(first and first.table)) == 0
        assert tally["dpo/dropped"] == sum(expected.values()) and tally["dpo/kept"] == 0
    assert sum(sum(step_pairs_by_action(t, 0.0).values()) for t in lake) > 0


def test_stats_count_the_same_action_pairs_and_the_card_states_the_rule(tmp_path, still_lake):
    sweep = tmp_path / "sweep"
    store = LocalStore(sweep)
    for task, table in enumerate(still_lake):
        write_shard(store, task, table, "test")
    store.put("spec.yaml", yaml.safe_dump({"name": "lake", "datasets": {"dpo": {"beta": 0.0}}}).encode())
    same = sum(sum(step_pairs_by_action(t, 0.0).values()) for t in still_lake)
    counted = aggregate(str(sweep), workers=0).stats["preference_rows_same_action"]
    assert counted["dpo"] == {"dropped": same, "kept": 0}
    on_disk = json.loads((sweep / "datasets" / "stats.json").read_text())
    assert on_disk["preference_rows_same_action"] == counted
    card = (sweep / "datasets" / "README.md").read_text()
    assert "thought_pairs: false" in card and "same action" in card
    ran = subprocess.run([THICKET, "aggregate", str(sweep), "--dpo-thought-pairs", "--no-progress"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    stats = json.loads((sweep / "datasets" / "stats.json").read_text())
    assert stats["preference_rows_same_action"]["dpo"] == {"dropped": 0, "kept": same}
    rows = [row for _, table in iter_shards(store) for row in table.to_pylist()]
    assert {row["deterministic"] for row in rows} == {True}
