"""The waiter's start-up watchdog (thicket.k8s.start_watch, `thicket wait-job --start-watchdog`),
against the fake API server. It runs for the whole sweep, canary or not:

- before any worker of the Job started, a pod whose worker has not started within the allowance
  means a fault every pod meets (an image, a Secret, a volume): the Job is stopped (suspended, or its
  Kueue Workload deactivated, https://kueue.sigs.k8s.io/docs/concepts/workload/#active), so it costs
  each running pod the allowance instead of its activeDeadlineSeconds;
- after one did, a late pod is its node's fault: it is evicted through the Eviction API
  (https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/), which marks it
  DisruptionTarget, so the rollout Job's Ignore rule reruns its index without counting a failure
  (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-failure-policy).
"""

from __future__ import annotations

import copy

import pytest

from tests.support.fake_kube import FakeKube
from tests.support.manifests import BASE
from thicket.errors import ThicketError
from thicket.k8s.client import connect
from thicket.k8s.render import render
from thicket.k8s.start_watch import StartupWatchdog
from thicket.spec import parse_spec

PULLING = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}
RUNNING = {"state": {"running": {}}}


def pod(fake: FakeKube, index: int, worker: dict, started: bool = True, conditions: list | None = None) -> str:
    name = f"tc-{index}-abcde"
    status: dict = {"phase": "Pending" if "waiting" in worker["state"] else "Running",
                    "containerStatuses": [{"name": "worker", **worker}]}
    if started:
        status["startTime"] = "2026-01-01T00:00:00Z"
    if conditions:
        status["conditions"] = conditions
    fake.put("pods", {"metadata": {"name": name, "namespace": "thicket", "labels": {
        "batch.kubernetes.io/job-name": "tc", "batch.kubernetes.io/job-completion-index": str(index)}},
        "status": status})
    return name


def submitted(fake: FakeKube, **cluster) -> None:
    data = copy.deepcopy(BASE)
    data["cluster"] = {"parallelism": 4, **cluster}
    spec = parse_spec(data)
    for obj in render(spec):
        plural = {"ConfigMap": "configmaps", "ServiceAccount": "serviceaccounts", "Role": "roles",
                  "RoleBinding": "rolebindings", "Job": "jobs"}[obj["kind"]]
        fake.put(plural, copy.deepcopy(obj))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watchdog(clock: Clock, lines: list[str]) -> StartupWatchdog:
    return StartupWatchdog(connect(), "thicket", "tc", 900, clock, echo=lines.append)


def test_no_worker_started_by_the_allowance_stops_the_job(fake):
    submitted(fake)
    stuck = [pod(fake, i, PULLING) for i in range(4)]
    clock, lines = Clock(), []
    dog = watchdog(clock, lines)
    dog.check()  # first seen at 0
    clock.now = 899
    dog.check()
    assert fake.get("jobs", "thicket", "tc")["spec"].get("suspend") is not True  # within the allowance
    clock.now = 900
    with pytest.raises(ThicketError, match=rf"^start-up watchdog: job/tc pod {stuck[0]}: no worker running 15m 00s "
                                           r"after the pod started .*no worker of the Job has started.*the Job is suspended"):
        dog.check()
    assert fake.get("jobs", "thicket", "tc")["spec"]["suspend"] is True
    assert fake.evictions == []


def test_under_kueue_the_workload_is_deactivated(fake):
    submitted(fake, queue="gpu")
    uid = fake.get("jobs", "thicket", "tc")["metadata"]["uid"]
    fake.put("workloads", {"metadata": {"name": "job-tc-1a2b3", "namespace": "thicket",
                                        "labels": {"kueue.x-k8s.io/job-uid": uid}}, "spec": {"active": True}})
    pod(fake, 0, PULLING)
    clock, lines = Clock(), []
    dog = watchdog(clock, lines)
    dog.check()
    clock.now = 900
    with pytest.raises(ThicketError, match="its Kueue Workload is deactivated"):
        dog.check()
    assert fake.get("workloads", "thicket", "job-tc-1a2b3")["spec"]["active"] is False


def test_once_a_worker_ran_a_late_pod_is_evicted_and_the_job_goes_on(fake):
    submitted(fake)
    pod(fake, 0, RUNNING)
    late = pod(fake, 1, PULLING)
    pod(fake, 2, PULLING, started=False)  # waiting for a node: not counted
    pod(fake, 3, PULLING, conditions=[{"type": "DisruptionTarget", "status": "True"}])  # preempted already
    clock, lines = Clock(), []
    dog = watchdog(clock, lines)
    dog.check()
    clock.now = 901
    dog.check()
    assert fake.evictions == [late]
    assert fake.get("pods", "thicket", late)["status"]["conditions"][-1]["type"] == "DisruptionTarget"
    assert fake.get("jobs", "thicket", "tc")["spec"].get("suspend") is not True
    assert lines == [f"job/tc: start-up watchdog: evicted pod {late}: no worker running 15m 00s after the pod started "
                     "(cluster.start_allowance_s); its index runs again (DisruptionTarget: not counted)"]
    clock.now = 2000
    dog.check()  # evicted once, not again
    assert fake.evictions == [late]


def test_wait_job_runs_the_watchdog_and_fails_without_releasing_the_aggregation(fake, cli):
    submitted(fake)
    pod(fake, 0, PULLING)
    code, out, err = cli("wait-job", "tc", "-n", "thicket", "--release", "tc-aggregate",
                         "--start-watchdog", "0.05", "--interval", "0.02")
    assert code != 0
    assert "start-up watchdog: job/tc pod tc-0-abcde" in err and "Traceback" not in err
    assert fake.get("jobs", "thicket", "tc")["spec"]["suspend"] is True
    assert fake.get("jobs", "thicket", "tc-aggregate")["spec"]["suspend"] is True  # not released
