"""Hostile content: model replies that are empty, enormous, unformatted or invalid, and
observations that are 1 MB long, not valid UTF-8, or full of control characters.

A sweep meets each through real servers and must finish, commit every task once, store
what happened (error leaves, never silent successes) and name the fault in its log.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pyarrow.compute as pc
import pytest

from tests.support.harness import NAME, ROOT, assert_each_task_committed_once, sweep_spec, thicket, trees, wait_until
from tests.support.hostile import INVALID_UTF8, HostileModel
from tests.support.s3_server import free_port
from thicket.search.guard import ContentGuard, Fault

TASKS = list(range(4))


def test_hostile_model_replies_become_stored_leaves_and_a_named_fault(tmp_path):
    with HostileModel() as model:
        spec = sweep_spec(tmp_path, count=len(TASKS), policy={"kind": "openai", "url": model.url, "model": "hostile"},
                          search={"iterations": 6})
        result = thicket("run", str(spec), "--no-aggregate", "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    uri = str(tmp_path / "out" / NAME)
    assert_each_task_committed_once(uri, TASKS)
    for fault in (Fault.EMPTY_REPLY, Fault.NO_ACTION, Fault.INVALID_ACTION, Fault.ACTION_FAILED):
        assert str(fault) in result.stderr, fault
    table = trees(uri)
    replies = table.column("reply").to_pylist()
    assert "" in replies and max(map(len, replies)) > 200_000  # stored exactly as sampled
    failed = table.filter(pc.equal(table.column("stop_reason"), "error"))
    assert failed.num_rows > 0  # the oversized action: an error leaf...
    assert not any(failed.column("success").to_pylist())  # ...never a success
    assert set(failed.column("reward").to_pylist()) == {0.0}
    assert all("environment failed on this action" in o for o in failed.column("observation").to_pylist())


@pytest.fixture
def hostile_env_server() -> str:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "hostile.py"), str(port)],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 60, "the hostile env server")
        yield url
    finally:
        process.kill()
        process.wait()


def test_hostile_observations_are_cut_cleaned_and_named(tmp_path, hostile_env_server):
    spec = sweep_spec(tmp_path, count=len(TASKS), policy={"latency_s": 0.0},
                      tasks={"env": "hostile", "env_args": {}, "max_observation_chars": 4096,
                             "env_server": {"mode": "remote", "url": hostile_env_server}},
                      search={"iterations": 6, "max_depth": 4})
    result = thicket("run", str(spec), "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    uri = str(tmp_path / "out" / NAME)
    assert_each_task_committed_once(uri, TASKS)
    assert str(Fault.OBSERVATION_CUT) in result.stderr and str(Fault.CONTROL_CHARS) in result.stderr
    observations = trees(uri).column("observation").to_pylist()
    assert max(map(len, observations)) < 4096 + 100  # the 1 MiB ones were cut...
    assert any("[cut: 1,048,5" in o for o in observations)  # ...and say so
    assert not any(ch in o for o in observations for ch in "\x00\x1b\x07\x7f")
    assert all(o.encode() for o in observations)  # valid UTF-8 throughout (raises otherwise)
    assert any("broken bytes" in o for o in observations)  # the text around bad bytes is kept
    assert (tmp_path / "out" / NAME / "datasets" / "stats.json").exists()  # aggregation read it all


def test_the_guard_replaces_invalid_utf8_and_keeps_clean_text_as_is():
    guard = ContentGuard(max_observation_chars=64)
    assert guard.text("plain\ttext\nok") == "plain\ttext\nok" and not guard.faults
    cleaned = guard.text(INVALID_UTF8)
    cleaned.encode()  # valid now
    assert "broken bytes" in cleaned and guard.faults == {Fault.INVALID_UTF8: 1}
