"""The canary (thicket.k8s.canary) against the fake API server: gated on index 0's first committed
shard (the worker's JSON log line, read through pods/log), deaf to DisruptionTarget, a start-up
watchdog at cluster.start_allowance_s, a timeout derived from the pod's deadline, on by default in
`thicket submit`, and Kueue done Kueue's way (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/: the
Job created suspended; stopped by the Workload's `spec.active: false`, not by `spec.suspend`)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from tests.support.fake_kube import FakeKube
from tests.support.manifests import BASE
from thicket.errors import ThicketError
from thicket.k8s.canary import canary_timeout
from thicket.k8s.client import connect
from thicket.k8s.render import render
from thicket.k8s.submit import submit
from thicket.spec import parse_spec

QUIET = {"echo": lambda _: None}
POD = "tc-0-aaaaa"
def ticks():  # a clock of 60 s a poll: a canary that never passes times out in the test, not in an hour
    clock = iter(range(0, 10**6, 60))
    return lambda: next(clock)


COMMITTED = json.dumps({"level": "INFO", "message": "task 3: shard committed (41 nodes)", "task": 3,
                        "commit": "committed", "writer": "w"})


def make_spec(**cluster):
    data = copy.deepcopy(BASE)
    data["cluster"] = cluster
    return parse_spec(data)


def index_0_pod(fake: FakeKube, name: str = POD, phase: str = "Running", worker: dict | None = None,
                conditions: list | None = None, started: bool = True) -> None:
    status: dict = {"phase": phase, "containerStatuses": [{"name": "worker", **(worker or {"state": {"running": {}}})}],
                    "initContainerStatuses": [{"name": "vllm", "state": {"running": {}}, "ready": True}]}
    if started:
        status["startTime"] = "2026-01-01T00:00:00Z"
    if conditions:
        status["conditions"] = conditions
    fake.put("pods", {"metadata": {"name": name, "namespace": "thicket", "creationTimestamp": name, "labels": {
        "thicket.dev/sweep": "tc", "app.kubernetes.io/component": "rollout", "batch.kubernetes.io/job-name": "tc",
        "batch.kubernetes.io/job-completion-index": "0"}}, "status": status})


def test_the_canary_scales_at_the_first_committed_shard(fake):
    spec = make_spec(parallelism=4)
    polls = []

    def sleep(_):
        polls.append(fake.get("jobs", "thicket", "tc")["spec"]["parallelism"])
        index_0_pod(fake)
        if len(polls) == 2:  # the worker logs one JSON line per event; a shard's commit carries "commit"
            fake.logs[(POD, "worker")] = '{"message": "task 3 started", "task": 3}\n' + COMMITTED + "\n"

    lines: list[str] = []
    done = submit(connect(), spec, render(spec), echo=lines.append, canary=True, sleep=sleep, clock=ticks())
    assert polls == [1, 1]  # index 0 alone until its worker committed a shard; index 0 never completed
    assert fake.get("jobs", "thicket", "tc")["spec"]["parallelism"] == 4 and done["job/tc-aggregate"] == "created"
    assert any(line.startswith("job/tc: canary index 0 committed its first shard in") for line in lines), lines


def test_a_preempted_canary_pod_is_no_failure(fake):
    spec = make_spec(parallelism=4)
    disruption = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    calls = []

    def sleep(_):
        calls.append(1)
        if len(calls) == 1:  # preempted: Failed with DisruptionTarget (the Job's Ignore rule: not counted)
            index_0_pod(fake, phase="Failed", conditions=disruption,
                        worker={"state": {"terminated": {"exitCode": 143, "reason": "Error"}}})
        else:  # the Job's replacement pod commits
            index_0_pod(fake, name="tc-0-bbbbb")
            fake.logs[("tc-0-bbbbb", "worker")] = COMMITTED + "\n"

    submit(connect(), spec, render(spec), canary=True, sleep=sleep, clock=ticks(), **QUIET)
    job = fake.get("jobs", "thicket", "tc")
    assert job["spec"]["parallelism"] == 4 and not job["spec"].get("suspend")


def test_the_start_up_watchdog_stops_a_pod_whose_worker_never_starts(fake):
    # A volume that never mounts: the worker waits in ContainerCreating, no FATAL reason; the canary
    # stops the Job at the start allowance (900 s), not at its timeout (here 6660 s, see below).
    spec = make_spec(parallelism=4)
    ticks = iter(range(0, 100000, 300))
    with pytest.raises(ThicketError) as err:
        submit(connect(), spec, render(spec), canary=True, clock=lambda: next(ticks), **QUIET,
               sleep=lambda _: index_0_pod(fake, phase="Pending", worker={"state": {"waiting": {"reason": "ContainerCreating"}}}))
    assert str(err.value).startswith("canary failed: job/tc index 0: no worker running 15m 00s after the pod "
                                     "started (cluster.start_allowance_s)")
    assert fake.get("jobs", "thicket", "tc")["spec"]["suspend"] is True


def test_the_canary_timeout_comes_from_the_pod():
    spec = make_spec(parallelism=4)
    job = next(o for o in render(spec) if o["kind"] == "Job" and o["metadata"]["name"] == "tc")
    wait_ready = int(job["spec"]["template"]["spec"]["containers"][0]["args"][3])
    # start allowance + --wait-ready-timeout + one task (run.task_timeout_s 3600) + shard_wait_s 60 +
    # storage.retry_deadline_s 300: the first shard's worst case, below the pod's activeDeadlineSeconds.
    expected = 900 + wait_ready + 3600 + 60 + 300
    assert expected < job["spec"]["template"]["spec"]["activeDeadlineSeconds"]
    assert canary_timeout(spec, job) == expected


def workload(fake: FakeKube, active: bool = True) -> None:
    job = fake.get("jobs", "thicket", "tc")
    fake.put("workloads", {"metadata": {"name": "job-tc-1a2b3", "namespace": "thicket", "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "tc", "uid": job["metadata"]["uid"], "controller": True}]},
        "spec": {"active": active, "queueName": "gpu"}})


def test_kueue_a_failed_canary_deactivates_the_workload(fake):
    spec = make_spec(parallelism=4, queue="gpu")

    def sleep(_):
        workload(fake)  # Kueue admitted it
        index_0_pod(fake, phase="Failed", worker={"state": {"terminated": {"exitCode": 2, "reason": "Error"}}})

    with pytest.raises(ThicketError) as err:
        submit(connect(), spec, render(spec), canary=True, sleep=sleep, **QUIET)
    assert "its Kueue Workload is deactivated (spec.active: false)" in str(err.value)
    assert fake.get("workloads", "thicket", "job-tc-1a2b3")["spec"]["active"] is False  # Kueue will not unsuspend it


def test_kueue_scales_only_a_stopped_job(fake):
    spec = make_spec(parallelism=4, queue="gpu")
    created = {}

    def sleep(_):
        created.setdefault("job", copy.deepcopy(fake.get("jobs", "thicket", "tc")))
        workload(fake)
        index_0_pod(fake)
        fake.logs[(POD, "worker")] = COMMITTED + "\n"

    submit(connect(), spec, render(spec), canary=True, sleep=sleep, clock=ticks(), **QUIET)
    assert created["job"]["spec"]["suspend"] is True  # created suspended, as Kueue asks
    assert created["job"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    patches = [path.rsplit("/", 2)[-2] for method, path in fake.requests if method == "PATCH"
               and ("/workloads/" in path or path.endswith("/jobs/tc"))]
    # deactivate, change parallelism while stopped, activate again
    assert patches[:3] == ["workloads", "jobs", "workloads"], patches
    assert fake.get("jobs", "thicket", "tc")["spec"]["parallelism"] == 4
    assert fake.get("workloads", "thicket", "job-tc-1a2b3")["spec"]["active"] is True


def write_spec(tmp_path, **cluster) -> str:
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**copy.deepcopy(BASE), "cluster": cluster}))
    return str(path)


def test_submit_runs_the_canary_by_default_and_prices_faults_first(fake, tmp_path, cli, monkeypatch):
    from thicket.k8s import canary as canary_module

    monkeypatch.setattr(canary_module.time, "sleep", lambda _: index_0_pod(
        fake, phase="Failed", worker={"state": {"terminated": {"exitCode": 3, "reason": "Error"}}}))
    code, out, err = cli("submit", write_spec(tmp_path, parallelism=4))
    assert code == 1 and err.startswith("error: canary failed: job/tc index 0: worker exit 3")
    assert out.index("fault price (worst case") < out.index("job/tc created")


def test_no_canary_creates_every_pod_at_once(fake, tmp_path, cli):
    code, out, err = cli("submit", write_spec(tmp_path, parallelism=4), "--no-canary")
    assert code == 0, err
    assert fake.get("jobs", "thicket", "tc")["spec"]["parallelism"] == 4 and "canary" not in out


def test_the_submitter_may_stop_a_kueue_workload():
    from tests.support.manifests import ROOT

    role = next(o for o in yaml.safe_load_all((ROOT / "k8s" / "rbac.yaml").read_text()) if o and o["kind"] == "Role")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert {("kueue.x-k8s.io", "workloads", verb) for verb in ("get", "list", "patch")} <= granted
    assert ("", "pods/log", "get") in granted  # the canary reads index 0's worker log


def test_a_real_workers_json_log_opens_the_canary_gate(fake, tmp_path):
    """The gate reads what the worker really prints in a pod (THICKET_LOG_FORMAT=json, as rendered):
    a real `thicket worker` run's log, served as the pod's log, says a shard was committed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from thicket.k8s.canary import committed_shard

    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "name": "gate", "tasks": {"env": "frozenlake", "start": 0, "stop": 2, "per_index": 2},
        "search": {"algorithm": "sample", "samples": 2, "max_depth": 4}, "policy": {"kind": "uniform"},
        "output": str(tmp_path / "out"), "run": {"progress": False}}))
    env = {**os.environ, "JOB_COMPLETION_INDEX": "0", "THICKET_LOG_FORMAT": "json"}
    worker = subprocess.run([str(Path(sys.executable).parent / "thicket"), "worker", "spec.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=env)
    assert worker.returncode == 0, worker.stderr[-2000:]
    index_0_pod(fake)
    pod = fake.get("pods", "thicket", POD)
    fake.logs[(POD, "worker")] = "\n".join(line for line in worker.stderr.splitlines() if "commit" not in line)
    assert not committed_shard(connect(), "thicket", [pod])  # the same log without its commit lines: closed
    fake.logs[(POD, "worker")] = worker.stderr + worker.stdout
    assert committed_shard(connect(), "thicket", [pod])
