"""The invariants the dataset property tests check (tests/aggregate/test_sft.py, test_dpo.py,
test_revision.py), for rows a real sweep wrote: each row against its tree's shard rows (Rows)."""

from __future__ import annotations

import pytest

from tests.support.random_trees import Rows
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
        assert chosen["parent"] == rejected["parent"] == split and chosen["reply"] != rejected["reply"]
        assert chosen["value"] - rejected["value"] >= beta and chosen["value"] > rejected["value"]
    else:
        assert pair["kind"] == "trajectory"
        assert chosen["success"] and not rejected["success"] and rejected["stop_reason"] in EVALUATED
        assert pair["chosen_reward"] == pytest.approx(ref.ret(pair["chosen_node"]))
        assert pair["chosen_reward"] > pair["rejected_reward"]


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
