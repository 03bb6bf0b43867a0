"""`thicket submit --resume` runs only the unfinished indexes: the finished Job's completedIndexes and
the indexes whose tasks are all committed take no GPU node again. An Indexed Job's completions cannot
skip indexes (https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode), so the
resumed Job has completions = the unfinished count and its worker maps JOB_COMPLETION_INDEX to the
sweep's index through THICKET_INDEX_MAP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.manifests import BASE
from thicket.errors import BadInput
from thicket.k8s.client import connect
from thicket.k8s.render import render
from thicket.k8s.resume_indexes import RESUMED_INDEXES
from thicket.k8s.status import index_pod, sweep_status
from thicket.k8s.submit import submit
from thicket.rollout.completion_index import INDEX_MAP_ENV, sweep_index
from thicket.shards.storage import commit_key
from thicket.spec import parse_spec
from thicket.storage.store import LocalStore

THICKET = str(Path(sys.executable).parent / "thicket")
QUIET = {"echo": lambda _: None}


def worker_env(job):
    worker = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "worker")
    return {e["name"]: e["value"] for e in worker.get("env") or [] if "value" in e}


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """The sweep's storage, read by the submitter for commit markers: a local folder here."""
    local = LocalStore(tmp_path / "store")
    monkeypatch.setattr("thicket.storage.open_store", lambda uri, settings=None: local)
    return local


def finish(fake, completed: str, failed: str = "") -> None:
    for name in ("tc", "tc-aggregate-wait", "tc-aggregate"):
        fake.get("jobs", "thicket", name)["status"] = {"conditions": [{"type": "Failed" if name == "tc" else "Complete",
                                                                          "status": "True"}]}
    fake.get("jobs", "thicket", "tc")["status"].update(completedIndexes=completed, failedIndexes=failed)


def test_resume_creates_a_job_of_only_the_unfinished_indexes(fake, store):
    spec = parse_spec({**BASE, "cluster": {"parallelism": 8}})  # 10 indexes of 10 tasks (95 tasks)
    submit(connect(), spec, render(spec), **QUIET)
    finish(fake, completed="0-2,4", failed="3")
    for task in range(50, 60):  # index 5: every task committed, though its pod did not finish
        store.put(commit_key(task), b"{}")
    store.put(commit_key(60), b"{}")  # index 6: one task of ten, so it runs again
    lines: list[str] = []
    done = submit(connect(), spec, render(spec), resume=True, echo=lines.append)
    assert done["job/tc"] == "resumed"
    job = fake.get("jobs", "thicket", "tc")
    unfinished = [3, 6, 7, 8, 9]
    assert job["spec"]["completions"] == len(unfinished) and job["spec"]["parallelism"] == 5
    assert job["spec"]["maxFailedIndexes"] <= 5  # the API requires maxFailedIndexes <= completions
    assert worker_env(job)[INDEX_MAP_ENV] == "3,6-9" == job["metadata"]["annotations"][RESUMED_INDEXES]
    assert "job/tc: resuming 5 of 10 indexes [3,6-9] (4 finished by the Job, 1 by commit markers)" in lines
    # End to end through the worker's index resolution: completion index i runs unfinished[i].
    env = worker_env(job)
    assert [sweep_index({**env, "JOB_COMPLETION_INDEX": str(i)}) for i in range(5)] == unfinished
    status = sweep_status(connect(), "thicket", "tc", storage=False)
    assert any(line.startswith("resumed    this Job runs the sweep's indexes 3,6-9 (its completion indexes 0-4)")
               for line in status.lines())

    # Resumed again: the resumed Job's completedIndexes are its own (0 and 2: sweep indexes 3 and 7).
    finish(fake, completed="0,2")
    submit(connect(), spec, render(spec), resume=True, **QUIET)
    assert worker_env(fake.get("jobs", "thicket", "tc"))[INDEX_MAP_ENV] == "6,8-9"
    # A plain submit of the same spec leaves the resumed Job as it is (no 422 for maxFailedIndexes > completions).
    fake.get("jobs", "thicket", "tc")["status"] = {}
    assert submit(connect(), spec, render(spec), **QUIET)["job/tc"] in ("unchanged", "updated")
    assert fake.get("jobs", "thicket", "tc")["spec"]["parallelism"] <= 3


def add_pod(fake, completion_index: int, phase: str) -> str:
    name = f"tc-{completion_index}-abcde"
    fake.put("pods", {
        "metadata": {"name": name, "namespace": "thicket", "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {
            "thicket.dev/sweep": "tc", "app.kubernetes.io/component": "rollout", "batch.kubernetes.io/job-name": "tc",
            "batch.kubernetes.io/job-completion-index": str(completion_index)}},
        "spec": {"containers": [{"name": "worker"}]},
        "status": {"phase": phase},
    })
    return name


def test_status_and_logs_of_a_resumed_job_name_the_sweeps_indexes(fake, store):
    """A resumed Job's pods carry their completion index (0..completions-1); what the user reads and
    asks for is the sweep's index, which the spec, the shards and the first Job number by."""
    spec = parse_spec({**BASE, "cluster": {"parallelism": 8}})
    submit(connect(), spec, render(spec), **QUIET)
    finish(fake, completed="0-2,4-5,7-9")  # sweep indexes 3 and 6 unfinished
    submit(connect(), spec, render(spec), resume=True, **QUIET)
    job = fake.get("jobs", "thicket", "tc")
    job["status"] = {"startTime": "2026-01-01T00:00:00Z", "active": 1, "completedIndexes": "0"}
    add_pod(fake, 0, "Succeeded")
    running = add_pod(fake, 1, "Running")  # completion index 1 runs sweep index 6
    status = sweep_status(connect(), "thicket", "tc", storage=False)
    assert status.indexes["completed"] == {3} and status.indexes["running"] == {6}
    assert [row.index for row in status.rows] == [3, 6]
    assert index_pod(connect(), "thicket", "tc", 6)["metadata"]["name"] == running
    with pytest.raises(BadInput, match=r"^--index: sweep index 1 is not run by the resumed job/tc \(it runs the sweep's indexes 3,6;"):
        index_pod(connect(), "thicket", "tc", 1)


def test_resume_with_every_index_finished_refuses(fake, store):
    spec = parse_spec(BASE)
    submit(connect(), spec, render(spec), **QUIET)
    finish(fake, completed="0-9")
    with pytest.raises(BadInput, match="^--resume: every index of job/tc is finished"):
        submit(connect(), spec, render(spec), resume=True, **QUIET)


def test_resume_without_storage_uses_the_jobs_completed_indexes(fake, monkeypatch):
    def unreachable(uri, settings=None):
        raise OSError("could not connect to the endpoint")

    monkeypatch.setattr("thicket.storage.open_store", unreachable)
    spec = parse_spec(BASE)
    submit(connect(), spec, render(spec), **QUIET)
    finish(fake, completed="1-9")
    lines: list[str] = []
    submit(connect(), spec, render(spec), resume=True, echo=lines.append)
    assert worker_env(fake.get("jobs", "thicket", "tc"))[INDEX_MAP_ENV] == "0"
    assert any("storage not read: could not connect" in line for line in lines), lines


SPEC = """\
name: resumed
tasks: {env: textcraft, start: 0, stop: 6, per_index: 2, env_server: {mode: in_process}}
search: {algorithm: sample, samples: 1, max_depth: 2}
policy: {kind: uniform}
output: out
run: {progress: false}
"""


def test_the_worker_runs_the_mapped_index(tmp_path):
    """A resumed pod of completion index 0 with THICKET_INDEX_MAP=2 runs the sweep's index 2 (tasks 4-5)."""
    (tmp_path / "spec.yaml").write_text(SPEC)
    env = {**os.environ, "JOB_COMPLETION_INDEX": "0", INDEX_MAP_ENV: "2"}
    run = subprocess.run([THICKET, "worker", "spec.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    store = LocalStore(tmp_path / "out" / "resumed")
    assert store.exists(commit_key(4)) and store.exists(commit_key(5)) and not store.exists(commit_key(0))
    for bad, expected in (("x", f"{INDEX_MAP_ENV}: 'x' is not an index set"),
                          ("", None), ("5-4", f"{INDEX_MAP_ENV}: empty")):
        if expected is None:
            continue
        env[INDEX_MAP_ENV] = bad
        done = subprocess.run([THICKET, "worker", "spec.yaml"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 2 and expected in done.stderr and done.stderr.count("\n") == 1, done.stderr
    env.update({INDEX_MAP_ENV: "1-2", "JOB_COMPLETION_INDEX": "2"})
    done = subprocess.run([THICKET, "worker", "spec.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "JOB_COMPLETION_INDEX: 2 is outside the 2 indexes" in done.stderr, done.stderr
