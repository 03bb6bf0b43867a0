"""The verifier that cuts a revision's bad path after its first bad step (over HTTP, here mocked),
a verifier that cannot be reached, and its retries (backoff, Retry-After, deadline) against a
real HTTP server."""

from __future__ import annotations

import json
import socket
import time
from email.utils import formatdate

import httpx
import pytest

from tests.support.http_stub import QuietHandler, serving
from tests.support.random_trees import Rows, random_tree, rows_of
from thicket.aggregate.params import RevisionParams
from thicket.aggregate.revision import revision_table
from thicket.aggregate.verifier import QUESTION, Judgement, Verifier, VerifierConfig, retry_after_s
from thicket.aggregate.view import TreeView
from thicket.errors import BadInput, Unavailable


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


# -- retries, against a real HTTP server -------------------------------------------

CHAT = [{"role": "user", "content": "You are in a room."}, {"role": "assistant", "content": "Action: look"},
        {"role": "user", "content": "You see a door."}]
JUDGED_BAD = json.dumps({"choices": [{"message": {"content": "Judgement: Bad"}}]}).encode()


def scripted_server(answers: list[tuple[int, dict[str, str]]], last: tuple[int, dict[str, str]] | None = None):
    """A handler answering POSTs with `answers` in turn (then `last`, or a judgement), and
    the server-side monotonic time of each request."""
    seen: list[float] = []

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            seen.append(time.monotonic())
            self.rfile.read(int(self.headers["Content-Length"]))
            i = len(seen) - 1
            status, headers = answers[i] if i < len(answers) else (last or (200, {}))
            if status == 200:
                return self.answer(200, JUDGED_BAD)
            body = json.dumps({"error": {"message": f"scripted {status}"}}).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler, seen


def test_a_429_is_retried_after_growing_waits_and_its_judgement_used():
    handler, seen = scripted_server([(429, {}), (429, {})])
    with serving(handler) as url:
        verifier = Verifier(VerifierConfig(url + "/v1", "judge", backoff_s=0.2))
        assert verifier.judge(CHAT) is Judgement.BAD
    assert len(seen) == 3
    first, second = seen[1] - seen[0], seen[2] - seen[1]
    assert 0.2 <= first < 0.3 + 0.25  # backoff_s, plus up to half of it at random (and some slack)
    assert 0.4 <= second < 0.5 + 0.25  # doubled
    assert second > first


def test_retry_after_is_honoured():
    handler, seen = scripted_server([(429, {"Retry-After": "1"})])
    with serving(handler) as url:
        verifier = Verifier(VerifierConfig(url + "/v1", "judge", backoff_s=0.05))
        assert verifier.judge(CHAT) is Judgement.BAD
    assert len(seen) == 2 and 1.0 <= seen[1] - seen[0] < 2.0
    now = time.time()
    assert retry_after_s(formatdate(now + 30, usegmt=True), now) == pytest.approx(30, abs=1)
    assert retry_after_s("2.5") == 2.5 and retry_after_s("soon") is None and retry_after_s(None) is None


def test_a_4xx_other_than_429_fails_at_once_with_the_servers_reason():
    handler, seen = scripted_server([(404, {})])
    with serving(handler) as url:
        verifier = Verifier(VerifierConfig(url + "/v1", "judge", backoff_s=0.05))
        with pytest.raises(BadInput, match=r"refused the request \(HTTP 404, not retried\): scripted 404"):
            verifier.judge(CHAT)
    assert len(seen) == 1


def test_retries_stop_at_the_deadline():
    handler, seen = scripted_server([], last=(503, {}))
    with serving(handler) as url:
        verifier = Verifier(VerifierConfig(url + "/v1", "judge", retries=100, retry_deadline_s=1.0, backoff_s=0.1))
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"did not answer: HTTP 503: scripted 503 \(gave up after \d+ tries"):
            verifier.judge(CHAT)
        assert time.monotonic() - started <= 1.0 + 0.2
    assert 3 <= len(seen) <= 5  # waits of ~0.1, 0.2, 0.4: the next (~0.8) would end past the deadline
    # A Retry-After beyond the deadline is not waited for.
    handler, seen = scripted_server([], last=(429, {"Retry-After": "30"}))
    with serving(handler) as url:
        verifier = Verifier(VerifierConfig(url + "/v1", "judge", retry_deadline_s=5.0, backoff_s=0.05))
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"HTTP 429"):
            verifier.judge(CHAT)
        assert time.monotonic() - started < 1.0 and len(seen) == 1


def test_connection_errors_are_retried_until_the_deadline():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    verifier = Verifier(VerifierConfig(f"http://127.0.0.1:{port}/v1", "judge", retry_deadline_s=0.5, backoff_s=0.05))
    with pytest.raises(Unavailable, match=r"ConnectError.*gave up after [3-9] tries"):
        verifier.judge(CHAT)
