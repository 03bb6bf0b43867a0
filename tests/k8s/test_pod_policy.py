"""thicket's own policy for its pods (thicket.k8s.rules.policy), rendered and enforced: vLLM as a
non-root uid with no passwd entry on a read-only root, nothing listening beyond localhost but the
metrics port, a start-up the worker bounds, per-container env, workload identity, sidecar memory
from its instances."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from tests.support.manifests import BASE, ROOT, SWEEPS, by_kind, containers, rollout, spec_with, sweep_id, variant_specs
from thicket.errors import BadInput
from thicket.k8s.client import connect
from thicket.k8s.render import render
from thicket.k8s.rules import exposure_problems, policy_problems, startup_problems
from thicket.k8s.submit import cancel, submit
from thicket.spec import load_spec, parse_spec



def _pod(spec):
    return rollout(render(spec))["spec"]["template"]["spec"]


@pytest.mark.parametrize("path", SWEEPS, ids=sweep_id)
def test_every_shipped_sweep_keeps_the_pod_policy(path):
    for obj in render(load_spec(path)):
        assert policy_problems(obj) == [], obj["metadata"]["name"]


@pytest.mark.parametrize("variant", sorted(variant_specs()))
def test_every_cluster_variant_keeps_the_pod_policy(variant):
    for obj in render(variant_specs()[variant]):
        assert policy_problems(obj) == [], (variant, obj["metadata"]["name"])


def test_vllm_runs_as_a_uid_without_a_passwd_entry_on_a_read_only_root():
    vllm = containers(_pod(spec_with()))["vllm"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert vllm["securityContext"]["readOnlyRootFilesystem"] is True
    assert env["USER"] and env["LOGNAME"]  # getpass.getuser() reads these before getpwuid
    assert env["HOME"] == "/tmp"
    caches = ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "NUMBA_CACHE_DIR")
    assert all(env[name].startswith("/tmp/") for name in caches)
    assert {"name": "tmp-vllm", "mountPath": "/tmp"} in vllm["volumeMounts"]


def test_servers_listen_on_localhost_and_only_metrics_is_open():
    pod = _pod(spec_with())
    by_name = containers(pod)
    for name in ("vllm", "env-textcraft"):
        args = by_name[name]["args"]
        assert args[args.index("--host") + 1] == "127.0.0.1", name
        assert "ports" not in by_name[name], name
        for probe in ("readinessProbe", "livenessProbe"):
            assert "exec" in by_name[name][probe], (name, probe)
    assert [p["name"] for p in by_name["worker"]["ports"]] == ["metrics"]
    assert "/health" in by_name["vllm"]["readinessProbe"]["exec"]["command"][-2]  # not /v1/models: 401 with an API key


def test_the_exposure_rule_catches_a_server_open_to_the_cluster():
    job = rollout(render(spec_with()))
    assert exposure_problems(job) == []
    opened = copy.deepcopy(job)
    vllm = next(c for c in opened["spec"]["template"]["spec"]["initContainers"] if c["name"] == "vllm")
    vllm["args"][vllm["args"].index("--host") + 1] = "0.0.0.0"
    vllm["ports"] = [{"name": "vllm", "containerPort": 8000}]
    vllm["readinessProbe"] = {"httpGet": {"path": "/health", "port": "vllm"}}
    problems = "\n".join(exposure_problems(opened))
    assert "must listen on --host 127.0.0.1" in problems
    assert "declares ports ['vllm']" in problems
    assert "readinessProbe reaches the pod IP" in problems


def test_the_worker_bounds_the_start_of_every_server():
    spec = spec_with(probes={"vllm_startup_s": 900, "env_startup_s": 120})
    pod = _pod(spec)
    by_name = containers(pod)
    assert all("startupProbe" not in c for c in pod["initContainers"])
    args = by_name["worker"]["args"]
    assert args[args.index("--wait-ready-timeout") + 1] == "900"  # the slowest server's start-up window
    assert "http://127.0.0.1:8000/health" in args and "http://127.0.0.1:8100/ready" in args
    assert by_name["vllm"]["livenessProbe"]["exec"]["command"][5] == "900"  # its start-up window, in the script
    assert by_name["env-textcraft"]["livenessProbe"]["exec"]["command"][5] == "120"
    assert by_name["worker"]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    args = _pod(spec_with(wait_ready_timeout_s=42))["containers"][0]["args"]
    assert args[args.index("--wait-ready-timeout") + 1] == "42"


def test_the_startup_rule_catches_a_sidecar_that_holds_the_worker_back():
    job = rollout(render(spec_with()))
    assert startup_problems(job) == []
    held = copy.deepcopy(job)
    held["spec"]["template"]["spec"]["initContainers"][0]["startupProbe"] = {"exec": {"command": ["true"]}}
    assert "startupProbe holds the worker's deadline back" in "\n".join(startup_problems(held))


def test_gpus_0_with_vllm_in_the_pod_is_bad_input():
    with pytest.raises(BadInput, match=r"^cluster.gpus: 0, but the pod serves its own vLLM"):
        render(spec_with(gpus=0))
    remote = parse_spec({**BASE, "policy": {"kind": "vllm", "model": "m", "url": "http://vllm.models:8000/v1"},
                         "cluster": {"gpus": 0}})
    assert "vllm" not in containers(_pod(remote))  # a vLLM served elsewhere needs no GPU here


def test_validate_refuses_gpus_0_for_a_cluster_sweep(tmp_path, cli):
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: tc\ntasks: {BASE['tasks']}\nsearch: {BASE['search']}\npolicy: {BASE['policy']}\n"
                    "output: s3://datasets/rollouts\ncluster: {gpus: 0}\n")
    code, _, err = cli("validate", str(spec))
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: cluster.gpus: 0, but the pod serves")


def test_cluster_env_reaches_each_container_and_reserved_names_are_refused():
    spec = spec_with(env={"vllm": {"VLLM_CPU_KVCACHE_SPACE": "40", "HF_HUB_OFFLINE": "1"},
                          "worker": {"TZ": "UTC"}, "aggregate": {"POLARS_MAX_THREADS": "2"}})
    objects = render(spec)
    by_name = containers(rollout(objects)["spec"]["template"]["spec"])
    vllm_env = {e["name"]: e.get("value") for e in by_name["vllm"]["env"]}
    assert vllm_env["VLLM_CPU_KVCACHE_SPACE"] == "40" and vllm_env["HF_HUB_OFFLINE"] == "1"
    assert {"name": "TZ", "value": "UTC"} in by_name["worker"]["env"]
    aggregate = by_kind(objects, "Job", "aggregate")[0]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "POLARS_MAX_THREADS", "value": "2"} in aggregate["env"]
    for name in ("HOME", "AWS_SECRET_ACCESS_KEY", "THICKET_ENV_URL", "1BAD"):
        with pytest.raises(BadInput, match=f"cluster.env.vllm: .*{name}"):
            spec_with(env={"vllm": {name: "x"}})


def test_a_service_account_gives_the_pods_workload_identity():
    objects = render(spec_with(service_account="thicket-s3-writer", s3_secret=None))
    pod = rollout(objects)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "thicket-s3-writer"
    assert pod["automountServiceAccountToken"] is False  # the identity webhooks mount their own token
    assert not any("secretKeyRef" in str(e) for e in containers(pod)["worker"]["env"])  # no static keys
    # The waiter has an account of its own (Jobs only); the user's (S3 rights) does the aggregation.
    binding = by_kind(objects, "RoleBinding")[0]
    assert binding["subjects"][0]["name"] == "tc-aggregate" == by_kind(objects, "ServiceAccount")[0]["metadata"]["name"]
    aggregate = by_kind(objects, "Job", "aggregate")[0]["spec"]["template"]["spec"]
    assert aggregate["serviceAccountName"] == "thicket-s3-writer"
    assert aggregate["automountServiceAccountToken"] is False


def test_a_scienceworld_sidecar_is_sized_from_its_instances():
    data = {**BASE, "tasks": {"env": "sciworld", "start": 0, "stop": 10, "per_index": 5}}
    sidecar = containers(_pod(parse_spec(data)))["env-sciworld"]
    args = sidecar["args"]
    assert args[args.index("--max-instances") + 1] == "32"
    assert sidecar["resources"]["limits"]["memory"] == sidecar["resources"]["requests"]["memory"] == f"{1024 + 32 * 200}Mi"
    many = {**data, "tasks": {**data["tasks"], "env_server": {"max_instances": 1024}}}
    with pytest.raises(BadInput, match=r"1024 live sciworld instances need about 201Gi"):
        render(parse_spec(many))


def test_an_env_sidecar_cannot_choose_its_own_host():
    with pytest.raises(BadInput, match="cluster.envs.0.args: --host is set by thicket"):
        spec_with(envs=[{"family": "textcraft", "args": ["--host", "0.0.0.0"]}])


def test_an_optional_network_policy_and_pod_monitor_select_the_rollout_pods(fake, tmp_path):
    spec = spec_with(network_policy=True, pod_monitor=True)
    objects = render(spec)
    assert by_kind(render(spec_with()), "NetworkPolicy") == []  # off by default
    (policy,) = by_kind(objects, "NetworkPolicy")
    (monitor,) = by_kind(objects, "PodMonitor")
    pod_labels = rollout(objects)["spec"]["template"]["metadata"]["labels"]
    for selector in (policy["spec"]["podSelector"], monitor["spec"]["selector"]):
        assert selector["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]  # egress: all but the metadata addresses (test_network.py)
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9090}]}]  # metrics only
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    kubernetes_validate.validate(policy, "1.37.0", strict=True)
    # Submitted and cancelled with the sweep.
    client = connect()
    done = submit(client, spec, objects, echo=lambda _: None)
    assert done["networkpolicy/tc-network"] == done["podmonitor/tc-metrics"] == "created"
    cancel(client, "thicket", "tc", echo=lambda _: None)
    assert fake.get("networkpolicies", "thicket", "tc-network") is None
    assert fake.get("podmonitors", "thicket", "tc-metrics") is None


def test_the_submitter_may_manage_the_optional_objects():
    import yaml

    role = next(o for o in yaml.safe_load_all((ROOT / "k8s" / "rbac.yaml").read_text()) if o and o["kind"] == "Role")
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               if "create" in rule["verbs"]}
    assert {("networking.k8s.io", "networkpolicies"), ("monitoring.coreos.com", "podmonitors")} <= granted
