"""A first sweep on EKS or GKE that cannot burn the cluster: `thicket submit` checks every Secret key
the pods read, the server's Kubernetes version and the model cache's StorageClass before it creates
anything, recreates a prefetch Job that failed before, runs one index as a canary before scaling out,
retries 429 / 5xx / dropped connections and says a 409 in one line; `thicket status` at scale (500
indexes, 2,000 pods) puts the summary first, lists only problem indexes and pages its list calls.
All against the in-memory API server (tests/support/fake_kube.py)."""

from __future__ import annotations

import copy

import pytest

from tests.support.fake_kube import FakeKube
from tests.support.manifests import BASE
from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.k8s.client import connect
from thicket.k8s.preflight import preflight
from thicket.k8s.render import render
from thicket.k8s.status import sweep_status
from thicket.k8s.submit import submit
from thicket.spec import parse_spec

QUIET = {"echo": lambda _: None}


def make_spec(**cluster):
    data = copy.deepcopy(BASE)
    data["cluster"] = cluster
    return parse_spec(data)


def posts(fake: FakeKube) -> list[str]:
    return [path for method, path in fake.requests if method == "POST"]


def write_spec(tmp_path, **cluster) -> str:
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**copy.deepcopy(BASE), "cluster": cluster}))
    return str(path)


# -- 1. every Secret key the pods read --------------------------------------------------------------
def test_submit_refuses_a_secret_without_the_key_the_pods_read(fake, tmp_path, cli):
    fake.put("secrets", {"metadata": {"name": "hf-token", "namespace": "thicket"}, "data": {"TOKEN": "eA=="}})
    spec = make_spec(hf_token_secret="hf-token")
    with pytest.raises(BadInput) as err:
        submit(connect(), spec, render(spec), **QUIET)
    message = str(err.value)
    assert message.startswith("cluster.hf_token_secret: secret 'hf-token' has no key HF_TOKEN (job/tc-prefetch "
                              "container prefetch env HF_TOKEN reads it; it has TOKEN)"), message
    assert "\n" not in message and not posts(fake)  # nothing created
    code, _, err_text = cli("submit", write_spec(tmp_path, hf_token_secret="hf-token"))
    assert code == 2 and err_text.count("\n") == 1 and "has no key HF_TOKEN" in err_text
    fake.get("secrets", "thicket", "hf-token")["data"]["HF_TOKEN"] = "eA=="
    assert submit(connect(), spec, render(spec), **QUIET)["job/tc"] == "created"


def test_an_optional_secret_key_may_be_missing():
    from thicket.k8s.preflight import secret_refs

    refs = secret_refs(render(make_spec()))
    keys = {(name, key) for name, key, _ in refs}
    assert ("thicket-s3", "AWS_ACCESS_KEY_ID") in keys and ("thicket-s3", "AWS_SECRET_ACCESS_KEY") in keys
    assert ("thicket-s3", "AWS_SESSION_TOKEN") not in keys  # optional: the pod starts without it


# -- 10. the server's version ------------------------------------------------------------------------
def test_submit_refuses_kubernetes_before_1_29_and_warns_before_1_33(fake, tmp_path, cli):
    fake.server_version = {"major": "1", "minor": "28+", "gitVersion": "v1.28.15-eks-7f4d3"}
    code, _, err = cli("submit", write_spec(tmp_path))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: the cluster runs Kubernetes v1.28.15-eks-7f4d3; thicket needs 1.29 or newer: its pods "
                          "use native sidecars, the Indexed Job's backoffLimitPerIndex and podFailurePolicy FailIndex")
    assert not posts(fake)
    fake.server_version = {"major": "1", "minor": "31", "gitVersion": "v1.31.4-gke.1"}
    code, out, err = cli("submit", write_spec(tmp_path), "--no-canary")
    assert code == 0, err
    assert "warning: the cluster runs Kubernetes v1.31.4-gke.1: native sidecars" in out and "beta" in out
    fake.server_version = {"major": "1", "minor": "33", "gitVersion": "v1.33.0"}
    assert not [w for w in preflight(connect(), make_spec()) if "Kubernetes" in w]


# -- 9. prefetch recovery, a missing StorageClass -----------------------------------------------------
def test_a_failed_prefetch_job_is_deleted_and_recreated(fake):
    fake.job_ends["prefetch"] = "Failed"  # a gated model, no token yet
    spec = make_spec()
    with pytest.raises(Unavailable, match="could not fill the model cache"):
        submit(connect(), spec, render(spec), **QUIET)
    assert fake.get("jobs", "thicket", "tc") is None  # the rollout was not submitted
    fake.job_ends["prefetch"] = "Complete"  # the token was fixed
    lines: list[str] = []
    done = submit(connect(), spec, render(spec), echo=lines.append)
    assert done["job/tc-prefetch"] == "recreated" and done["job/tc"] == "created"
    assert ("job/tc-prefetch Failed on an earlier submit: deleting it (propagationPolicy Background) "
            "and creating it again") in lines
    assert ("DELETE", "/apis/batch/v1/namespaces/thicket/jobs/tc-prefetch") in fake.requests


def test_a_missing_storage_class_is_refused_before_anything_is_created(fake):
    spec = make_spec(model_cache={"claim": "thicket-cache", "size": "200Gi", "storage_class": "efs-sc"})
    with pytest.raises(BadInput) as err:
        submit(connect(), spec, render(spec), **QUIET)
    assert str(err.value) == ("cluster.model_cache.storage_class: StorageClass 'efs-sc' does not exist on the cluster "
                              "(it has: standard, standard-rwx): set one that does (kubectl get storageclass)")
    assert not posts(fake)
    fake.storage_classes = {"gp2": {"metadata": {"name": "gp2"}}}  # EKS without a default class
    nameless = make_spec(model_cache={"claim": "thicket-cache", "size": "200Gi"})
    with pytest.raises(BadInput, match="not set, and the cluster has no default StorageClass \\(it has: gp2\\)"):
        submit(connect(), nameless, render(nameless), **QUIET)
    fake.forbidden.add(("GET", "storageclasses"))  # a namespaced Role: not checked here, caught while waiting
    preflight(connect(), nameless, render(nameless))


@pytest.mark.parametrize("forbidden", [False, True])
def test_a_pending_claim_without_its_storage_class_fails_the_wait_in_one_line(fake, forbidden):
    fake.job_ends.pop("prefetch")  # the prefetch pod would wait for the claim forever
    pvc = fake.get("persistentvolumeclaims", "thicket", "thicket-models")
    pvc.update(spec={"storageClassName": "efs-sc"}, status={"phase": "Pending"})
    fake.put("events", {"metadata": {"name": "pvc.1", "namespace": "thicket"}, "type": "Warning",
                        "reason": "ProvisioningFailed", "message": 'storageclass.storage.k8s.io "efs-sc" not found',
                        "involvedObject": {"kind": "PersistentVolumeClaim", "name": "thicket-models"}})
    if forbidden:
        fake.forbidden.add(("GET", "storageclasses"))
    spec = make_spec()
    with pytest.raises(BadInput) as err:
        submit(connect(), spec, render(spec), **QUIET)
    message = str(err.value)
    assert message.startswith("persistentvolumeclaim/thicket-models stays Pending: StorageClass 'efs-sc' does not exist")
    assert "delete it (kubectl -n thicket delete pvc thicket-models)" in message and "\n" not in message
    assert fake.get("jobs", "thicket", "tc") is None


# -- 11. conflicts and retries ------------------------------------------------------------------------
def test_a_conflict_is_one_line_saying_what_to_do(fake, tmp_path, cli):
    fake.failures[("POST", "jobs")] = [(409, {})]
    code, _, err = cli("submit", write_spec(tmp_path))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: job/tc-prefetch already exists or was changed while thicket submitted it")
    assert "--resume" in err and "`thicket cancel tc`" in err


def test_api_calls_are_retried_on_429_5xx_and_dropped_connections(fake):
    kube = connect()
    waits: list[float] = []
    kube.sleep = waits.append
    fake.failures[("GET", "configmaps")] = [(429, {"Retry-After": "7"}), (503, {}), (429, {"Retry-After": "600"})]
    assert kube.list("ConfigMap", "thicket", "") == []
    assert waits == [7.0, 2.0, 30.0]  # Retry-After honoured (capped), else a backoff
    waits.clear()
    fake.failures[("POST", "configmaps")] = [(500, {})]
    kube.create({"kind": "ConfigMap", "metadata": {"name": "x", "namespace": "thicket"}})
    assert fake.get("configmaps", "thicket", "x") is not None and waits == [1.0]
    waits.clear()
    fake.failures[("GET", "secrets")] = [(None, {})] * 4  # dropped without an answer
    assert kube.get("Secret", "thicket", "thicket-s3") is not None and waits == [1.0, 2.0, 4.0, 8.0]
    waits.clear()
    fake.failures[("GET", "jobs")] = [(503, {})] * 10
    with pytest.raises(Unavailable, match=r"answered 503 \(after 5 tries\)"):
        kube.list("Job", "thicket", "")
    assert len(waits) == 4  # bounded: 5 tries


def test_a_refused_connection_is_not_retried(tmp_path, monkeypatch):
    from tests.support.fake_kube import write_kubeconfig

    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")))
    kube = connect()
    waits: list[float] = []
    kube.sleep = waits.append
    with pytest.raises(Unavailable, match="cannot reach the Kubernetes API"):
        kube.list("Job", "thicket", "")
    assert waits == []


# -- 2. the canary ------------------------------------------------------------------------------------
def canary_pod(fake: FakeKube, phase: str, worker: dict, vllm: dict | None = None) -> None:
    fake.put("pods", {
        "metadata": {"name": "tc-0-aaaaa", "namespace": "thicket", "labels": {
            "thicket.dev/sweep": "tc", "app.kubernetes.io/component": "rollout", "batch.kubernetes.io/job-name": "tc",
            "batch.kubernetes.io/job-completion-index": "0"}},
        "status": {"phase": phase, "containerStatuses": [{"name": "worker", **worker}],
                   "initContainerStatuses": [{"name": "vllm", **(vllm or {"state": {"running": {}}, "ready": True})}]},
    })


def test_canary_runs_index_0_alone_then_scales(fake):
    spec = make_spec(parallelism=4)
    seen = []

    def sleep(_):
        job = fake.get("jobs", "thicket", "tc")
        seen.append((job["spec"]["parallelism"], fake.get("jobs", "thicket", "tc-aggregate")))
        if len(seen) == 2:
            job["status"] = {"completedIndexes": "0", "active": 1}

    lines: list[str] = []
    done = submit(connect(), spec, render(spec), echo=lines.append, canary=True, sleep=sleep)
    assert seen == [(1, None), (1, None)]  # one pod at a time, no aggregation Job while the canary runs
    assert fake.get("jobs", "thicket", "tc")["spec"]["parallelism"] == 4 and done["job/tc-aggregate"] == "created"
    assert any(line.startswith("job/tc: canary index 0 succeeded in") and line.endswith("parallelism 1 -> 4")
               for line in lines), lines
    assert fake.get("jobs", "thicket", "tc")["spec"]["completions"] == 10


@pytest.mark.parametrize("setup,reason", [
    (lambda f: canary_pod(f, "Failed", {"state": {"terminated": {
        "exitCode": 2, "reason": "Error", "message": "error: tasks: stop 5 must be greater than start 10\n"}}}),
     "index 0: worker exit 2 (bad input: the spec or flags are wrong; not retried): "
     "error: tasks: stop 5 must be greater than start 10"),
    (lambda f: canary_pod(f, "Pending", {"state": {"waiting": {"reason": "PodInitializing"}}},
                          {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}),
     "index 0: vllm: ImagePullBackOff: Back-off pulling image"),
])
def test_a_failed_canary_stops_the_sweep_with_its_reason(fake, tmp_path, cli, monkeypatch, setup, reason):
    spec = make_spec(parallelism=4)
    with pytest.raises(ThicketError) as err:
        submit(connect(), spec, render(spec), canary=True, sleep=lambda _: setup(fake), **QUIET)
    message = str(err.value)
    assert message.startswith(f"canary failed: job/tc {reason}; the Job is suspended"), message
    assert "\n" not in message and "`thicket logs tc --index 0`" in message
    job = fake.get("jobs", "thicket", "tc")
    assert job["spec"]["suspend"] is True and job["spec"]["parallelism"] == 1  # nothing left scaling
    assert fake.get("jobs", "thicket", "tc-aggregate") is None  # nothing else created


def test_canary_from_the_cli_exits_non_zero(fake, tmp_path, cli, monkeypatch):
    from thicket.k8s import canary as canary_module

    monkeypatch.setattr(canary_module.time, "sleep", lambda _: canary_pod(fake, "Failed", {"state": {"terminated": {
        "exitCode": 3, "reason": "Error", "message": "error: vLLM did not answer"}}}))
    code, out, err = cli("submit", write_spec(tmp_path, parallelism=4), "--canary")
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: canary failed: job/tc index 0: worker exit 3")
    assert "job/tc: canary: index 0 runs alone" in out and "thicket status" not in out


def test_canary_times_out_with_the_index_reason(fake):
    spec = make_spec(parallelism=4)
    ticks = iter(range(0, 100000, 600))
    with pytest.raises(Unavailable) as err:
        submit(connect(), spec, render(spec), canary=True, canary_timeout_s=1800, sleep=lambda _: None,
               clock=lambda: next(ticks), **QUIET)
    assert str(err.value).startswith("canary: job/tc index 0 committed no shard within 30m 00s (no pod yet)")
    assert fake.get("jobs", "thicket", "tc")["spec"]["suspend"] is True


# -- 8. status at scale -------------------------------------------------------------------------------
def big_sweep(fake: FakeKube) -> None:
    """500 indexes: 0-299 completed (4 failed attempts each before), 300-309 failed, 310-319 retrying,
    320-399 running after 4 failed attempts, 400-499 pending: 2,080 pods."""
    data = copy.deepcopy(BASE)
    data["tasks"] = {"env": "textcraft", "start": 0, "stop": 5000, "per_index": 10}
    data["cluster"] = {"parallelism": 200}
    spec = parse_spec(data)
    kinds = {"ConfigMap": "configmaps", "ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings",
             "Job": "jobs"}
    for obj in render(spec):
        if obj["kind"] in kinds:
            fake.put(kinds[obj["kind"]], copy.deepcopy(obj))
    fake.get("jobs", "thicket", "tc")["status"] = {
        "startTime": "2026-01-01T00:00:00Z", "active": 190, "completedIndexes": "0-299", "failedIndexes": "300-309"}
    exit3 = {"state": {"terminated": {"exitCode": 3, "reason": "Error"}}}
    for index in range(500):
        attempts = {range(0, 300): 4, range(300, 310): 4, range(310, 320): 3, range(320, 400): 4}
        failed = next((n for r, n in attempts.items() if index in r), 0)
        last = "Succeeded" if index < 300 else None if index < 310 else "Running" if index < 400 else "Pending"
        pods = [("Failed", exit3)] * failed + ([(last, {"state": {"running": {}}})] if last else [])
        for n, (phase, worker) in enumerate(pods):
            fake.put("pods", {
                "metadata": {"name": f"tc-{index}-{n}", "namespace": "thicket",
                             "creationTimestamp": f"2026-01-01T0{n}:00:00Z", "labels": {
                                 "thicket.dev/sweep": "tc", "app.kubernetes.io/component": "rollout",
                                 "batch.kubernetes.io/job-name": "tc", "batch.kubernetes.io/job-completion-index": str(index)}},
                "status": {"phase": phase, "containerStatuses": [{"name": "worker", **worker}]},
            })
    fake.put("events", {"metadata": {"name": "other", "namespace": "thicket"}, "type": "Warning", "reason": "BackOff",
                        "message": "another sweep's pod", "involvedObject": {"kind": "Pod", "name": "other-0-x"}})
    fake.put("events", {"metadata": {"name": "mine", "namespace": "thicket"}, "type": "Warning", "reason": "FailedMount",
                        "message": "volume not ready", "involvedObject": {"kind": "Pod", "name": "tc-450-0"}})


def test_status_of_500_indexes_puts_the_summary_first_and_fits_a_terminal(fake, cli):
    big_sweep(fake)
    assert sum(1 for key in fake.objects if key[0] == "pods") == 2080
    code, out, err = cli("status", "tc", "--no-storage")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("sweep      tc") and lines[1].startswith("job        tc: Running")
    assert lines[2].startswith("indexes    500: 300 completed [0-299], 10 failed [300-309]")
    assert any(line.startswith("progress") and "ETA" in line for line in lines[:8])
    assert len(lines) < 40, out
    rows = [line for line in lines if line[:5].strip().isdigit()]
    assert rows[0].split()[:2] == ["300", "failed"] and len(rows) == 20
    assert "… 81 more problem indexes: `thicket status tc --all` lists every index" in lines  # 10+10+80+1 stuck
    pod_lists = [limit for plural, limit in fake.list_limits if plural == "pods"]
    assert pod_lists and all(limit == 500 for limit in pod_lists) and len(pod_lists) == 5  # 2,080 pods, paged
    assert all(limit == 500 for plural, limit in fake.list_limits if plural == "events")
    code, out, _ = cli("status", "tc", "--no-storage", "--all")
    assert code == 0 and sum(1 for line in out.splitlines() if line[:5].strip().isdigit()) == 500


def test_status_reads_only_this_sweeps_events(fake):
    big_sweep(fake)
    status = sweep_status(connect(), "thicket", "tc", storage=False)
    row = status.rows[450]
    assert (row.reason, row.detail, row.problem) == ("event FailedMount", "volume not ready", True)
    assert not status.rows[460].problem and not status.rows[0].problem and status.rows[310].problem


def test_watch_of_500_indexes_shows_the_summary_and_eta_in_a_40_line_terminal(fake, cli, monkeypatch):
    from thicket.k8s import commands

    big_sweep(fake)
    monkeypatch.setenv("LINES", "40")
    monkeypatch.setenv("COLUMNS", "120")
    job = fake.get("jobs", "thicket", "tc")

    def sleep(_):  # the rollout ends during the first wait
        job["status"] = {**job["status"], "completionTime": "2026-01-01T09:00:00Z",
                         "conditions": [{"type": "Failed", "status": "True", "reason": "FailedIndexes"}]}

    monkeypatch.setattr(commands.time, "sleep", sleep)
    code, out, err = cli("status", "tc", "--no-storage", "--watch", "--interval", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("sweep      tc") and lines[2].startswith("indexes    500:")
    assert len(lines) <= 40 and any(line.startswith("progress") for line in lines[:8]), out


@pytest.mark.parametrize("message", [
    # EBS CSI (kubernetes-sigs/aws-ebs-csi-driver#2237), behind the external provisioner's prefix.
    'failed to provision volume with StorageClass "gp2": rpc error: code = InvalidArgument desc = Volume '
    "capabilities MULTI_NODE_MULTI_WRITER not supported. Only AccessModes[ReadWriteOnce] supported.",
    # The in-tree plugins (GCE PD, EBS).
    'Failed to provision volume with StorageClass "gp2": invalid AccessModes [ReadWriteMany]: only AccessModes '
    "[ReadWriteOnce ReadOnlyMany] are supported",
])
def test_a_class_that_refuses_read_write_many_stops_the_prefetch_wait_naming_the_class(fake, message):
    """EKS's gp2/gp3 and GKE's standard-rwo are block storage: a ReadWriteMany claim on them stays
    Pending with a ProvisioningFailed event; the prefetch Job would wait its whole timeout (3,600 s)
    and then blame the model id. The wait stops at the first check, naming the StorageClass."""
    fake.job_ends.pop("prefetch")  # the prefetch pod waits for the claim
    pvc = fake.get("persistentvolumeclaims", "thicket", "thicket-models")
    pvc.update(spec={"storageClassName": "gp2", "accessModes": ["ReadWriteMany"]}, status={"phase": "Pending"})
    fake.storage_classes["gp2"] = {"metadata": {"name": "gp2"}}
    fake.put("events", {"metadata": {"name": "pvc.2", "namespace": "thicket"}, "type": "Warning",
                        "reason": "ProvisioningFailed", "message": message,
                        "involvedObject": {"kind": "PersistentVolumeClaim", "name": "thicket-models"}})
    spec = make_spec()
    with pytest.raises(BadInput) as err:
        submit(connect(), spec, render(spec), **QUIET)
    text = str(err.value)
    assert text.startswith("persistentvolumeclaim/thicket-models stays Pending: StorageClass 'gp2' cannot "
                           "provision ReadWriteMany (event ProvisioningFailed: "), text
    assert "efs-sc on EKS" in text and "standard-rwx" in text and "\n" not in text
    assert "meta-llama" not in text and "model id" not in text
    assert fake.get("jobs", "thicket", "tc") is None  # no rollout
