"""`thicket worker` (the pod's main container) against servers that do not answer at start-up: in a
pod that is DNS or a server not up yet, so it exits 3 (retried with the index's backoff), where
`thicket run` by hand calls the same spec a wrong URL (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.s3_server import free_port

THICKET = str(Path(sys.executable).parent / "thicket")

SPEC = """\
name: worker-start
tasks: {{env: textcraft, start: 0, stop: 2, per_index: 2, env_server: {{mode: in_process}}}}
search: {{algorithm: sample, samples: 1, max_depth: 2}}
policy: {policy}
output: {output}
storage: {{access_key_id_env: THICKET_TEST_KEY_ID, secret_access_key_env: THICKET_TEST_SECRET{storage}}}
run: {{progress: false}}
"""


def _run(tmp_path: Path, command: str, policy: str, output: str, storage: str = "") -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(policy=policy, output=output, storage=storage))
    args = [THICKET, command, str(spec)] + (["--index", "0"] if command == "worker" else ["--no-aggregate"])
    env = {**os.environ, "THICKET_TEST_KEY_ID": "testing", "THICKET_TEST_SECRET": "testing"}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command, code", [("worker", 3), ("run", 2)])
def test_storage_that_never_answers_is_unavailable_in_a_pod_and_bad_input_by_hand(tmp_path, command, code):
    dead = f"http://127.0.0.1:{free_port()}"
    done = _run(tmp_path, command, "{kind: uniform}", "s3://worker-start/runs",
                storage=f", endpoint_url: '{dead}', startup_connect_s: 0.5")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr
    assert lines[-1].startswith(f"error: storage.endpoint_url: nothing answers at {dead} (connection refused")
    assert ("retried with the index's backoff" in lines[-1]) is (command == "worker")


def test_a_policy_server_that_never_answers_is_unavailable_in_a_pod(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    done = _run(tmp_path, "worker", f"{{kind: openai, model: m, url: '{dead}/v1', startup_connect_s: 0.5}}",
                str(tmp_path / "out"))
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: policy.url: nothing answers at {dead}/v1")
