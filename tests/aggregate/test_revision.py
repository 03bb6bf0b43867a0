"""The revision dataset (Agent-R) over random trees: a bad prefix, the revision turn, then the
good path's suffix."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.random_trees import Rows, rows_of, trees
from thicket.aggregate.params import RevisionParams
from thicket.aggregate.revision import REVISION_THOUGHTS, revision_table
from thicket.aggregate.view import EVALUATED, TreeView


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
