"""`thicket render`: schema-valid (Kubernetes 1.29 and 1.37, strict), golden files, the shape of
the rollout and aggregation Jobs.

Regenerate the golden files after an intended change:
    THICKET_UPDATE_GOLDEN=1 .venv/bin/pytest tests/k8s/test_render.py
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.manifests import BASE, ROOT, SWEEPS, by_kind, sweep_id, containers, kustomize_objects, rollout, spec_with, variant_specs
from thicket import __version__
from thicket.cluster_spec.cluster import ClusterSpec
from thicket.errors import BadInput
from thicket.k8s.render import render, to_yaml
from thicket.spec import load_spec, parse_spec
from thicket.vllm_server import LOGPROBS_MODE

GOLDEN = ROOT / "tests" / "k8s" / "golden"
K8S_VERSIONS = ("1.29.0", "1.37.0")
UPDATE = os.environ.get("THICKET_UPDATE_GOLDEN") == "1"
THICKET = str(Path(sys.executable).parent / "thicket")


# -- schema validation ---------------------------------------------------------------------------
def test_the_installed_kubernetes_validate_ships_the_versions_we_check():
    versions = kubernetes_validate.utils.all_versions()
    for version in K8S_VERSIONS:
        assert version in versions


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_and_kustomized_object_validates_strictly(version):
    objects = [o for path in SWEEPS for o in render(load_spec(path))]
    objects += [o for s in variant_specs().values() for o in render(s)]
    objects += kustomize_objects() + kustomize_objects("k8s/examples")
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on {version}: {err.message} at {list(err.path)}")


def test_strict_validation_catches_an_unknown_field():
    job = copy.deepcopy(rollout(render(spec_with())))
    job["spec"]["template"]["spec"]["containers"][0]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.37.0", strict=True)


# -- golden files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", SWEEPS, ids=sweep_id)
def test_example_sweeps_match_their_golden_manifests(path):
    text = to_yaml(render(load_spec(path)))
    golden = GOLDEN / f"{sweep_id(path)}.yaml"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no {golden}: run THICKET_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == golden.read_text(), f"{path.name} renders differently from {golden.name}: if intended, rerun with THICKET_UPDATE_GOLDEN=1"
    assert to_yaml(render(load_spec(path))) == text  # deterministic


def test_render_cli_prints_the_golden_yaml_and_writes_one_file_per_object(tmp_path, cli):
    spec = ROOT / "sweeps" / "textcraft-mcts.yaml"
    out = subprocess.run([THICKET, "render", str(spec)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (GOLDEN / "textcraft-mcts.yaml").read_text()
    assert "s3://" in out.stderr  # the note: a local output is lost with the pod
    code, _, err = cli("render", str(spec), "-o", str(tmp_path / "m"))
    assert code == 0, err
    files = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert files == ["00-configmap-textcraft-mcts-spec.yaml", "01-serviceaccount-textcraft-mcts-aggregate.yaml",
                     "02-role-textcraft-mcts-aggregate.yaml", "03-rolebinding-textcraft-mcts-aggregate.yaml",
                     "04-job-textcraft-mcts-prefetch.yaml", "05-job-textcraft-mcts.yaml",
                     "06-job-textcraft-mcts-aggregate-wait.yaml", "07-job-textcraft-mcts-aggregate.yaml"]
    code, _, err = cli("render", str(tmp_path / "missing.yaml"))
    assert code == 2 and err.count("\n") == 1 and "cannot read the spec" in err


# -- the rollout Job -----------------------------------------------------------------------------
def test_rollout_job_is_indexed_with_per_index_retries_and_a_failure_policy():
    spec = spec_with(parallelism=4, backoff_limit_per_index=2, max_failed_indexes=3, ttl_seconds_after_finished=600)
    job = rollout(render(spec))
    s = job["spec"]
    assert s["completionMode"] == "Indexed"
    assert s["completions"] == len(spec.tasks.index_ranges()) == 10
    assert s["parallelism"] == 4 and s["backoffLimitPerIndex"] == 2
    assert s["maxFailedIndexes"] == 3
    assert s["ttlSecondsAfterFinished"] == 600
    assert s["template"]["spec"]["restartPolicy"] == "Never"
    rules = s["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
    # Exit 2 (bad input) and exit 3 (a server or storage unreachable) fail the index at once (fault_price).
    assert {"action": "FailIndex", "onExitCodes": {"containerName": "worker", "operator": "In", "values": [2, 3]}} in rules
    assert "suspend" not in s  # no Kueue queue: created running
    assert job["metadata"]["name"] == "tc" and job["metadata"]["namespace"] == "thicket"


def test_pod_runs_vllm_and_env_as_native_sidecars_and_the_worker_as_main_container():
    objects = render(spec_with())
    pod = rollout(objects)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["env-textcraft", "vllm"]
    assert [c["name"] for c in pod["containers"]] == ["worker"]
    for sidecar in pod["initContainers"]:
        assert sidecar["restartPolicy"] == "Always"
        live, ready = sidecar["livenessProbe"]["exec"]["command"], sidecar["readinessProbe"]["exec"]["command"]
        assert live[3:5] == ready[3:5] and "initialDelaySeconds" not in sidecar["livenessProbe"]
    env = pod["initContainers"][0]
    assert env["args"][:2] == ["serve-env", "textcraft"] and "--port" in env["args"]
    assert env["readinessProbe"]["exec"]["command"][-2] == "http://127.0.0.1:8100/ready"
    vllm = pod["initContainers"][1]
    assert re.fullmatch(r"vllm/vllm-openai:v[\d.]+", vllm["image"])
    assert vllm["readinessProbe"]["exec"]["command"][-2] == "http://127.0.0.1:8000/health"
    assert vllm["livenessProbe"]["exec"]["command"][5] == "1800"  # loading a large model takes a while
    args = vllm["args"]
    assert "--enable-prefix-caching" in args
    assert args[args.index("--model") + 1] == "meta-llama/Llama-3.1-8B-Instruct"
    assert args[args.index("--served-model-name") + 1] == "Llama-3.1-8B-Instruct"
    res = vllm["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "1"
    assert {"name": "HF_HOME", "value": "/models/huggingface"} in vllm["env"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "thicket-models"
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    assert mounts["/models"] == "model-cache" and mounts["/dev/shm"] == "dshm"


def test_worker_reads_its_index_waits_for_its_servers_and_gets_s3_credentials_from_a_secret():
    objects = render(spec_with())
    worker = rollout(objects)["spec"]["template"]["spec"]["containers"][0]
    assert worker["image"] == ClusterSpec().images.worker and worker["command"] == ["thicket"]
    args = worker["args"]
    assert args[:2] == ["worker", "/etc/thicket/spec.yaml"] and "--index" not in args  # $JOB_COMPLETION_INDEX
    waits = [args[i + 1] for i, a in enumerate(args) if a == "--wait-for"]
    assert waits == ["http://127.0.0.1:8000/health", "http://127.0.0.1:8100/ready"]
    assert "--wait-ready-timeout" in args
    env = {e["name"]: e for e in worker["env"]}
    assert "JOB_COMPLETION_INDEX" not in env  # set by the Job controller; never overridden
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "thicket-s3", "key": name}
    assert env["THICKET_ENV_URL"]["value"] == "http://127.0.0.1:8100"
    sc = worker["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in worker["volumeMounts"]
    pod_sc = rollout(objects)["spec"]["template"]["spec"]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_configmap_holds_the_validated_spec_pointed_at_the_pods_vllm():
    objects = render(spec_with(vllm_port=8001))
    config = by_kind(objects, "ConfigMap")[0]
    pod_spec = parse_spec(yaml.safe_load(config["data"]["spec.yaml"]), "configmap")
    assert pod_spec.policy.url == "http://127.0.0.1:8001/v1" and pod_spec.policy.model == "Llama-3.1-8B-Instruct"
    assert not pod_spec.policy.launches_server  # the worker never tries to start vLLM itself
    assert pod_spec.tasks == spec_with().tasks and pod_spec.output == BASE["output"]
    volume = next(v for v in rollout(objects)["spec"]["template"]["spec"]["volumes"] if v["name"] == "spec")
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    hashes = {o["metadata"]["annotations"]["thicket.dev/spec-sha256"] for o in objects if o["kind"] in ("ConfigMap", "Job")}
    assert len(hashes) == 1


def test_aggregation_job_waits_for_the_rollout_with_a_read_only_job_role():
    objects = render(spec_with())
    job = by_kind(objects, "Job", "aggregate")[0]
    assert job["spec"]["suspend"] is True  # no pod, nothing reserved, until the waiter releases it
    pod = job["spec"]["template"]["spec"]
    assert "initContainers" not in pod and pod["automountServiceAccountToken"] is False
    assert pod["containers"][0]["args"] == ["aggregate", "s3://datasets/rollouts/tc"]
    assert not any("nvidia.com/gpu" in str(c.get("resources")) for c in containers(pod).values())
    waiter = by_kind(objects, "Job", "aggregate-wait")[0]
    wait_pod = waiter["spec"]["template"]["spec"]
    wait = wait_pod["containers"][0]
    assert wait["args"] == ["wait-job", "tc", "--namespace", "thicket", "--release", "tc-aggregate",
                            "--start-watchdog", "900"]  # cluster.start_allowance_s (thicket.k8s.start_watch)
    assert wait_pod["automountServiceAccountToken"] is True
    role = by_kind(objects, "Role")[0]
    assert role["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": ["tc"], "verbs": ["get", "patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": ["tc-aggregate"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    binding = by_kind(objects, "RoleBinding")[0]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": wait_pod["serviceAccountName"], "namespace": "thicket"}]
    assert by_kind(objects, "ServiceAccount")[0]["metadata"]["name"] == wait_pod["serviceAccountName"]
    assert rollout(objects)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_every_object_carries_the_recommended_labels():
    for obj in render(spec_with()):
        labels = obj["metadata"]["labels"]
        for key in ("name", "instance", "component", "part-of", "managed-by", "version"):
            assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], key)
        assert labels["app.kubernetes.io/version"] == __version__ and labels["thicket.dev/sweep"] == "tc"
        assert obj["metadata"]["namespace"] == "thicket"


def test_cluster_options_reach_the_pods():
    objects = render(variant_specs()["full"])
    job = rollout(objects)
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == "rollouts"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0] == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert pod["tolerations"][1]["tolerationSeconds"] == 60
    assert pod["priorityClassName"] == "batch-low" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    c = containers(pod)
    assert set(c) == {"env-textcraft", "env-frozenlake", "vllm", "worker"}
    assert c["env-frozenlake"]["args"][-2:] == ["--max-instances", "64"]
    vllm = c["vllm"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert vllm["args"][vllm["args"].index("--tensor-parallel-size") + 1] == "2"
    assert vllm["args"][-2:] == ["--max-model-len", "16384"]
    token = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}}
    assert token not in vllm["env"]  # it runs offline on the prefetched cache
    assert token in containers(by_kind(objects, "Job", "prefetch")[0]["spec"]["template"]["spec"])["prefetch"]["env"]
    assert job["spec"]["maxFailedIndexes"] == 2 and job["spec"]["ttlSecondsAfterFinished"] == 3600
    agg = by_kind(objects, "Job", "aggregate")[0]
    # Kueue would admit a labelled suspended Job at once: the waiter adds the label on release.
    assert "kueue.x-k8s.io/queue-name" not in agg["metadata"]["labels"]
    waiter = by_kind(objects, "Job", "aggregate-wait")[0]
    assert waiter["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "cpu-queue"
    args = waiter["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--release-queue") + 1] == "cpu-queue"
    assert agg["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}


def test_every_rendered_vllm_samples_with_thicket_s_logprobs_mode():
    """The stored logprobs are those of the sampling distribution (thicket.vllm_server.LOGPROBS_MODE):
    every rendered vLLM says so once, whatever the spec's vllm_args (the same mode is not repeated)."""
    specs = [load_spec(path) for path in SWEEPS] + list(variant_specs().values())
    specs.append(spec_with(vllm_args=["--logprobs-mode", LOGPROBS_MODE, "--max-model-len", "8192"]))
    specs.append(spec_with(vllm_args=[f"--logprobs_mode={LOGPROBS_MODE}"]))
    rendered = 0
    for spec in specs:
        for job in by_kind(render(spec), "Job", "rollout"):
            vllm = containers(job["spec"]["template"]["spec"]).get("vllm")
            if vllm is None:
                continue
            rendered += 1
            modes = [a for a in vllm["args"] if a.replace("_", "-").startswith("--logprobs-mode")]
            assert modes == ["--logprobs-mode"], vllm["args"]
            assert vllm["args"][vllm["args"].index("--logprobs-mode") + 1] == LOGPROBS_MODE == "processed_logprobs"
    assert rendered >= 6


@pytest.mark.parametrize("args", [["--logprobs-mode", "raw_logprobs"], ["--logprobs-mode=processed_logits"],
                                  ["--logprobs_mode", "raw_logits"], ["--logprobs-mode"]])
def test_a_vllm_arg_with_another_logprobs_mode_is_a_one_line_error(args):
    with pytest.raises(BadInput) as err:
        spec_with(vllm_args=args)
    message = str(err.value)
    assert message.startswith("s.yaml: cluster.vllm_args: --logprobs") and "\n" not in message, message
    assert "thicket sets --logprobs-mode processed_logprobs" in message

def test_policies_without_a_local_vllm_get_no_gpu_and_no_vllm_container():
    for path in ("frozenlake-dense.yaml", "taxi-tot.yaml"):  # uniform; openai at a URL
        pod = rollout(render(load_spec(ROOT / "sweeps" / path)))["spec"]["template"]["spec"]
        assert "vllm" not in containers(pod) and "nvidia.com/gpu" not in str(pod)
    variant = render(variant_specs()["no-pvc-no-envs"])
    assert [o["kind"] for o in variant] == ["ConfigMap", "Job"]
    pod = rollout(variant)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["vllm"]
    # 8B parameters x 3 bytes + 4Gi: the pod downloads the model itself, into a bounded emptyDir
    assert next(v for v in pod["volumes"] if v["name"] == "model-cache") == {"name": "model-cache", "emptyDir": {"sizeLimit": "27Gi"}}
    assert "AWS_ACCESS_KEY_ID" not in str(pod)


def test_java_families_get_the_java_env_image():
    from thicket.cluster_spec.sidecars import EnvSidecar

    cluster = ClusterSpec()
    assert cluster.sidecar_image(EnvSidecar(family="textcraft")) == cluster.images.env
    sidecar = EnvSidecar.model_construct(family="scienceworld", port=8100, image=None, args=[], resources=None)
    assert cluster.sidecar_image(sidecar) == cluster.images.env_java  # ScienceWorld needs Java 17
