"""The policy server killed mid-run: restarted after a few seconds, or gone for good.

The server is the session's real vLLM (CPU, tiny model); it is killed with SIGKILL and
started again on the same port, as a pod's vLLM container restarts. Each test leaves it
running for the tests after it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.harness import (
    NAME,
    TcpRelay,
    assert_each_task_committed_once,
    commits,
    dataset_fingerprint,
    run_with_fault,
    sweep_spec,
    thicket,
    tree_fingerprint,
    undisturbed,
)
from thicket.storage import open_store
from thicket.vllm_server import VLLMServer

pytestmark = pytest.mark.vllm
TASKS = list(range(6))


def vllm_spec(tmp_path, url: str, model: str, **policy: object):
    return sweep_spec(
        tmp_path,
        policy={"kind": "vllm", "url": url, "model": model, "max_tokens": 32,
                "max_thought_chars": 16, "concurrency": 8, **policy},
        search={"iterations": 4, "expansions": 2, "max_depth": 6},
    )


def kill_9(server: VLLMServer) -> None:
    assert server.pid is not None
    os.killpg(server.pid, signal.SIGKILL)
    server.stop()  # reaps it and closes its log


@pytest.fixture
def server(vllm_server: VLLMServer):
    yield vllm_server
    vllm_server.start()  # whatever a test did, the next one finds it serving


@pytest.fixture(scope="module")
def reference(vllm_server: VLLMServer, tmp_path_factory) -> tuple[str, dict[str, str]]:
    """Trees and datasets of the sweep undisturbed (retry settings do not change them)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    return undisturbed(tmp_path, vllm_spec(tmp_path, vllm_server.url, vllm_server.served_name))


def test_vllm_killed_mid_run_and_restarted_loses_and_changes_nothing(tmp_path, server, reference):
    spec = vllm_spec(tmp_path, server.url, server.served_name)

    def kill_and_restart() -> None:
        kill_9(server)
        time.sleep(3)
        server.start()  # ~40 s on this CPU, while the run keeps retrying

    result = run_with_fault(spec, str(tmp_path / "disturbed"), kill_and_restart, timeout=400)
    assert result.returncode == 0, result.stderr
    assert "0 failed" in result.stdout
    assert f"policy server {server.url}" in result.stderr and "retrying" in result.stderr  # the fault, named
    uri = str(tmp_path / "disturbed" / NAME)
    assert_each_task_committed_once(uri, TASKS)
    assert (tree_fingerprint(uri), dataset_fingerprint(uri)) == reference


def test_vllm_that_never_comes_back_fails_the_index_by_its_deadline_and_a_rerun_completes(
    tmp_path, server, reference
):
    """The worker reaches vLLM through a relay that is cut for good mid-run: to the worker,
    the server died and never came back (the real one keeps serving the rerun)."""
    deadline_s = 8
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    relay = TcpRelay(port)
    relayed = f"http://127.0.0.1:{relay.port}/v1"
    out = tmp_path / "disturbed"
    cut_at: list[float] = []

    def cut() -> None:
        relay.cut()
        cut_at.append(time.monotonic())

    result = run_with_fault(vllm_spec(tmp_path, relayed, server.served_name, retry_deadline_s=deadline_s),
                            str(out), cut, timeout=120)
    gave_up_after = time.monotonic() - cut_at[0]
    assert result.returncode == 3, result.stderr  # documented: a server could not be reached in time
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"cannot reach the policy server at {relayed}" in last
    assert gave_up_after < deadline_s + 15, f"gave up {gave_up_after:.0f} s after the cut"
    uri = str(out / NAME)
    committed_before = commits(open_store(uri))
    assert committed_before < len(TASKS)

    rerun = thicket("run", str(vllm_spec(tmp_path, server.url, server.served_name)), "--no-aggregate",
                    "--output", str(out), timeout=400)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{committed_before} already committed, 0 failed" in rerun.stdout
    assert_each_task_committed_once(uri, TASKS)
    assert (tree_fingerprint(uri), dataset_fingerprint(uri)) == reference
