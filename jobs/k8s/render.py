"""Spec -> Kubernetes objects (plain dicts): the rollout Indexed Job and what it needs.

`render(spec)` returns, in apply order:

- PersistentVolumeClaim `<model_cache.claim>` when `model_cache.size` asks thicket to create it;
- ConfigMap `<sweep>-spec`: the validated spec as the pods see it (policy pointed at the pod's vLLM);
- ServiceAccount, Role (get/list/watch Jobs in the namespace only) and RoleBinding for the
  aggregation Job;
- Job `<sweep>-prefetch` (a hub model and a claim): downloads the model into the cache first;
- Job `<sweep>`: Indexed, one completion per task range; each pod runs vLLM and the env
  server(s) as native sidecars and the worker as its one main container, so the pod completes
  when the worker exits;
- Job `<sweep>-aggregate` (CPU only): waits for the rollout Job to finish, then runs
  `thicket aggregate`.

The output is a pure function of the spec and the thicket version (golden-file friendly).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from thicket.errors import BadInput, ExitCode, ThicketError
from thicket.k8s.containers import (
    _common_pod,
    _env,
    _env_sidecar,
    _resources,
    _security,
    _user_env,
    _vllm_container,
    _worker_container,
    s3_env,
)
from thicket.k8s.names import (
    MAX_COMPLETIONS,
    QUEUE_LABEL,
    SPEC_HASH,
    SPEC_KEY,
    SWEEP_URI,
    TEMPLATE_HASH,
    WORKER,
    digest,
    index_count,
    labels,
    names,
    pod_spec_data,
    serves_vllm,
)
from thicket.k8s.network import network_objects
from thicket.k8s.prefetch import cache_claim, prefetch_job
from thicket.k8s.spec import Resources
from thicket.spec import SweepSpec

Obj = dict[str, Any]


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
    init = [_env_sidecar(spec, s) for s in sidecars]
    volumes: list[Obj] = [
        {"name": "spec", "configMap": {"name": n["spec"]}},
        {"name": "tmp", "emptyDir": {}},
    ]
    volumes += [{"name": f"tmp-{ctr['name']}", "emptyDir": {}} for ctr in init]
    if serves_vllm(spec):
        if c.gpus == 0:
            raise BadInput("cluster.gpus: 0, but the pod serves its own vLLM (policy.kind vllm without a remote "
                           "policy.url), which needs a GPU: set cluster.gpus >= 1, or aim policy.url at a vLLM "
                           "served elsewhere")
        init.append(_vllm_container(spec))
        claim = c.model_cache.claim
        cache = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
        volumes += [
            {"name": "model-cache", **cache},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": c.shm_size}},
            {"name": "tmp-vllm", "emptyDir": {}},
        ]
    pod = _common_pod(spec, c.node_selector, c.tolerations)
    if c.service_account:
        pod["serviceAccountName"] = c.service_account  # workload identity for S3
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
            {"action": "FailIndex", "onExitCodes": {"containerName": WORKER, "operator": "In", "values": [int(ExitCode.BAD_INPUT)]}},
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

    account_name = c.service_account or name  # workload identity for S3 needs the user's account
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
        "subjects": [{"kind": "ServiceAccount", "name": account_name, "namespace": c.namespace}],
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
        "env": [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1"), *s3_env(spec), *_user_env(spec, "aggregate")],
        "resources": _resources(c.resources.aggregate),
        "securityContext": _security(read_only=True),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod = _common_pod(spec, agg.node_selector, agg.tolerations)
    pod["serviceAccountName"] = account_name
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
    return [*([] if c.service_account else [account]), role, binding, job]


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
    claim, prefetch = cache_claim(spec), prefetch_job(spec, spec_hash)
    objects = [*([claim] if claim else []), config, *network_objects(spec)]
    aggregate = aggregate_objects(spec, spec_hash) if spec.cluster.aggregate.enabled else []
    objects += aggregate[:-1]
    objects += [*([prefetch] if prefetch else []), rollout_job(spec, spec_hash), *aggregate[-1:]]
    if check:
        from thicket.k8s.rules import check_objects, policy_problems

        problems = check_objects(objects)
        if problems:
            raise ThicketError(f"rendered manifests break an API rule (a thicket bug): {problems[0]}")
        problems = [problem for obj in objects for problem in policy_problems(obj)]
        if problems:
            raise ThicketError(f"rendered pods break thicket's pod policy (a thicket bug): {problems[0]}")
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
