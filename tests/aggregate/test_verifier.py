"""The verifier that cuts a revision's bad path after its first bad step (over HTTP, here mocked),
and a verifier that cannot be reached."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.random_trees import Rows, random_tree, rows_of
from thicket.aggregate.params import RevisionParams
from thicket.aggregate.revision import revision_table
from thicket.aggregate.verifier import QUESTION, Verifier, VerifierConfig
from thicket.aggregate.view import TreeView


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
