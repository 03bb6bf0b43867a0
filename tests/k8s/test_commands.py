"""Controller commands (submit / status / logs / cancel / wait-job) through the real kubernetes
client: against no cluster (one-line errors), against an in-memory API server (tests/support/fake_kube.py),
and, only when KUBECONFIG is set, a server-side dry run against a live cluster."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.fake_kube import FakeKube, write_kubeconfig
from tests.support.manifests import BASE, rollout
from thicket.errors import BadInput, Unavailable
from thicket.index_sets import format_index_set, parse_index_set
from thicket.k8s.client import Forbidden, connect
from thicket.k8s.job_wait import wait_job
from thicket.k8s.preflight import preflight
from thicket.k8s.render import render
from thicket.k8s.status import index_pod, sweep_status
from thicket.k8s.submit import apply_object, cancel, submit
from thicket.shards.storage import commit_key
from thicket.spec import parse_spec
from thicket.storage.store import LocalStore

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")
LIVE = bool(os.environ.get("KUBECONFIG")) and os.environ.get("THICKET_TEST_LIVE_CLUSTER", "1") != "0"


def thicket(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    full.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run([THICKET, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=full)


def make_spec(**changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return parse_spec(data)


# -- no cluster ------------------------------------------------------------------------------------
def test_commands_without_a_cluster_fail_with_one_line(tmp_path, monkeypatch, cli):
    env = {"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)}
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    result = thicket("status", "tc", env=env)  # end to end once, as a separate process
    assert result.returncode == 2 and result.stderr.count("\n") == 1  # a user mistake, not an unreachable cluster
    assert result.stderr.startswith(f"error: no kubeconfig at {tmp_path / 'missing'} (from KUBECONFIG)"), result.stderr
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    for args in (["submit", str(spec)], ["status", str(spec)], ["logs", "tc", "--index", "0"], ["cancel", "tc"],
                 ["wait-job", "tc"]):
        code, _, err = cli(*args)
        assert code == 2, (args, err)
        assert err.startswith("error: no kubeconfig at ") and err.count("\n") == 1, err


def test_an_unreachable_api_server_is_a_one_line_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")))
    with pytest.raises(Unavailable, match=r"^cannot reach the Kubernetes API at http://127.0.0.1:1"):
        sweep_status(connect(), "thicket", "tc")


# -- submit ----------------------------------------------------------------------------------------
def test_submit_is_idempotent_and_reports_what_it_did(fake):
    spec = make_spec()
    kube = connect()
    lines: list[str] = []
    first = submit(kube, spec, render(spec), echo=lines.append)
    assert set(first.values()) == {"created"} and len(first) == 8  # with the prefetch Job and the aggregation's waiter
    assert lines[0] == "configmap/tc-spec created"
    assert set(submit(kube, spec, render(spec), echo=lines.append).values()) == {"unchanged"}
    wider = make_spec(cluster={"parallelism": 8})
    again = submit(kube, wider, render(wider), echo=lines.append)
    assert again["job/tc"] == "updated" and fake.get("jobs", "thicket", "tc")["spec"]["parallelism"] == 8
    assert again["configmap/tc-spec"] == "unchanged"


def test_make_rollout_submits_with_its_checks_and_says_what_it_did(fake, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    env = {**os.environ, "KUBECONFIG": fake.kubeconfig}
    make = ["make", "-o", "venv", "rollout", f"BIN={Path(sys.executable).parent}"]
    # The canary by default (the fake cluster runs no pod: NO_CANARY=1 here); `make -n` shows the command.
    dry = subprocess.run([*make, "-n", f"SPEC={spec}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "thicket submit \"$SPEC\"" in dry.stdout and "--no-canary" not in dry.stdout, dry.stdout
    run = subprocess.run([*make, f"SPEC={spec}", "NO_CANARY=1"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert "job/tc created" in run.stdout and "---" not in run.stdout  # what it did, no YAML mixed in
    assert fake.get("jobs", "thicket", "tc") is not None
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({**BASE, "output": "out"}))
    refused = subprocess.run([*make, f"SPEC={local}"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "output: 'out' is a local path" in refused.stderr  # submit's checks ran
    usage = subprocess.run(["make", "-o", "venv", "rollout"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert usage.returncode != 0 and "usage: make rollout SPEC=" in usage.stderr


def test_a_changed_pod_template_needs_replace(fake):
    kube = connect()
    spec = make_spec()
    submit(kube, spec, render(spec), echo=lambda _: None)
    changed = make_spec(search={"algorithm": "mcts", "iterations": 5}, cluster={"vllm_args": ["--max-model-len", "8192"]})
    before = copy.deepcopy(fake.objects)
    with pytest.raises(BadInput, match=r"job/tc exists with a different pod template .* --replace"):
        submit(kube, changed, render(changed), echo=lambda _: None)
    assert fake.objects == before  # refused before touching anything (the ConfigMap included)
    done = submit(kube, changed, render(changed), replace=True, echo=lambda _: None)
    assert done["job/tc"] == "replaced" and done["configmap/tc-spec"] == "updated"
    assert "8192" in str(fake.get("jobs", "thicket", "tc")["spec"]["template"])


def test_submit_cli_against_the_fake_cluster(fake, tmp_path, cli):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    code, out, err = cli("submit", str(spec), "--no-canary")
    assert code == 0, err
    assert "job/tc created" in out and "thicket status tc -n thicket" in out
    code, out, _ = cli("submit", str(spec), "--no-canary")
    assert code == 0 and out.count("unchanged") == 8  # ConfigMap, RBAC, prefetch, rollout, waiter and aggregation Jobs


@pytest.mark.parametrize(
    "setup,changes,expected",
    [
        (lambda f: f.namespaces.clear(), {}, "cluster.namespace: namespace 'thicket' does not exist"),
        (lambda f: f.objects.pop(("secrets", "thicket", "thicket-s3")), {}, "cluster.s3_secret: secret 'thicket-s3' not found in namespace 'thicket'"),
        (lambda f: f.get("secrets", "thicket", "thicket-s3")["metadata"].update(annotations={"thicket.dev/example": "true"}), {},
         "still holds the example placeholder values"),
        (lambda f: f.get("secrets", "thicket", "thicket-s3")["data"].pop("AWS_SECRET_ACCESS_KEY"), {}, "has no key AWS_SECRET_ACCESS_KEY"),
        (lambda f: f.objects.pop(("persistentvolumeclaims", "thicket", "thicket-models")), {},
         "cluster.model_cache.claim: persistentvolumeclaim 'thicket-models' not found"),
        (lambda f: None, {"cluster": {"image_pull_secrets": ["regcred"]}}, "cluster.image_pull_secrets: secret 'regcred' not found"),
        (lambda f: None, {"output": "out"}, "output: 'out' is a local path"),
        (lambda f: None, {"cluster": {"service_account": "s3-writer", "s3_secret": None}},
         "cluster.service_account: serviceaccount 's3-writer' not found"),
    ],
)
def test_submit_checks_namespace_secret_and_pvc_first(fake, setup, changes, expected):
    setup(fake)
    spec = make_spec(**changes)
    with pytest.raises(BadInput) as err:
        submit(connect(), spec, render(spec), echo=lambda _: None)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not any(method == "POST" for method, _ in fake.requests)  # nothing was created


def test_no_permission_is_a_one_line_forbidden_error(fake, cli):
    fake.forbidden |= {("POST", "jobs"), ("GET", "namespaces"), ("GET", "persistentvolumeclaims")}
    spec = make_spec()
    warnings = preflight(connect(), spec)
    assert warnings == ["cannot read persistentvolumeclaim/thicket-models (forbidden): not checked"]
    with pytest.raises(Forbidden) as err:
        submit(connect(), spec, render(spec), echo=lambda _: None)
    assert str(err.value).startswith("forbidden (403): jobs is forbidden: User \"test\" cannot post")
    fake.forbidden.add(("DELETE", "configmaps"))
    code, _, err = cli("cancel", "tc")
    assert code == 2 and err.startswith("error: forbidden (403): configmaps is forbidden") and err.count("\n") == 1


def test_apply_recreates_a_rolebinding_whose_role_changed(fake):
    kube = connect()
    binding = next(o for o in render(make_spec()) if o["kind"] == "RoleBinding")
    assert apply_object(kube, binding) == "created"
    changed = copy.deepcopy(binding)
    changed["roleRef"]["name"] = "other"
    assert apply_object(kube, changed) == "updated"
    assert fake.get("rolebindings", "thicket", "tc-aggregate")["roleRef"]["name"] == "other"


# -- status, logs, cancel, wait-job ------------------------------------------------------------------
def add_pod(fake: FakeKube, index: int, phase: str, name: str | None = None) -> str:
    name = name or f"tc-{index}-abcde"
    fake.put("pods", {
        "metadata": {"name": name, "namespace": "thicket", "labels": {
            "thicket.dev/sweep": "tc", "app.kubernetes.io/component": "rollout",
            "batch.kubernetes.io/job-name": "tc", "batch.kubernetes.io/job-completion-index": str(index)}},
        "spec": {"initContainers": [{"name": "vllm"}], "containers": [{"name": "worker"}]},
        "status": {"phase": phase},
    })
    return name


def test_status_combines_job_indexes_pods_and_committed_tasks(fake, tmp_path, cli):
    spec = make_spec(output=str(tmp_path / "store"))  # a local store the test can fill
    kube = connect()
    for obj in render(spec):
        fake.put({"ConfigMap": "configmaps", "ServiceAccount": "serviceaccounts", "Role": "roles",
                  "RoleBinding": "rolebindings", "Job": "jobs"}[obj["kind"]], copy.deepcopy(obj))
    job = fake.get("jobs", "thicket", "tc")
    job["status"] = {"startTime": "2026-01-01T00:00:00Z", "active": 2, "completedIndexes": "0-2,4", "failedIndexes": "3"}
    add_pod(fake, 5, "Running")
    add_pod(fake, 6, "Pending")
    add_pod(fake, 0, "Succeeded", "tc-0-old")
    store = LocalStore(tmp_path / "store" / "tc")
    for task in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 40, 41):
        store.put(commit_key(task), b"{}")
    status = sweep_status(kube, "thicket", "tc")
    assert status.completions == 10 and status.state == "Running"
    assert status.indexes == {"completed": {0, 1, 2, 4}, "failed": {3}, "running": {5}, "pending": {6}, "waiting": {7, 8, 9}}
    assert status.tasks_committed == 12 and status.tasks_total == 95
    assert status.eta_s is not None and status.eta_s > 0
    text = "\n".join(status.lines())
    assert "4 completed [0-2,4], 1 failed [3], 1 running [5], 1 pending [6], 3 waiting" in text
    assert "12 of 95 committed (12.6%)" in text and "aggregate  job tc-aggregate: waiting for the rollout" in text
    code, out, err = cli("status", "tc")
    assert code == 0, err
    assert "progress" in out and "ETA" in out and "12 of 95 committed" in out
    job["status"]["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T01:00:00Z"}]
    done = sweep_status(kube, "thicket", "tc")
    assert done.state == "Complete" and done.eta_s is None and done.elapsed_s == 3600


def test_status_of_an_unknown_sweep_names_it(fake):
    with pytest.raises(BadInput, match="no sweep 'nope' in namespace 'thicket'"):
        sweep_status(connect(), "thicket", "nope")


def test_logs_stream_the_latest_pod_of_an_index(fake, cli):
    spec = make_spec()
    submit(connect(), spec, render(spec), echo=lambda _: None)
    add_pod(fake, 1, "Failed", "tc-1-aaaaa")
    newest = add_pod(fake, 1, "Running", "tc-1-bbbbb")
    fake.logs[(newest, "worker")] = "tasks        10 (10 grown)\n"
    fake.logs[(newest, "vllm")] = "INFO vllm ready\n"
    kube = connect()
    assert index_pod(kube, "thicket", "tc", 1)["metadata"]["name"] == newest
    assert b"".join(kube.logs("thicket", newest, "worker", follow=False, tail=None)) == b"tasks        10 (10 grown)\n"
    code, out, err = cli("logs", "tc", "--index", "1", "-c", "vllm")
    assert code == 0 and out == "INFO vllm ready\n" and "tc-1-bbbbb" in err
    for args, expected in ((["--index", "99"], "--index: 99 is outside 0-9"), (["--index", "2"], "no pod for index 2"),
                           (["--index", "1", "-c", "nope"], "--container: 'nope' is not in pod")):
        code, _, err = cli("logs", "tc", *args)
        assert code == 2 and expected in err and err.count("\n") == 1, err


def test_logs_previous_reads_the_crashed_instance(fake, cli):
    """`--previous` asks pods/log for `previous=true`: the container's instance before its last restart
    (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#get-read-log-of-the-specified-pod),
    where a crash-looping vLLM's error is; without a restart the API answers 400, one line here."""
    spec = make_spec()
    submit(connect(), spec, render(spec), echo=lambda _: None)
    pod = add_pod(fake, 1, "Running", "tc-1-ccccc")
    fake.logs[(pod, "vllm")] = "INFO starting\n"
    fake.previous_logs[(pod, "vllm")] = "torch.OutOfMemoryError: CUDA out of memory\n"
    code, out, err = cli("logs", "tc", "--index", "1", "-c", "vllm", "--previous")
    assert code == 0 and out == "torch.OutOfMemoryError: CUDA out of memory\n" and "previous instance" in err, err
    assert ("GET", f"/api/v1/namespaces/thicket/pods/{pod}/log") in fake.requests
    code, _, err = cli("logs", "tc", "--index", "1", "-c", "worker", "--previous")
    assert code == 2 and 'previous terminated container "worker"' in err.splitlines()[-1] and err.count("error") == 1, err
    code, _, err = cli("logs", "tc", "--index", "1", "--previous", "--follow")
    assert code == 2 and err.count("\n") == 1 and "--follow" in err, err


def test_cancel_deletes_the_sweeps_objects_and_its_pods(fake):
    spec = make_spec()
    submit(connect(), spec, render(spec), echo=lambda _: None)
    add_pod(fake, 0, "Running")
    lines: list[str] = []
    # The four Jobs; the garbage collector takes what they own (thicket.k8s.owners).
    assert cancel(connect(), "thicket", "tc", echo=lines.append) == 4
    assert lines == ["job/tc deleted", "job/tc-aggregate deleted", "job/tc-aggregate-wait deleted", "job/tc-prefetch deleted"]
    assert not [k for k in fake.objects if k[0] in ("jobs", "pods", "configmaps", "roles")]
    assert ("secrets", "thicket", "thicket-s3") in fake.objects  # shared objects stay
    with pytest.raises(BadInput, match="nothing to cancel"):
        cancel(connect(), "thicket", "tc", echo=lines.append)


def test_wait_job_returns_when_the_job_finishes(fake):
    spec = make_spec()
    submit(connect(), spec, render(spec), echo=lambda _: None)
    job = fake.get("jobs", "thicket", "tc")
    polls = []

    def sleep(_):
        polls.append(1)
        if len(polls) == 2:
            job["status"] = {"completedIndexes": "0-8", "failedIndexes": "9",
                             "conditions": [{"type": "Failed", "status": "True", "reason": "FailedIndexes"}]}

    lines: list[str] = []
    assert wait_job(connect(), "thicket", "tc", interval_s=0, echo=lines.append, sleep=sleep) == "Failed"
    assert lines[-1] == "job/tc: Failed (FailedIndexes), 9 of 10 completed, 1 failed"
    ticks = iter(range(1000))
    with pytest.raises(Unavailable, match="did not finish within 5 s"):
        wait_job(connect(), "thicket", "tc-aggregate", timeout_s=5, interval_s=1, echo=lambda _: None,
                 sleep=lambda _: None, clock=lambda: next(ticks))


def test_index_sets_round_trip():
    assert parse_index_set("1,3-5,7") == {1, 3, 4, 5, 7} and parse_index_set("") == set()
    assert format_index_set({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert format_index_set(set(range(0, 40, 2)), limit=3) == "0,2,4,…"


# -- a live cluster (only with KUBECONFIG) -----------------------------------------------------------
@pytest.mark.skipif(not LIVE, reason="needs a live cluster: set KUBECONFIG (and THICKET_TEST_NAMESPACE)")
def test_live_cluster_accepts_the_rendered_objects_in_a_server_side_dry_run():
    namespace = os.environ.get("THICKET_TEST_NAMESPACE", "default")
    spec = make_spec(cluster={"namespace": namespace})
    kube = connect()
    for obj in render(spec):
        kube.request("POST", kube.path(obj["kind"], namespace), body=obj, query=[("dryRun", "All")])
    with pytest.raises(BadInput, match="no sweep"):
        sweep_status(kube, namespace, "thicket-no-such-sweep-0")


def test_the_rollout_pod_template_is_what_submit_sends(fake):
    spec = make_spec()
    submit(connect(), spec, render(spec), echo=lambda _: None)
    assert fake.get("jobs", "thicket", "tc")["spec"]["template"] == rollout(render(spec))["spec"]["template"]


# -- the worker's readiness wait ---------------------------------------------------------------------
def test_worker_waits_for_its_servers_then_gives_up_with_exit_3(tmp_path, cli):
    from tests.support.http_stub import QuietHandler, serving
    from thicket.readiness import wait_ready

    answers = iter([503, 503, 200])

    class Handler(QuietHandler):
        def do_GET(self):
            self.answer(next(answers, 200))

    with serving(Handler) as url:
        wait_ready([f"{url}/ready"], timeout_s=10, interval_s=0.01)
        assert next(answers, None) is None  # it asked until the server said yes
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**BASE, "policy": {"kind": "uniform"}, "output": str(tmp_path / "out")}))
    code, _, err = cli("worker", str(spec), "--index", "0", "--wait-for", "http://127.0.0.1:1/v1/models",
                       "--wait-ready-timeout", "0.2")
    assert code == 3 and err.startswith("error: http://127.0.0.1:1/v1/models did not answer within 0.2 s"), err
    assert not list((tmp_path / "out").rglob("trees"))  # nothing ran (the spec was checked and recorded first)
