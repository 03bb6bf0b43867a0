"""What keeps a first sweep from burning a cluster: pod deadlines, a failure budget, an aggregation
that reserves nothing during the rollout, a waiter that survives a bad minute of the API server,
least-privilege RBAC and tokens, bounded local disk, tight liveness after a restart, pinned
images. Each rule is shown to catch the rendering that came before it."""

from __future__ import annotations

import copy
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.manifests import BASE, by_kind, containers, rollout, spec_with
from thicket.cluster_spec.aggregate import GPU_NODE_LABELS
from thicket.errors import BadInput, ThicketError
from thicket.k8s.client import connect
from thicket.k8s.containers import LIVENESS_SCRIPT
from thicket.k8s.job_wait import release_job, wait_job
from thicket.k8s.render import render
from thicket.k8s.rules import bounded_problems, placement_problems, policy_problems, rbac_problems, sweep_problems
from thicket.k8s.submit import submit
from thicket.spec import parse_spec


def _pod(objects, component="rollout"):
    return by_kind(objects, "Job", component)[0]["spec"]["template"]["spec"]


# -- 1. deadlines ------------------------------------------------------------------------------------
def test_the_rollout_pod_has_a_deadline_above_the_worker_s_own():
    spec = spec_with(probes={"vllm_startup_s": 900}, start_allowance_s=600)
    spec = parse_spec({**spec.model_dump(mode="json", exclude_unset=True), "run": {"index_timeout_s": 7200}})
    pod = _pod(render(spec))
    # start allowance + --wait-ready-timeout + index deadline + last batch (shard_wait_s) and its
    # storage retries + grace
    assert pod["activeDeadlineSeconds"] == 600 + 900 + 7200 + 60 + 300 + 60 + 60
    # Without an index deadline, the worker's worst case: every task to its task_timeout_s, one by one.
    pod = _pod(render(spec_with(probes={"vllm_startup_s": 900}, start_allowance_s=600)))
    per_index = spec_with().tasks.per_index
    assert pod["activeDeadlineSeconds"] == 600 + 900 + per_index * 3600 + 60 + 300 + 60 + 60


def test_the_deadline_rules_catch_a_missing_or_short_deadline():
    objects = render(spec_with())
    assert not any(policy_problems(o) for o in objects) and sweep_problems(objects) == []
    old = copy.deepcopy(objects)
    del _pod(old)["activeDeadlineSeconds"]  # as rendered before
    assert any("no activeDeadlineSeconds" in p for p in bounded_problems(rollout(old)))
    assert any("not above the worker's own deadlines" in p for p in sweep_problems(old))
    short = copy.deepcopy(objects)
    _pod(short)["activeDeadlineSeconds"] = 1800  # the worker's --wait-ready-timeout alone
    assert any("not above the worker's own deadlines" in p for p in sweep_problems(short))
    with pytest.raises(BadInput, match="cluster.active_deadline_s: 1800 s is not above"):
        render(spec_with(active_deadline_s=1800))
    assert _pod(render(spec_with(active_deadline_s=4000)))["activeDeadlineSeconds"] == 4000


def test_the_aggregation_pod_has_a_deadline_and_the_waiter_none():
    objects = render(spec_with(aggregate={"active_deadline_s": 3600}))
    assert _pod(objects, "aggregate")["activeDeadlineSeconds"] == 3600
    assert "activeDeadlineSeconds" not in _pod(objects, "aggregate-wait")  # the rollout may wait for GPUs unboundedly
    old = copy.deepcopy(objects)
    del _pod(old, "aggregate")["activeDeadlineSeconds"]
    assert any("no activeDeadlineSeconds" in p for p in bounded_problems(by_kind(old, "Job", "aggregate")[0]))


# -- 2. a failure budget -----------------------------------------------------------------------------
@pytest.mark.parametrize(("count", "per_index", "budget"), [(100, 10, 1), (1000, 10, 5), (100, 1, 5), (3, 1, 1)])
def test_max_failed_indexes_defaults_to_a_small_share(count, per_index, budget):
    spec = spec_with()
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["tasks"] = {**data["tasks"], "start": 0, "stop": count, "per_index": per_index}
    job = rollout(render(parse_spec(data)))
    assert job["spec"]["maxFailedIndexes"] == budget


def test_max_failed_indexes_is_configurable_and_refused_above_the_indexes():
    assert rollout(render(spec_with(max_failed_share=0.5)))["spec"]["maxFailedIndexes"] == 5
    assert rollout(render(spec_with(max_failed_indexes=0)))["spec"]["maxFailedIndexes"] == 0
    with pytest.raises(BadInput, match="max_failed_indexes: 11 is above the sweep's 10 indexes"):
        render(spec_with(max_failed_indexes=11))
    old = copy.deepcopy(rollout(render(spec_with())))
    del old["spec"]["maxFailedIndexes"]
    assert any("without maxFailedIndexes" in p for p in bounded_problems(old))


# -- 7. the aggregation reserves nothing during the rollout ------------------------------------------
def test_the_aggregation_job_is_suspended_and_released_by_a_tiny_waiter():
    objects = render(spec_with())
    jobs = [o["metadata"]["name"] for o in by_kind(objects, "Job")]
    assert jobs[-2:] == ["tc-aggregate-wait", "tc-aggregate"]
    aggregate = by_kind(objects, "Job", "aggregate")[0]
    assert aggregate["spec"]["suspend"] is True
    wait = _pod(objects, "aggregate-wait")["containers"][0]
    assert wait["resources"]["requests"]["cpu"] == "10m" and wait["resources"]["requests"]["memory"] == "96Mi"
    old = copy.deepcopy(objects)
    old.remove(by_kind(old, "Job", "aggregate-wait")[0])
    assert sweep_problems(old) == ["Job/tc-aggregate: suspended, and no Job of the sweep releases it"]


def test_a_changed_aggregation_comes_with_a_new_waiter():
    """`submit --replace` recreates a Job whose template changed: a new (suspended) aggregation Job
    must come with a new waiter, or a finished one would never release it."""
    def hashes(objects):
        return {o["metadata"]["name"]: o["metadata"]["annotations"]["thicket.dev/template-sha256"] for o in by_kind(objects, "Job")}

    before, after = hashes(render(spec_with())), hashes(render(spec_with(resources={"aggregate": {"requests": {"cpu": "4"}}})))
    assert before["tc-aggregate"] != after["tc-aggregate"] and before["tc-aggregate-wait"] != after["tc-aggregate-wait"]
    assert before["tc"] == after["tc"]


def test_the_aggregation_pods_stay_off_gpu_nodes_by_default():
    objects = render(spec_with())
    for component in ("aggregate", "aggregate-wait"):
        pod = _pod(objects, component)
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": k, "operator": "DoesNotExist"} for k in GPU_NODE_LABELS]}]
        assert "tolerations" not in pod  # nor do they tolerate the GPU nodes' taint
        assert placement_problems(by_kind(objects, "Job", component)[0]) == []
    old = copy.deepcopy(by_kind(objects, "Job", "aggregate")[0])
    del old["spec"]["template"]["spec"]["affinity"]  # as rendered before
    assert placement_problems(old) and placement_problems(rollout(objects)) == []  # GPU pods are placed by their request
    off = render(spec_with(aggregate={"avoid_node_labels": [], "node_selector": {"pool": "cpu"}}))
    assert "affinity" not in _pod(off, "aggregate") and _pod(off, "aggregate")["nodeSelector"] == {"pool": "cpu"}
    with pytest.raises(BadInput, match="not a valid label key"):
        spec_with(aggregate={"avoid_node_labels": ["bad key"]})


@pytest.fixture()
def kube(fake):
    kube = connect()
    kube.sleep = lambda _: None  # the client's own retries
    return kube


def test_wait_job_survives_429_5xx_and_a_dropped_connection(fake, kube):
    """A fake API that fails three times (503, 429 with Retry-After, a dropped connection), then answers."""
    spec = spec_with()
    submit(kube, spec, render(spec), echo=lambda _: None)
    fake.get("jobs", "thicket", "tc")["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    waits: list[float] = []
    kube.sleep = waits.append
    fake.failures[("GET", "jobs")] = [(503, {}), (429, {"Retry-After": "7"}), (None, {})]
    assert wait_job(kube, "thicket", "tc", interval_s=0, echo=lambda _: None, sleep=waits.append) == "Complete"
    assert waits[:2] == [1, 7]  # a backoff after the 503; the 429's Retry-After
    assert fake.failures[("GET", "jobs")] == []


def test_wait_job_outlasts_an_outage_longer_than_the_client_s_retries(fake, kube):
    spec = spec_with()
    submit(kube, spec, render(spec), echo=lambda _: None)
    fake.get("jobs", "thicket", "tc")["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    kube.retry_tries = 2
    fake.failures[("GET", "jobs")] = [(503, {})] * 5
    lines: list[str] = []
    waited: list[float] = []
    assert wait_job(kube, "thicket", "tc", interval_s=0, echo=lines.append, sleep=waited.append) == "Complete"
    assert sum("did not answer" in line for line in lines) == 2 and waited  # two failed polls, backed off
    fake.failures[("GET", "jobs")] = [(503, {})] * 100
    with pytest.raises(Exception, match="503"):  # an outage past outage_s still ends the wait
        wait_job(kube, "thicket", "tc", interval_s=0, echo=lambda _: None, sleep=lambda _: None, outage_s=0)


def test_release_unsuspends_or_hands_the_job_to_kueue(fake, kube):
    spec = spec_with()
    submit(kube, spec, render(spec), echo=lambda _: None)
    assert fake.get("jobs", "thicket", "tc-aggregate")["spec"]["suspend"] is True
    fake.failures[("PATCH", "jobs")] = [(503, {})]
    release_job(kube, "thicket", "tc-aggregate", echo=lambda _: None, sleep=lambda _: None)
    assert fake.get("jobs", "thicket", "tc-aggregate")["spec"]["suspend"] is False
    fake.get("jobs", "thicket", "tc-aggregate")["spec"]["suspend"] = True
    release_job(kube, "thicket", "tc-aggregate", queue="cpu-queue", echo=lambda _: None)
    live = fake.get("jobs", "thicket", "tc-aggregate")
    assert live["spec"]["suspend"] is True and live["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "cpu-queue"


def test_the_wait_job_command_releases_the_aggregation(fake, cli):
    spec = spec_with()
    submit(connect(), spec, render(spec), echo=lambda _: None)
    fake.get("jobs", "thicket", "tc")["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    code, out, err = cli("wait-job", "tc", "--interval", "0", "--release", "tc-aggregate")
    assert code == 0, err
    assert "job/tc-aggregate: released" in out and "going on with the tasks it committed" in err
    assert fake.get("jobs", "thicket", "tc-aggregate")["spec"]["suspend"] is False


# -- 11. least privilege, bounded disk, tight liveness, pinned images --------------------------------
def test_the_role_names_the_two_jobs_and_the_rule_refuses_the_old_one():
    objects = render(spec_with())
    role = by_kind(objects, "Role")[0]
    assert rbac_problems(role) == []
    old = copy.deepcopy(role)
    old["rules"] = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}]
    problems = rbac_problems(old)
    assert any("no resourceNames" in p for p in problems) and any("['list', 'watch']" in p for p in problems)


def test_only_the_waiter_mounts_an_api_token():
    objects = render(spec_with())
    assert _pod(objects, "aggregate")["automountServiceAccountToken"] is False
    assert _pod(objects, "aggregate-wait")["automountServiceAccountToken"] is True
    assert by_kind(objects, "ServiceAccount")[0]["automountServiceAccountToken"] is False
    old = copy.deepcopy(by_kind(objects, "Job", "aggregate")[0])
    old["spec"]["template"]["spec"]["automountServiceAccountToken"] = True  # as rendered before
    assert any("automountServiceAccountToken" in p for p in bounded_problems(old))


def test_hf_token_reaches_vllm_only_where_it_downloads():
    prefetched = containers(_pod(render(spec_with(hf_token_secret="hf-token"))))["vllm"]
    names = [v["name"] for v in prefetched["env"]]
    assert "HF_HUB_OFFLINE" in names and "HF_TOKEN" not in names
    downloads = containers(_pod(render(spec_with(hf_token_secret="hf-token", model_cache={"claim": None}))))["vllm"]
    assert "HF_TOKEN" in [v["name"] for v in downloads["env"]] and "HF_HUB_OFFLINE" not in str(downloads["env"])
    job = copy.deepcopy(rollout(render(spec_with(hf_token_secret="hf-token"))))
    vllm = containers(job["spec"]["template"]["spec"])["vllm"]
    vllm["env"].append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}})
    assert any("gets HF_TOKEN" in p for p in bounded_problems(job))


def test_every_container_and_empty_dir_has_a_disk_bound():
    objects = render(spec_with(ephemeral_storage={"worker": "3Gi"}))
    for component in ("rollout", "aggregate", "aggregate-wait"):
        pod = _pod(objects, component)
        for container in containers(pod).values():
            res = container["resources"]
            assert res["requests"]["ephemeral-storage"] == res["limits"]["ephemeral-storage"]
        assert all("sizeLimit" in v["emptyDir"] for v in pod["volumes"] if "emptyDir" in v)
    pod = _pod(objects)
    assert {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if "emptyDir" in v} == {
        "tmp": "3Gi", "tmp-env-textcraft": "2Gi", "dshm": "16Gi", "tmp-vllm": "10Gi"}
    assert containers(pod)["worker"]["resources"]["limits"]["ephemeral-storage"] == "4096Mi"  # 3Gi + 1Gi of logs
    assert containers(pod)["vllm"]["resources"]["limits"]["ephemeral-storage"] == "11264Mi"
    old = copy.deepcopy(rollout(objects))
    for volume in old["spec"]["template"]["spec"]["volumes"]:
        if "emptyDir" in volume:
            volume["emptyDir"].pop("sizeLimit", None)
    for container in containers(old["spec"]["template"]["spec"]).values():
        for section in container["resources"].values():
            section.pop("ephemeral-storage", None)
    problems = bounded_problems(old)
    assert any("emptyDir tmp has no sizeLimit" in p for p in problems)
    assert any("worker: no ephemeral-storage in limits" in p for p in problems)
    with pytest.raises(BadInput, match="not a Kubernetes quantity"):
        spec_with(ephemeral_storage={"vllm": "lots"})


def test_the_pod_monitor_carries_the_kube_prometheus_stack_release_label():
    (monitor,) = by_kind(render(spec_with(pod_monitor=True)), "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (mine,) = by_kind(render(spec_with(pod_monitor=True, pod_monitor_labels={"release": "prom"})), "PodMonitor")
    assert mine["metadata"]["labels"]["release"] == "prom"
    with pytest.raises(BadInput, match="pod_monitor_labels"):
        spec_with(pod_monitor_labels={"release": "not a value"})


def test_the_liveness_rule_refuses_a_probe_blind_after_a_restart():
    job = copy.deepcopy(rollout(render(spec_with())))
    assert bounded_problems(job) == []
    vllm = containers(job["spec"]["template"]["spec"])["vllm"]
    vllm["livenessProbe"]["initialDelaySeconds"] = 1800  # as rendered before
    assert any("blinds it after every restart" in p for p in bounded_problems(job))


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _liveness(url: str, window: int, folder) -> int:
    return subprocess.run([sys.executable, "-c", LIVENESS_SCRIPT, url, "2", str(window), str(folder)],
                          timeout=30).returncode


def test_the_liveness_script_waits_out_the_window_only_until_the_first_answer(tmp_path):
    down = "http://127.0.0.1:9/health"  # nothing listens
    assert _liveness(down, 10**9, tmp_path) == 0  # starting: within its window, never answered
    assert _liveness(down, 0, tmp_path) == 1  # the window is over
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert _liveness(f"http://127.0.0.1:{server.server_address[1]}/health", 10**9, tmp_path) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert list(tmp_path.glob(".thicket-answered-*"))
    assert _liveness(down, 10**9, tmp_path) == 1  # answered once, then stopped: dead at once, window or not


@pytest.mark.parametrize("field", ["worker", "env", "env_java", "vllm"])
def test_images_may_be_pinned_by_digest(field):
    digest = "sha256:" + "a" * 64
    image = f"registry.example.com/team/img@{digest}"
    objects = render(spec_with(images={field: image}))
    if field in ("worker", "vllm"):
        assert image in str(objects)
    with pytest.raises(BadInput, match="a digest is sha256: and 64 lowercase hex digits"):
        spec_with(images={field: "registry.example.com/team/img@sha256:abc"})
    assert spec_with(images={field: f"registry.example.com/team/img:v1@{digest}"})


def test_render_refuses_what_the_new_rules_refuse():
    """The rules run inside render: a rendering that breaks one is a thicket bug (one line)."""
    from thicket.k8s import render as render_module

    original = render_module.rollout_job

    def without_deadline(spec, spec_hash):
        job = original(spec, spec_hash)
        del job["spec"]["template"]["spec"]["activeDeadlineSeconds"]
        return job

    render_module.rollout_job = without_deadline
    try:
        with pytest.raises(ThicketError, match="thicket's pod policy"):
            render(parse_spec(copy.deepcopy(BASE)))
    finally:
        render_module.rollout_job = original
