"""Resuming a finished sweep in one command: `thicket submit --resume` recreates its finished Jobs,
and a pod whose tasks are all committed exits at once, before it waits for its servers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.fake_kube import FakeKube
from tests.support.manifests import BASE
from tests.support.s3_server import free_port
from thicket.errors import BadInput
from thicket.k8s.client import connect
from thicket.k8s.render import render
from thicket.k8s.submit import submit
from thicket.spec import parse_spec

THICKET = str(Path(sys.executable).parent / "thicket")


@pytest.fixture()
def kube(fake):
    return fake, connect()


def _finish(fake: FakeKube, name: str, condition: str) -> None:
    job = fake.get("jobs", "thicket", name)
    job["status"] = {"conditions": [{"type": condition, "status": "True"}], "failedIndexes": "3"}


def test_resume_recreates_the_finished_jobs_and_refuses_a_running_one(kube):
    fake, client = kube
    spec = parse_spec(BASE)
    submit(client, spec, render(spec), echo=lambda _: None)
    first = fake.get("jobs", "thicket", "tc")["metadata"]["uid"]
    with pytest.raises(BadInput, match=r"^job/tc is still running: --resume reruns a finished sweep"):
        submit(client, spec, render(spec), resume=True, echo=lambda _: None)
    _finish(fake, "tc", "Failed")
    _finish(fake, "tc-aggregate-wait", "Complete")
    _finish(fake, "tc-aggregate", "Complete")
    lines: list[str] = []
    done = submit(client, spec, render(spec), resume=True, echo=lines.append)
    assert done["job/tc"] == done["job/tc-aggregate"] == "resumed"
    assert done["configmap/tc-spec"] == "unchanged"
    assert "job/tc resumed" in lines
    again = fake.get("jobs", "thicket", "tc")
    assert again["metadata"]["uid"] != first  # a new Job: every index runs again
    assert not (again.get("status") or {}).get("conditions")


SPEC = """\
name: resumed
tasks: {env: textcraft, start: 0, stop: 4, per_index: 2, env_server: {mode: in_process}}
search: {algorithm: sample, samples: 1, max_depth: 2}
policy: {kind: uniform}
output: out
run: {progress: false}
"""


def test_a_pod_whose_tasks_are_all_committed_exits_before_waiting_for_its_servers(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    run = subprocess.run([THICKET, "run", "spec.yaml", "--indices", "0-1", "--no-aggregate"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    dead = f"http://127.0.0.1:{free_port()}/health"
    env = {**os.environ, "JOB_COMPLETION_INDEX": "0"}
    started = time.monotonic()
    done = subprocess.run([THICKET, "worker", "spec.yaml", "--wait-for", dead, "--wait-ready-timeout", "600"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "index 0: all 2 tasks already committed" in done.stdout
    assert time.monotonic() - started < 60  # it never waited for the dead server
    # Index 1 (tasks 2-3) is not done: its pod waits for its servers, here until the deadline (exit 3).
    env["JOB_COMPLETION_INDEX"] = "1"
    waits = subprocess.run([THICKET, "worker", "spec.yaml", "--wait-for", dead, "--wait-ready-timeout", "1"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert waits.returncode == 3 and "did not answer within 1 s" in waits.stderr


def test_submit_resume_is_on_the_command_line():
    done = subprocess.run([THICKET, "submit", "--help"], capture_output=True, text=True, timeout=60)
    assert "--resume" in done.stdout
