"""A queued sweep's operation: `thicket status` shows why Kueue holds the Job (its Workload's
conditions), and preflight refuses a LocalQueue or PriorityClass that does not exist.

Kueue's documents: a Job's Workload carries the label kueue.x-k8s.io/job-uid=<the Job's UID> and the
Job as its owner; its status.conditions QuotaReserved / Admitted / Evicted have a reason and message
(https://kueue.sigs.k8s.io/docs/tasks/troubleshooting/troubleshooting_jobs/); LocalQueues are
namespaced (https://kueue.sigs.k8s.io/docs/concepts/local_queue/); PriorityClasses are
cluster-scoped (https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/).
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.manifests import BASE, ROOT, spec_with
from thicket.errors import BadInput
from thicket.k8s.client import connect
from thicket.k8s.preflight import preflight
from thicket.k8s.render import render
from thicket.k8s.status import sweep_status
from thicket.k8s.submit import submit

PENDING = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
           "flavor h100, 8 more needed")


def queued_sweep(fake, **cluster):
    spec = spec_with(queue="gpu", **cluster)
    submit(connect(), spec, render(spec), echo=lambda _: None)
    job = fake.get("jobs", "thicket", "tc")
    job["status"] = {"conditions": [{"type": "Suspended", "status": "True"}]}
    return job


def put_workload(fake, job, conditions, by_label=True):
    meta = {"name": "job-tc-1a2b3", "namespace": "thicket", "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "tc", "uid": job["metadata"]["uid"], "controller": True}]}
    if by_label:
        meta["labels"] = {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]}
    fake.put("workloads", {"metadata": meta, "spec": {"queueName": "gpu"}, "status": {"conditions": conditions}})


def test_status_shows_the_workloads_pending_reason(fake, cli):
    job = queued_sweep(fake)
    put_workload(fake, job, [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": PENDING},
    ])
    status = sweep_status(connect(), "thicket", "tc", storage=False)
    text = "\n".join(status.lines(all_rows=True))
    assert f"queue      gpu: workload/job-tc-1a2b3: QuotaReserved False (Pending): {PENDING}" in text
    assert f"waiting in Kueue queue gpu (Pending): {PENDING}" in text  # the idle indexes' reason, not "suspended"
    assert ("GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/thicket/workloads") in fake.requests
    code, out, err = cli("status", "tc", "--no-storage", "--format", "json")
    assert code == 0, err
    assert "QuotaReserved False (Pending)" in json.loads(out)["summary"]["queue"]


def test_status_shows_an_eviction_and_finds_the_workload_by_owner(fake):
    job = queued_sweep(fake)
    put_workload(fake, job, [
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a higher priority Workload"},
        {"type": "Admitted", "status": "False", "reason": "NoReservation", "message": "The workload has no reservation"},
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "evicted"},
    ], by_label=False)
    status = sweep_status(connect(), "thicket", "tc", storage=False)
    line = status.queue.line()
    assert line.index("QuotaReserved") < line.index("Admitted") < line.index("Evicted True (Preempted)")
    assert status.rows[0].reason.startswith("evicted by Kueue (Preempted)")


def test_status_without_a_workload_or_permission_says_so(fake):
    queued_sweep(fake)
    assert "no Workload for the Job yet" in sweep_status(connect(), "thicket", "tc", storage=False).queue.line()
    fake.forbidden.add(("GET", "workloads"))
    line = sweep_status(connect(), "thicket", "tc", storage=False).queue.line()
    assert "Workload not read (forbidden (403)" in line and "apply k8s/rbac.yaml" in line


def test_an_unqueued_job_reads_no_workload(fake):
    spec = spec_with()
    submit(connect(), spec, render(spec), echo=lambda _: None)
    assert sweep_status(connect(), "thicket", "tc", storage=False).queue is None
    assert not any("/workloads" in path for _, path in fake.requests)


def test_preflight_refuses_a_missing_local_queue(fake, tmp_path, cli):
    with pytest.raises(BadInput, match="^cluster.queue: Kueue LocalQueue 'nope' not found in namespace 'thicket'"):
        preflight(connect(), spec_with(queue="nope"))
    assert preflight(connect(), spec_with(queue="gpu")) == []  # the fixture's LocalQueue
    with pytest.raises(BadInput, match="^cluster.aggregate.queue: Kueue LocalQueue 'cpu'"):
        preflight(connect(), spec_with(queue="gpu", aggregate={"queue": "cpu"}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({**BASE, "cluster": {"queue": "nope"}}))
    code, _, err = cli("submit", str(tmp_path / "s.yaml"))
    assert code == 2 and err.count("error:") == 1, err
    assert err.splitlines()[-1].startswith("error: cluster.queue: Kueue LocalQueue 'nope' not found"), err


def test_preflight_tolerates_a_forbidden_local_queue_read(fake):
    fake.forbidden.add(("GET", "localqueues"))
    warnings = preflight(connect(), spec_with(queue="nope"))
    assert any("cannot read localqueue/nope (forbidden)" in w for w in warnings), warnings


def test_preflight_checks_the_priority_class(fake):
    with pytest.raises(BadInput, match="^cluster.priority_class_name: PriorityClass 'urgent' does not exist"):
        preflight(connect(), spec_with(priority_class_name="urgent"))
    fake.priority_classes["urgent"] = 1000
    assert preflight(connect(), spec_with(priority_class_name="urgent")) == []
    del fake.priority_classes["urgent"]
    fake.forbidden.add(("GET", "priorityclasses"))
    warnings = preflight(connect(), spec_with(priority_class_name="urgent"))
    assert any("cannot read priorityclass/urgent (forbidden" in w for w in warnings), warnings


def test_the_submitter_may_read_local_queues_and_workloads():
    role = next(o for o in yaml.safe_load_all((ROOT / "k8s" / "rbac.yaml").read_text()) if o and o["kind"] == "Role")
    kueue = [r for r in role["rules"] if r["apiGroups"] == ["kueue.x-k8s.io"]]
    assert any("localqueues" in r["resources"] and "get" in r["verbs"] for r in kueue)
    assert any("workloads" in r["resources"] and {"get", "list"} <= set(r["verbs"]) for r in kueue)
