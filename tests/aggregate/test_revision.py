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


def judged_bad(observation: str) -> bool:
    """The verifier's rule in the test below: a step is Bad when its observation's digest says so."""
    import hashlib

    return hashlib.sha256(observation.encode()).digest()[0] % 3 == 0


def test_a_verifier_over_http_cuts_each_bad_path_at_its_first_step_judged_bad(tmp_path):
    """Agent-R's transition point: the verifier judges the bad path's steps after the shared prefix
    in turn, and the path is cut after the first one judged Bad (none: at its leaf). The verifier
    is a real HTTP server whose verdict depends only on the judged step's observation, so the
    oracle recomputes every cut from the tree's rows."""
    import json

    from tests.support.http_stub import QuietHandler, serving
    from tests.support.random_trees import dataset_rows, synthetic_sweep
    from thicket.aggregate.driver import aggregate
    from thicket.aggregate.verifier import VerifierConfig
    from thicket.shards.storage import iter_shards
    from thicket.storage.store import LocalStore

    asked: list[str] = []

    class Judge(QuietHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            observation = body["messages"][-2]["content"]  # the judged step's observation, before the question
            asked.append(observation)
            verdict = "Bad" if judged_bad(observation) else "Good"
            self.answer(200, json.dumps({"choices": [{"message": {"content": f"Judgement: {verdict}"}}]}).encode())

    sweep = synthetic_sweep(tmp_path, tasks=12, datasets={"revision": {"alpha": 0.0, "beta": 0.0, "max_per_task": 6}})
    with serving(Judge) as url:
        result = aggregate(str(sweep), verifier=VerifierConfig(f"{url}/v1", "judge"), workers=0)
    rows = dataset_rows(sweep / "datasets").get("revision", [])
    assert rows and result.stats["revision_methods"] == {"verifier": len(rows)}
    trees = {ref.task: Rows(table) for ref, table in iter_shards(LocalStore(sweep))}
    judged_cuts = 0
    for r in rows:
        ref = trees[r["task"]]
        bad = ref.path(r["bad_leaf"])
        split = r["shared_depth"]
        first_bad = [d for d in range(split + 1, len(bad)) if judged_bad(ref.rows[bad[d]]["user_message"])]
        expected = first_bad[0] if first_bad else len(bad) - 1
        assert (r["transition_method"], r["transition_depth"]) == ("verifier", expected)
        assert r["transition_node"] == bad[expected]
        judged_cuts += bool(first_bad) and expected < len(bad) - 1
    assert judged_cuts > 0  # some paths were cut before their leaf by a Bad verdict
    assert len(asked) <= sum(len(ref.rows) for ref in trees.values())  # a step judged once, whatever pairs share it
