"""`thicket status` says why each index is where it is: one line per index from its pods (conditions,
container states, restarts, the worker's exit code and termination message) and the Warning Events
about them, a summary line, `-o json`, and `--watch` refreshing; against the in-memory API server."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from tests.support.fake_kube import FakeKube
from tests.support.manifests import BASE, ROOT
from thicket.k8s import commands
from thicket.k8s.client import connect
from thicket.k8s.pod_reasons import IndexState, exit_meaning
from thicket.k8s.render import render
from thicket.k8s.status import sweep_status
from thicket.spec import parse_spec

KINDS = {"ConfigMap": "configmaps", "ServiceAccount": "serviceaccounts", "Role": "roles",
         "RoleBinding": "rolebindings", "Job": "jobs"}
SCHEDULER = ("0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: "
             "4 No preemption victims found for incoming pod.")
BAD_INPUT_LOG = "tasks        10 (10 grown)\nerror: tasks: stop 5 must be greater than start 10\n\n"
UNAVAILABLE_LOG = "waiting for vllm\nerror: vLLM at http://127.0.0.1:8000 did not answer within 600 s  \n"
MOUNT = 'MountVolume.SetUp failed for volume "models" : persistentvolumeclaim "thicket-models" not found'


def running(ready: bool = True, restarts: int = 0, last: dict | None = None) -> dict:
    return {"state": {"running": {"startedAt": "2026-01-01T00:01:00Z"}}, "ready": ready, "started": True,
            "restartCount": restarts, "lastState": {"terminated": last} if last else {}}


def waiting(reason: str, message: str | None = None) -> dict:
    return {"state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}, "ready": False,
            "restartCount": 0, "lastState": {}}


def terminated(code: int, reason: str, message: str | None = None) -> dict:
    done = {"exitCode": code, "reason": reason, **({"message": message} if message else {})}
    return {"state": {"terminated": done}, "ready": False, "restartCount": 0, "lastState": {}}


def add_pod(fake: FakeKube, index: int, phase: str, created: str, vllm: dict, worker: dict,
            conditions: list | None = None) -> str:
    name = f"tc-{index}-{created[-3:-1]}"
    fake.put("pods", {
        "metadata": {"name": name, "namespace": "thicket", "creationTimestamp": f"2026-01-01T00:00:{created}",
                     "labels": {"thicket.dev/sweep": "tc", "app.kubernetes.io/component": "rollout",
                                "batch.kubernetes.io/job-name": "tc", "batch.kubernetes.io/job-completion-index": str(index)}},
        "spec": {"initContainers": [{"name": "vllm", "restartPolicy": "Always"}, {"name": "env-textcraft", "restartPolicy": "Always"}],
                 "containers": [{"name": "worker"}]},
        "status": {"phase": phase, "conditions": conditions or [{"type": "PodScheduled", "status": "True"}],
                   "initContainerStatuses": [{"name": "vllm", **vllm}, {"name": "env-textcraft", **running()}],
                   "containerStatuses": [{"name": "worker", **worker}]},
    })
    return name


def add_event(fake: FakeKube, name: str, pod: str, kind: str, reason: str, message: str, when: str) -> None:
    fake.put("events", {
        "metadata": {"name": name, "namespace": "thicket"}, "type": kind, "reason": reason, "message": message,
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": "thicket"}, "lastTimestamp": when,
    })


def sweep(fake: FakeKube) -> dict:
    """Sweep tc (10 indexes), one index in each situation; returns its Job."""
    spec = parse_spec({**copy.deepcopy(BASE), "cluster": {"parallelism": 8}})
    for obj in render(spec):
        fake.put(KINDS[obj["kind"]], copy.deepcopy(obj))
    job = fake.get("jobs", "thicket", "tc")
    job["status"] = {"startTime": "2026-01-01T00:00:00Z", "active": 6, "completedIndexes": "0", "failedIndexes": "4-5"}
    add_pod(fake, 0, "Succeeded", "01Z", running(), terminated(0, "Completed"))
    add_pod(fake, 1, "Pending", "02Z", waiting("PodInitializing"), waiting("PodInitializing"),
            [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER}])
    add_pod(fake, 2, "Pending", "03Z", waiting("ImagePullBackOff", 'Back-off pulling image "vllm/vllm-openai:v9.9"'),
            waiting("PodInitializing"))
    add_pod(fake, 3, "Running", "04Z", running(ready=False), running())
    oom = add_pod(fake, 4, "Failed", "05Z", running(restarts=2), terminated(137, "OOMKilled"))
    add_pod(fake, 5, "Failed", "06Z", running(), terminated(2, "Error", BAD_INPUT_LOG))
    add_pod(fake, 6, "Failed", "07Z", running(), terminated(3, "Error", UNAVAILABLE_LOG))
    add_pod(fake, 7, "Running", "08Z", running(restarts=3, last={"exitCode": 137, "reason": "OOMKilled"}), running())
    stuck = add_pod(fake, 8, "Pending", "09Z", waiting("ContainerCreating"), waiting("PodInitializing"))
    add_event(fake, "e1", stuck, "Warning", "FailedMount", "an older warning", "2026-01-01T00:01:00Z")
    add_event(fake, "e2", stuck, "Warning", "FailedMount", MOUNT, "2026-01-01T00:03:00Z")
    add_event(fake, "e3", stuck, "Normal", "Scheduled", "Successfully assigned thicket/tc-8 to node-1", "2026-01-01T00:04:00Z")
    add_event(fake, "e4", oom, "Warning", "BackOff", "a warning about a pod with a better reason", "2026-01-01T00:05:00Z")
    return job


EXPECTED = {
    0: ("completed", "completed"),
    1: ("pending", f"Unschedulable: {SCHEDULER}"),
    2: ("pending", 'vllm: ImagePullBackOff: Back-off pulling image "vllm/vllm-openai:v9.9"'),
    3: ("running", "waiting for vllm to become ready"),
    4: ("failed", "worker exit 137 (OOMKilled: out of memory, over the container's memory limit); 2 restarts"),
    5: ("failed", ("worker exit 2 (bad input: the spec or flags are wrong; not retried): "
                   "error: tasks: stop 5 must be greater than start 10")),
    6: ("waiting", ("awaiting a retry after worker exit 3 (unavailable: vLLM, an env server or storage did not answer "
                    "in time; retried): error: vLLM at http://127.0.0.1:8000 did not answer within 600 s")),
    7: ("running", "vllm restarted (last: OOMKilled); 3 restarts"),
    8: ("pending", f"event FailedMount: {MOUNT}"),
    9: ("waiting", "no pod yet (parallelism 8)"),
}
SUMMARY = ("indexes    10: 1 completed [0], 2 failed [4-5], 2 running [3,7], 3 pending [1-2,8], 2 waiting")
INDEX_LINE = re.compile(r"^ *(\d+)  (\w+) +(.*)$")


def index_lines(out: str) -> dict[int, tuple[str, str]]:
    found = [m for m in map(INDEX_LINE.match, out.splitlines()) if m]
    assert len(found) == len({int(m[1]) for m in found}), out  # one line per index
    return {int(m[1]): (m[2], m[3]) for m in found}


def test_status_prints_the_summary_then_one_line_per_problem_index(fake, cli):
    sweep(fake)
    code, out, err = cli("status", "tc", "--no-storage")
    assert code == 0, err
    problems = {i: row for i, row in EXPECTED.items() if i not in (0, 3, 9)}  # not done, starting, or no pod yet
    assert index_lines(out) == problems, out
    lines = out.splitlines()
    assert lines[0] == "sweep      tc (namespace thicket)" and lines[2] == SUMMARY
    assert lines.index(SUMMARY) < min(i for i, line in enumerate(lines) if INDEX_LINE.match(line))
    assert min(i for i, line in enumerate(lines) if line.startswith("progress")) < lines.index("index  state      reason")
    assert "events" not in out  # they were read
    code, out, err = cli("status", "tc", "--no-storage", "--all")
    assert code == 0, err
    assert index_lines(out) == EXPECTED, out
    assert out.splitlines()[2] == SUMMARY


def test_status_json_has_the_summary_and_one_entry_per_index(fake, cli):
    sweep(fake)
    code, out, err = cli("status", "tc", "--no-storage", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"summary", "indexes"}
    summary = data["summary"]
    assert summary["sweep"] == "tc" and summary["state"] == "Running" and summary["completions"] == 10
    assert {k: summary[k] for k in IndexState} == {"completed": 1, "failed": 2, "running": 2, "pending": 3, "waiting": 2}
    entries = data["indexes"]
    assert [e["index"] for e in entries] == list(range(10))
    assert all({"index", "state", "reason", "restarts", "exit_code", "exit_meaning", "detail"} <= set(e) for e in entries)
    assert {e["index"]: e["state"] for e in entries} == {i: state for i, (state, _) in EXPECTED.items()}
    assert entries[1]["reason"] == "Unschedulable" and entries[1]["detail"] == SCHEDULER
    assert entries[4] | {"pod": None} == {
        "index": 4, "state": "failed", "reason": "worker exit 137 (OOMKilled: out of memory, over the container's memory limit)",
        "restarts": 2, "exit_code": 137, "exit_meaning": "OOMKilled: out of memory, over the container's memory limit",
        "detail": None, "pod": None, "attempts": 1}
    assert (entries[5]["exit_code"], entries[5]["detail"]) == (2, "error: tasks: stop 5 must be greater than start 10")
    assert entries[5]["exit_meaning"].startswith("bad input")
    assert (entries[6]["exit_code"], entries[6]["exit_meaning"].split(":")[0]) == (3, "unavailable")
    assert entries[6]["detail"] == "error: vLLM at http://127.0.0.1:8000 did not answer within 600 s"
    assert (entries[7]["restarts"], entries[7]["exit_code"]) == (3, None)
    assert (entries[8]["reason"], entries[8]["detail"]) == ("event FailedMount", MOUNT)
    assert entries[0]["exit_code"] == 0 and entries[0]["exit_meaning"] == "ok" and entries[9]["pod"] is None


def test_a_retried_index_shows_its_current_pod_and_the_previous_exit(fake):
    sweep(fake)
    add_pod(fake, 6, "Pending", "30Z", waiting("PodInitializing"), waiting("PodInitializing"),
            [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER}])
    row = sweep_status(connect(), "thicket", "tc", storage=False).rows[6]
    assert row.state is IndexState.PENDING and row.reason == "Unschedulable" and row.attempts == 2
    assert row.line().endswith("last worker exit 3 (unavailable: vLLM, an env server or storage did not "
                               "answer in time; retried); attempt 2")


def test_without_permission_on_events_status_still_answers_from_the_pods(fake, cli):
    sweep(fake)
    fake.forbidden.add(("GET", "events"))
    code, out, err = cli("status", "tc", "--no-storage", "--all")
    assert code == 0, err
    assert index_lines(out)[8] == ("pending", "vllm: ContainerCreating")
    assert "events     not read (forbidden (403)" in out and "apply k8s/rbac.yaml" in out


@pytest.mark.parametrize("output", ["text", "json"])
def test_watch_refreshes_until_the_job_finishes(fake, cli, monkeypatch, output):
    job = sweep(fake)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the Job completes during the first wait
        sleeps.append(seconds)
        job["status"] = {**job["status"], "active": 0, "completedIndexes": "0-9", "failedIndexes": "",
                         "completionTime": "2026-01-01T02:00:00Z",
                         "conditions": [{"type": "Complete", "status": "True"}]}

    monkeypatch.setattr(commands.time, "sleep", sleep)
    code, out, err = cli("status", "tc", "--no-storage", "--watch", "--interval", "7", "-o", output)  # the old spelling of --format
    assert code == 0, err
    assert sleeps == [7]
    if output == "json":
        first, last = (json.loads(line) for line in out.splitlines())
        assert first["summary"]["state"] == "Running" and last["summary"]["state"] == "Complete"
        assert {e["state"] for e in last["indexes"]} == {"completed"}
    else:
        assert "job        tc: Complete" in out and "10: 10 completed [0-9]" in out


def test_worker_exit_codes_have_a_meaning():
    assert [exit_meaning(code).split(":")[0] for code in range(5)] == ["ok", "failed", "bad input", "unavailable", "deadline"]
    assert exit_meaning(137, "OOMKilled").startswith("OOMKilled") and exit_meaning(137, "Error") == "killed (SIGKILL)"
    assert exit_meaning(143) == "terminated (SIGTERM)" and exit_meaning(134) == "killed by signal 6"


def test_the_submitter_role_reads_events():
    role = next(o for o in yaml.safe_load_all((ROOT / "k8s" / "rbac.yaml").read_text()) if o and o["kind"] == "Role")
    rules = [r for r in role["rules"] if "events" in r["resources"]]
    assert rules and rules[0]["apiGroups"] == [""] and {"get", "list", "watch"} <= set(rules[0]["verbs"])
    assert role["metadata"]["name"] == "thicket-submitter"
