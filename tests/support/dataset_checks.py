"""The invariants the dataset property tests check (tests/aggregate/test_sft.py, test_dpo.py,
test_revision.py), for rows a real sweep wrote: each row against its tree's shard rows (Rows),
with oracles from the methods' definitions (a path's return recomputed from its rewards by its
env's reward semantics, evaluated leaves by their stop reason)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.random_trees import Rows, dataset_rows
from thicket.shards.storage import iter_shards
from thicket.storage.store import LocalStore
from thicket.aggregate.revision import REVISION_THOUGHTS
from thicket.aggregate.view import EVALUATED


def plain(messages: list[dict]) -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def check_sft(ref: Rows, row: dict) -> None:
    """The best successful path (highest return, then fewest steps), as the exact chat."""
    ok = [v for v in ref.leaves() if ref.rows[v]["success"]]
    best = min(ok, key=lambda v: (-ref.ret(v), ref.rows[v]["depth"], v))
    assert row["leaf"] == best and row["messages"] == ref.path_chat(best)
    assert row["messages"][-1]["role"] == "assistant"


def check_dpo(ref: Rows, pair: dict, beta: float) -> None:
    """Both sides share the prompt and extend it to their own node's chat; a step pair's
    sides are siblings a value gap apart, a trajectory pair is a success against an ended failure."""
    good, bad, split = ref.path(pair["chosen_node"]), ref.path(pair["rejected_node"]), pair["prompt_node"]
    assert split in good and split in bad and good[good.index(split) + 1] != bad[bad.index(split) + 1]
    assert pair["prompt"] == ref.chat(split)
    assert pair["prompt"] + plain(pair["chosen"]) == ref.path_chat(pair["chosen_node"])
    assert pair["prompt"] + plain(pair["rejected"]) == ref.path_chat(pair["rejected_node"])
    assert pair["chosen"][-1]["role"] == pair["rejected"][-1]["role"] == "assistant"
    chosen, rejected = ref.rows[pair["chosen_node"]], ref.rows[pair["rejected_node"]]
    if pair["kind"] == "step":
        check_step(ref, pair, beta)
        assert chosen["parent"] == rejected["parent"] == split
    else:
        assert pair["kind"] == "trajectory"
        assert chosen["success"] and not rejected["success"]
        assert chosen["stop_reason"] in EVALUATED and rejected["stop_reason"] in EVALUATED
        assert pair["chosen_reward"] == pytest.approx(ref.ret(pair["chosen_node"]), abs=1e-6)
        assert pair["rejected_reward"] == pytest.approx(ref.ret(pair["rejected_node"]), abs=1e-6)
        assert pair["chosen_reward"] > pair["rejected_reward"]


def steps_of(ref: Rows, kids: list[int]) -> dict[int, tuple[int, float]]:
    """Sibling nodes with the same reply are one step, named by its first node: (visits, value),
    its nodes' values weighted by their visits (the mean of all the evaluated leaves below)."""
    by_reply: dict[str, list[int]] = {}
    for k in kids:
        by_reply.setdefault(ref.rows[k]["reply"], []).append(k)
    out = {}
    for nodes in by_reply.values():
        visits = sum(ref.rows[k]["visits"] for k in nodes)
        value = (sum(ref.rows[k]["value"] * ref.rows[k]["visits"] for k in nodes) / visits if visits
                 else ref.rows[nodes[0]]["value"])
        out[nodes[0]] = (visits, value)
    return out



def check_step(ref: Rows, pair: dict, beta: float) -> None:
    """Two evaluated sibling steps (each the first of its same-reply siblings) a value gap apart,
    the higher one chosen; the rewards are the two steps' values."""
    chosen, rejected = ref.rows[pair["chosen_node"]], ref.rows[pair["rejected_node"]]
    assert chosen["parent"] == rejected["parent"] and chosen["reply"] != rejected["reply"]
    steps = steps_of(ref, ref.children[chosen["parent"]])
    (n_chosen, v_chosen), (n_rejected, v_rejected) = steps[pair["chosen_node"]], steps[pair["rejected_node"]]
    assert n_chosen >= 1 and n_rejected >= 1
    assert v_chosen - v_rejected >= beta - 1e-9 and v_chosen > v_rejected
    assert (pair["chosen_reward"], pair["rejected_reward"]) == pytest.approx((v_chosen, v_rejected), abs=1e-6)


def check_first_turn(ref: Rows, pair: dict, beta: float) -> None:
    chosen, rejected = ref.rows[pair["chosen_node"]], ref.rows[pair["rejected_node"]]
    check_step(ref, pair, beta)
    assert pair["prompt"] == ref.chat(chosen["parent"])
    assert pair["chosen"] == [{"role": "assistant", "content": chosen["reply"]}]
    assert pair["rejected"] == [{"role": "assistant", "content": rejected["reply"]}]


def check_no_contradiction(rows: list[dict]) -> None:
    """No prompt carries A over B and B over A, and no pair repeats."""
    seen: dict[str, set] = defaultdict(set)
    for row in rows:
        prompt = json.dumps(row["prompt"], sort_keys=True)
        sides = tuple(json.dumps(plain(row[k]), sort_keys=True) for k in ("chosen", "rejected"))
        assert sides not in seen[prompt] and sides[::-1] not in seen[prompt]
        seen[prompt].add(sides)


def check_tree(ref: Rows) -> None:
    """A grown tree's own numbers by the searches' definitions: each node's path_return is its
    path's return recomputed from the rewards; visits count the evaluated leaves below (leaves
    cut by the budget, a timeout or an error carry no evidence); a value is the mean of those
    leaves' scores (MCTS: every terminal leaf backed up once) or of the evaluated children's
    values (tot, dense, sample); a leaf scores its return, a disaster 0."""
    rows = ref.rows
    mcts = rows[0]["algorithm"] == "mcts"
    leaves_below: dict[int, list[int]] = defaultdict(list)
    for leaf in ref.leaves():
        if rows[leaf]["stop_reason"] in EVALUATED:
            for node in ref.path(leaf):
                leaves_below[node].append(leaf)
    for node in reversed(range(len(rows))):
        row = rows[node]
        assert row["path_return"] == pytest.approx(ref.ret(node), abs=1e-6)
        below = leaves_below.get(node, [])
        assert row["visits"] == len(below), f"node {node}: {row['visits']} visits, {len(below)} evaluated leaves"
        if not below:
            continue
        if mcts or node not in ref.children:
            expected = sum(max(ref.ret(v), 0.0) for v in below) / len(below)
        else:
            kids = [rows[k]["value"] for k in ref.children[node] if rows[k]["visits"] > 0]
            expected = sum(kids) / len(kids)
        assert row["value"] == pytest.approx(expected, abs=1e-5)


def check_sweep(sweep: Path, beta: float = 0.5, alpha: float = 0.5, revision_beta: float = 0.5) -> dict[str, int]:
    """Every row of a sweep's datasets against its tree's shard (rows checked, per dataset)."""
    trees = {ref.task: Rows(table) for ref, table in iter_shards(LocalStore(sweep))}
    for ref in trees.values():
        check_tree(ref)
    datasets = dataset_rows(sweep / "datasets")
    for row in datasets.get("sft", []):
        check_sft(trees[row["task"]], row)
        assert row["reward"] == pytest.approx(trees[row["task"]].ret(row["leaf"]), abs=1e-6)
    for row in datasets.get("dpo", []):
        check_dpo(trees[row["task"]], row, beta)
    for row in datasets.get("dpo_first_turn", []):
        check_first_turn(trees[row["task"]], row, beta)
    for name in ("dpo", "dpo_first_turn"):
        check_no_contradiction(datasets.get(name, []))
    for row in datasets.get("revision", []):
        check_revision(trees[row["task"]], row, alpha, revision_beta)
    for row in datasets.get("tokens", []):
        ref = trees[row["group_id"]]
        assert row["reward"] == pytest.approx(ref.ret(row["leaf"]), abs=1e-6)
    return {"nodes": sum(len(ref.rows) for ref in trees.values()), **{name: len(rows) for name, rows in datasets.items()}}


def check_revision(ref: Rows, row: dict, alpha: float, beta: float) -> None:
    """A bad path's prefix (no loss), the revision turn, "ok.", then the good path's suffix (loss on its turns)."""
    good, bad = ref.path(row["good_leaf"]), ref.path(row["bad_leaf"])
    g, b = ref.rows[good[-1]], ref.rows[bad[-1]]
    assert g["value"] - b["value"] > beta and g["value"] > alpha
    assert {g["stop_reason"], b["stop_reason"]} <= set(EVALUATED)
    split, cut = row["shared_depth"], row["transition_depth"]
    assert good[: split + 1] == bad[: split + 1] and good[split + 1] != bad[split + 1]
    assert split < cut <= len(bad) - 1 and bad[cut] == row["transition_node"]
    messages = row["messages"]
    prefix = ref.chat(bad[cut])
    assert plain(messages[: len(prefix)]) == prefix and not any(m["loss"] for m in messages[: len(prefix)])
    turn, ack = messages[len(prefix)], messages[len(prefix) + 1]
    assert turn["role"] == "assistant" and turn["loss"]
    assert turn["content"] in [f"Thought: {t}\nAction: wait" for t in REVISION_THOUGHTS]
    assert ack == {"role": "user", "content": "ok.", "loss": False}
    suffix = messages[len(prefix) + 2 :]
    assert plain(suffix) == ref.path_chat(good[-1])[len(ref.chat(good[split])) :]
    assert all(m["loss"] == (m["role"] == "assistant") for m in suffix)


THICKET = str(Path(sys.executable).parent / "thicket")


@dataclass(frozen=True)
class CheckedSweep:
    rows: dict[str, int]  # rows checked, per dataset, and "nodes"
    stats: dict  # datasets/stats.json
    folder: Path


def run_checked_sweep(spec: Path, sweep: Path, timeout: float = 600) -> CheckedSweep:
    """`thicket run SPEC` (its sweep folder: `sweep`), then every row of its datasets checked
    against its trees; no tree has an error leaf and some tree grew past its root."""
    done = subprocess.run([THICKET, "run", str(spec), "--no-progress"], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = check_sweep(sweep)
    stats = json.loads((sweep / "datasets" / "stats.json").read_text())
    assert stats["stop_reasons"].get("error", 0) == 0, stats["stop_reasons"]
    assert rows["nodes"] > stats["trees"]
    return CheckedSweep(rows, stats, sweep)
