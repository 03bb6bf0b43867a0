"""Spec -> Kubernetes objects (plain dicts): the rollout Indexed Job and what it needs.

`render(spec)` returns, in apply order:

- ConfigMap `<sweep>-spec`: the validated spec as the pods see it (policy pointed at the pod's vLLM);
- ServiceAccount, Role (get/list/watch Jobs in the namespace only) and RoleBinding for the
  aggregation Job;
- Job `<sweep>`: Indexed, one completion per task range; each pod runs vLLM and the env
  server(s) as native sidecars and the worker as its one main container, so the pod completes
  when the worker exits;
- Job `<sweep>-aggregate` (CPU only): waits for the rollout Job to finish, then runs
  `thicket aggregate`.

The output is a pure function of the spec and the thicket version (golden-file friendly).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from thicket import __version__
from thicket.cluster_spec import EnvSidecar, Resources
from thicket.errors import BadInput, ThicketError
from thicket.logs import FORMAT_VARIABLE as LOG_FORMAT_VARIABLE
from thicket.spec import SweepSpec, parse_spec
from thicket.vllm_server import COMMON_ARGS

Obj = dict[str, Any]

APP = "thicket"
SWEEP_LABEL = "thicket.dev/sweep"
COMPONENT_LABEL = "app.kubernetes.io/component"
SPEC_HASH = "thicket.dev/spec-sha256"
TEMPLATE_HASH = "thicket.dev/template-sha256"
SWEEP_URI = "thicket.dev/sweep-uri"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SPEC_DIR = "/etc/thicket"
SPEC_KEY = "spec.yaml"
WORKER = "worker"
METRICS_PORT_NAME = "metrics"
VLLM = "vllm"
BAD_INPUT_EXIT = 2  # thicket.errors.ExitCode.BAD_INPUT: rerunning the index will not help
MAX_JOB_NAME = 52  # pods are named <job>-<index>-<5 random>; their hostname <job>-<index> must fit 63
MAX_COMPLETIONS = 100_000  # above this an Indexed Job needs maxFailedIndexes and parallelism <= 10,000
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
VLLM_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]


def k8s_name(base: str, suffix: str = "", limit: int = 63) -> str:
    """`base + suffix`, shortened with a stable hash when longer than `limit` (a DNS-1123 label)."""
    name = base + suffix
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:6]
    keep = limit - len(suffix) - len(digest) - 1
    return f"{base[:keep].rstrip('-')}-{digest}{suffix}"


def names(sweep: str) -> dict[str, str]:
    return {
        "rollout": k8s_name(sweep, limit=MAX_JOB_NAME),
        "aggregate": k8s_name(sweep, "-aggregate", MAX_JOB_NAME),
        "spec": k8s_name(sweep, "-spec"),
    }


def labels(spec: SweepSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/instance": spec.name,
        COMPONENT_LABEL: component,
        "app.kubernetes.io/part-of": APP,
        "app.kubernetes.io/managed-by": APP,
        "app.kubernetes.io/version": __version__,
        SWEEP_LABEL: spec.name,
    }


def serves_vllm(spec: SweepSpec) -> bool:
    """A vLLM sidecar when the policy is vLLM served here (a model to load, or a localhost URL)."""
    policy = spec.policy
    if policy.kind != "vllm":
        return False
    return policy.url is None or (urlparse(policy.url).hostname or "") in LOCAL_HOSTS


def served_model_name(spec: SweepSpec) -> str:
    model = spec.policy.model or ""
    return Path(model).name if spec.policy.url is None else model  # as `thicket run` names it


def pod_spec_data(spec: SweepSpec) -> dict[str, Any]:
    """The spec the pods run: as written (unset defaults left out), the policy aimed at the pod's
    vLLM, without the `cluster` section (the controller's business: changing parallelism must
    not change the pods)."""
    data = spec.model_dump(mode="json", exclude_unset=True, exclude={"cluster"})
    if serves_vllm(spec):
        policy = data.setdefault("policy", {})
        policy.pop("server", None)
        policy.update(kind="vllm", model=served_model_name(spec), url=f"http://127.0.0.1:{spec.cluster.vllm_port}/v1")
        data = parse_spec(data, "cluster spec").model_dump(mode="json", exclude_unset=True)
    return data


def index_count(spec: SweepSpec) -> int:
    """len(spec.tasks.index_ranges()) without building the ranges: the Job's completions."""
    return math.ceil(spec.tasks.count / spec.tasks.per_index)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _resources(res: Resources, gpus: int = 0) -> Obj:
    out: Obj = {}
    limits = dict(res.limits)
    requests = dict(res.requests)
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
        requests["nvidia.com/gpu"] = str(gpus)
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _security(read_only: bool) -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only,
        "runAsNonRoot": True,
    }


def _pod_security(spec: SweepSpec) -> Obj:
    uid = spec.cluster.run_as_user
    return {
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of a large model cache
        "runAsGroup": uid,
        "runAsNonRoot": True,
        "runAsUser": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _http_probe(path: str, port: str, period: int, timeout: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _env(name: str, value: str) -> Obj:
    return {"name": name, "value": value}


def _secret_env(name: str, secret: str, key: str, optional: bool = False) -> Obj:
    ref: Obj = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def s3_env(spec: SweepSpec) -> list[Obj]:
    """S3 credentials from the cluster.s3_secret Secret, under the names the storage spec reads."""
    secret = spec.cluster.s3_secret
    if secret is None:
        return []
    storage = getattr(spec, "storage", None)

    def env_name(field: str, default: str) -> str:
        return getattr(storage, field, None) or default

    return [
        _secret_env(env_name("access_key_id_env", "AWS_ACCESS_KEY_ID"), secret, "AWS_ACCESS_KEY_ID"),
        _secret_env(env_name("secret_access_key_env", "AWS_SECRET_ACCESS_KEY"), secret, "AWS_SECRET_ACCESS_KEY"),
        _secret_env(env_name("session_token_env", "AWS_SESSION_TOKEN"), secret, "AWS_SESSION_TOKEN", optional=True),
        _secret_env("AWS_ENDPOINT_URL", secret, "AWS_ENDPOINT_URL", optional=True),
        _secret_env("AWS_DEFAULT_REGION", secret, "AWS_DEFAULT_REGION", optional=True),
    ]


def _env_var_suffix(family: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in family).upper()


def _sidecar_container_name(family: str) -> str:
    return k8s_name("env-" + "".join(c if c.isalnum() else "-" for c in family.lower()).strip("-"))


def _env_sidecar(spec: SweepSpec, sidecar: EnvSidecar, index: int) -> Obj:
    c = spec.cluster
    name = _sidecar_container_name(sidecar.family)
    port = f"env{index}"
    return {
        "name": name,
        "image": c.sidecar_image(sidecar),
        "imagePullPolicy": c.images.pull_policy,
        "restartPolicy": "Always",  # a native sidecar: started before the worker, stopped after it
        "command": ["thicket"],
        "args": ["serve-env", sidecar.family, "--host", "0.0.0.0", "--port", str(sidecar.port), *sidecar.args],
        "env": [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1")],
        "ports": [{"name": port, "containerPort": sidecar.port, "protocol": "TCP"}],
        "startupProbe": _http_probe(
            "/ready", port, 2, c.probes.timeout_s, max(1, math.ceil(c.probes.env_startup_s / 2))
        ),
        "readinessProbe": _http_probe("/ready", port, c.probes.period_s, c.probes.timeout_s, c.probes.readiness_failures),
        "resources": _resources(sidecar.resources or c.resources.env),
        "securityContext": _security(read_only=True),
        "volumeMounts": [{"name": f"tmp-{name}", "mountPath": "/tmp"}],
    }


def pod_model(spec: SweepSpec) -> str:
    """What the pod's vLLM loads: a hub id, or an absolute path inside the model cache mount. A path
    on this machine (relative, or absolute elsewhere) would be taken for a hub id in the pod."""
    c = spec.cluster
    model = c.model or spec.policy.model or ""
    field = "cluster.model" if c.model else "policy.model (cluster.model unset)"
    cache = c.model_cache_path.rstrip("/") + "/"
    if model.startswith("/"):
        if not model.startswith(cache):
            raise BadInput(f"{field}: {model!r} is outside the model cache ({c.model_cache_path}), which is all "
                           "the pod's vLLM can see; use a hub id or a path under cluster.model_cache_path")
    elif model.startswith(("./", "../", "~")) or Path(model).is_dir():
        raise BadInput(f"{field}: {model!r} is a folder on this machine, which a pod cannot see; set cluster.model "
                       f"to a hub id, or copy the folder into the model cache and name it there "
                       f"(e.g. {cache}{Path(model).name})")
    return model


def vllm_args(spec: SweepSpec) -> list[str]:
    c = spec.cluster
    args = [
        "--model", pod_model(spec),
        "--served-model-name", served_model_name(spec),
        "--host", "0.0.0.0",  # kubelet probes reach the pod IP
        "--port", str(c.vllm_port),
        *COMMON_ARGS,  # as `thicket run` starts vLLM: prefix caching, cached_tokens in usage
    ]
    extra = [a for a in c.vllm_args if a not in COMMON_ARGS]
    flags = {a.split("=", 1)[0] for a in extra}
    if c.gpus > 1 and not flags & {"--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp"}:
        args += ["--tensor-parallel-size", str(c.gpus)]
    return args + extra


def _vllm_container(spec: SweepSpec) -> Obj:
    c = spec.cluster
    env = [
        _env("HF_HOME", c.hf_home),
        _env("HOME", "/tmp"),
        _env("VLLM_NO_USAGE_STATS", "1"),
        _env("DO_NOT_TRACK", "1"),
    ]
    if c.hf_token_secret:
        env.append(_secret_env("HF_TOKEN", c.hf_token_secret, "HF_TOKEN"))
    p = c.probes
    return {
        "name": VLLM,
        "image": c.images.vllm,
        "imagePullPolicy": c.images.pull_policy,
        "restartPolicy": "Always",
        "command": VLLM_COMMAND,
        "args": vllm_args(spec),
        "env": env,
        "ports": [{"name": "vllm", "containerPort": c.vllm_port, "protocol": "TCP"}],
        # Loading a large model can take many minutes: the startup probe allows vllm_startup_s.
        "startupProbe": _http_probe("/v1/models", "vllm", p.period_s, p.timeout_s, max(1, math.ceil(p.vllm_startup_s / p.period_s))),
        "readinessProbe": _http_probe("/v1/models", "vllm", p.period_s, p.timeout_s, p.readiness_failures),
        "resources": _resources(c.resources.vllm, c.gpus),
        "securityContext": _security(read_only=False),
        "volumeMounts": [
            {"name": "model-cache", "mountPath": c.model_cache_path},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp-vllm", "mountPath": "/tmp"},
        ],
    }


def _worker_container(spec: SweepSpec, sidecars: list[EnvSidecar]) -> Obj:
    c = spec.cluster
    waits: list[str] = []
    env = [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1"), _env(LOG_FORMAT_VARIABLE, "json")]
    if serves_vllm(spec):
        waits += ["--wait-for", f"http://127.0.0.1:{c.vllm_port}/v1/models"]
    if sidecars:
        # The worker's envs come from the sidecar serving tasks.env (thicket.envs.sidecar).
        main = next((s for s in sidecars if s.family == spec.tasks.env), sidecars[0])
        env.append(_env("THICKET_ENV_URL", f"http://127.0.0.1:{main.port}"))
    for sidecar in sidecars:
        url = f"http://127.0.0.1:{sidecar.port}"
        waits += ["--wait-for", f"{url}/ready"]
        env.append(_env(f"THICKET_ENV_URL_{_env_var_suffix(sidecar.family)}", url))
    return {
        "name": WORKER,
        "image": c.images.worker,
        "imagePullPolicy": c.images.pull_policy,
        "command": ["thicket"],
        # The index comes from $JOB_COMPLETION_INDEX, which the Job controller sets in every pod.
        "args": ["worker", f"{SPEC_DIR}/{SPEC_KEY}", "--wait-ready-timeout", str(c.wait_ready_timeout_s),
                 "--metrics-port", str(c.metrics_port), *waits],
        "env": env + s3_env(spec),
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": c.metrics_port, "protocol": "TCP"}],
        "resources": _resources(c.resources.worker),
        "securityContext": _security(read_only=True),
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _common_pod(spec: SweepSpec, node_selector: dict, tolerations: list) -> Obj:
    c = spec.cluster
    pod: Obj = {"restartPolicy": "Never", "enableServiceLinks": False}
    if c.priority_class_name:
        pod["priorityClassName"] = c.priority_class_name
    if node_selector:
        pod["nodeSelector"] = dict(sorted(node_selector.items()))
    if tolerations:
        pod["tolerations"] = [t.manifest() for t in tolerations]
    if c.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in c.image_pull_secrets]
    pod["securityContext"] = _pod_security(spec)
    return pod


def rollout_job(spec: SweepSpec, spec_hash: str) -> Obj:
    c = spec.cluster
    n = names(spec.name)
    completions = index_count(spec)
    max_failed = None if c.max_failed_indexes is None else min(c.max_failed_indexes, completions)
    parallelism = min(c.parallelism, completions)
    if completions > MAX_COMPLETIONS and (max_failed is None or max_failed > 10_000 or parallelism > 10_000):
        raise BadInput(
            f"tasks.per_index: {completions} pods is above the {MAX_COMPLETIONS} an Indexed Job allows unless "
            "cluster.max_failed_indexes and cluster.parallelism are <= 10000; raise tasks.per_index"
        )
    sidecars = c.sidecars(spec.tasks)
    init = [_env_sidecar(spec, s, i) for i, s in enumerate(sidecars)]
    volumes: list[Obj] = [
        {"name": "spec", "configMap": {"name": n["spec"]}},
        {"name": "tmp", "emptyDir": {}},
    ]
    volumes += [{"name": f"tmp-{ctr['name']}", "emptyDir": {}} for ctr in init]
    if serves_vllm(spec):
        init.append(_vllm_container(spec))
        cache = (
            {"persistentVolumeClaim": {"claimName": c.model_cache_pvc}} if c.model_cache_pvc else {"emptyDir": {}}
        )
        volumes += [
            {"name": "model-cache", **cache},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": c.shm_size}},
            {"name": "tmp-vllm", "emptyDir": {}},
        ]
    pod = _common_pod(spec, c.node_selector, c.tolerations)
    pod["automountServiceAccountToken"] = False  # the rollout pods never talk to the API server
    pod["terminationGracePeriodSeconds"] = 60
    if init:
        pod["initContainers"] = init
    pod["containers"] = [_worker_container(spec, sidecars)]
    pod["volumes"] = volumes
    template = {
        "metadata": {
            "labels": labels(spec, "rollout"),
            "annotations": {
                "kubectl.kubernetes.io/default-container": WORKER,
                SPEC_HASH: spec_hash,
                # The worker's /metrics, for Prometheus' usual pod discovery.
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(c.metrics_port),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": pod,
    }
    job_spec: Obj = {
        "completionMode": "Indexed",
        "completions": completions,
        "parallelism": parallelism,
        "backoffLimitPerIndex": c.backoff_limit_per_index,
    }
    if max_failed is not None:
        job_spec["maxFailedIndexes"] = max_failed
    job_spec["podFailurePolicy"] = {
        "rules": [
            # Preemption, eviction, node drain: not the pod's fault, retry without counting it.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # Bad input (exit 2): retrying this index cannot help.
            {"action": "FailIndex", "onExitCodes": {"containerName": WORKER, "operator": "In", "values": [BAD_INPUT_EXIT]}},
        ]
    }
    if c.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = c.ttl_seconds_after_finished
    job_spec["template"] = template
    immutable = {k: job_spec[k] for k in ("completionMode", "completions", "backoffLimitPerIndex", "podFailurePolicy", "template")}
    job_labels = labels(spec, "rollout")
    if c.queue:
        job_labels[QUEUE_LABEL] = c.queue
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": n["rollout"],
            "namespace": c.namespace,
            "labels": job_labels,
            "annotations": {SPEC_HASH: spec_hash, SWEEP_URI: spec.sweep_uri, TEMPLATE_HASH: digest(immutable)},
        },
        "spec": job_spec,
    }


def aggregate_objects(spec: SweepSpec, spec_hash: str) -> list[Obj]:
    """ServiceAccount + Role + RoleBinding (read Jobs in the namespace) + the aggregation Job."""
    c = spec.cluster
    n = names(spec.name)
    name = n["aggregate"]

    def meta() -> Obj:
        return {"name": name, "namespace": c.namespace, "labels": labels(spec, "aggregate")}

    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(),
        "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": c.namespace}],
    }
    agg = c.aggregate
    small = Resources(requests={"cpu": "100m", "memory": "256Mi"}, limits={"memory": "512Mi"})
    wait = {
        "name": "wait-rollout",
        "image": c.images.worker,
        "imagePullPolicy": c.images.pull_policy,
        "command": ["thicket"],
        "args": ["wait-job", n["rollout"], "--namespace", c.namespace],
        "env": [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1")],
        "resources": _resources(small),
        "securityContext": _security(read_only=True),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    main = {
        "name": "aggregate",
        "image": c.images.worker,
        "imagePullPolicy": c.images.pull_policy,
        "command": ["thicket"],
        "args": ["aggregate", spec.sweep_uri],
        "env": [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1"), *s3_env(spec)],
        "resources": _resources(c.resources.aggregate),
        "securityContext": _security(read_only=True),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod = _common_pod(spec, agg.node_selector, agg.tolerations)
    pod["serviceAccountName"] = name
    pod["automountServiceAccountToken"] = True  # wait-job reads the rollout Job's status
    pod["initContainers"] = [wait]
    pod["containers"] = [main]
    pod["volumes"] = [{"name": "tmp", "emptyDir": {}}]
    job_labels = labels(spec, "aggregate")
    if agg.queue:
        job_labels[QUEUE_LABEL] = agg.queue
    job_spec: Obj = {"backoffLimit": agg.backoff_limit}
    if c.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = c.ttl_seconds_after_finished
    job_spec["template"] = {
        "metadata": {"labels": labels(spec, "aggregate"), "annotations": {"kubectl.kubernetes.io/default-container": "aggregate"}},
        "spec": pod,
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": c.namespace,
            "labels": job_labels,
            "annotations": {SPEC_HASH: spec_hash, SWEEP_URI: spec.sweep_uri},
        },
        "spec": job_spec,
    }
    job["metadata"]["annotations"][TEMPLATE_HASH] = digest({"template": job_spec["template"]})
    return [account, role, binding, job]


def render(spec: SweepSpec, check: bool = True) -> list[Obj]:
    """Every object of the sweep, in apply order."""
    n = names(spec.name)
    text = to_yaml_text(pod_spec_data(spec))
    spec_hash = hashlib.sha256(text.encode()).hexdigest()
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": n["spec"],
            "namespace": spec.cluster.namespace,
            "labels": labels(spec, "spec"),
            "annotations": {SPEC_HASH: spec_hash, SWEEP_URI: spec.sweep_uri},
        },
        "data": {SPEC_KEY: text},
    }
    objects = [config]
    aggregate = aggregate_objects(spec, spec_hash) if spec.cluster.aggregate.enabled else []
    objects += aggregate[:3]
    objects.append(rollout_job(spec, spec_hash))
    objects += aggregate[3:]
    if check:
        from thicket.k8s_rules import check_objects

        problems = check_objects(objects)
        if problems:
            raise ThicketError(f"rendered manifests break an API rule (a thicket bug): {problems[0]}")
    return objects


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (the spec in the ConfigMap stays readable); no aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml_text(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)


def to_yaml(objects: list[Obj]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)


def file_name(index: int, obj: Obj) -> str:
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def write_dir(objects: list[Obj], folder: str | Path) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, obj in enumerate(objects):
        path = folder / file_name(i, obj)
        path.write_text(to_yaml([obj]))
        paths.append(path)
    return paths
