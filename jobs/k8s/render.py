"""Spec -> Kubernetes objects (plain dicts): the rollout Indexed Job and what it needs.

`render(spec)` returns, in apply order:

- PersistentVolumeClaim `<model_cache.claim>` when `model_cache.size` asks thicket to create it;
- ConfigMap `<sweep>-spec`: the validated spec as the pods see it (policy pointed at the pod's vLLM);
- ServiceAccount, Role and RoleBinding for the aggregation's waiter: it may get the rollout Job and
  get and patch the aggregation Job, by name, and nothing else;
- Job `<sweep>-prefetch` (a hub model and a claim): downloads the model into the cache first;
- Job `<sweep>`: Indexed, one completion per task range; each pod runs vLLM and the env
  server(s) as native sidecars and the worker as its one main container, so the pod completes
  when the worker exits;
- Job `<sweep>-aggregate-wait` (10m CPU, 96Mi): waits for the rollout Job to
  finish, then releases the aggregation Job (`thicket wait-job --release`);
- Job `<sweep>-aggregate` (CPU only), created suspended, so it has no pod and reserves nothing
  during the rollout: once released it runs `thicket aggregate`.

The output is a pure function of the spec and the thicket version (golden-file friendly).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from thicket.cluster_spec.resources import Resources
from thicket.errors import BadInput, ExitCode, ThicketError
from thicket.k8s.affinity import cpu_node_affinity
from thicket.k8s.pod_packing import packing_affinity
from thicket.k8s.containers import (
    _common_pod,
    _env,
    _env_sidecar,
    _resources,
    _security,
    _user_env,
    _vllm_container,
    _worker_container,
    ephemeral,
    model_cache_size,
    s3_env,
    wait_ready_timeout,
)
from thicket.k8s.deadlines import max_failed_indexes, rollout_pod_deadline
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
from thicket.k8s.network import identity_annotations, network_objects
from thicket.k8s.prefetch import cache_claim, prefetch_job
from thicket.spec import SweepSpec

Obj = dict[str, Any]


def rollout_job(spec: SweepSpec, spec_hash: str) -> Obj:
    c = spec.cluster
    n = names(spec.name)
    completions = index_count(spec)
    max_failed = max_failed_indexes(spec)
    parallelism = min(c.parallelism, completions)
    if completions > MAX_COMPLETIONS and (max_failed > 10_000 or parallelism > 10_000):
        raise BadInput(
            f"tasks.per_index: {completions} pods is above the {MAX_COMPLETIONS} an Indexed Job allows unless "
            "cluster.max_failed_indexes and cluster.parallelism are <= 10000; raise tasks.per_index"
        )
    sidecars = c.sidecars(spec.tasks)
    init = [_env_sidecar(spec, s) for s in sidecars]
    storage = c.ephemeral_storage
    volumes: list[Obj] = [
        {"name": "spec", "configMap": {"name": n["spec"]}},
        {"name": "tmp", "emptyDir": {"sizeLimit": storage.worker}},
    ]
    volumes += [{"name": f"tmp-{ctr['name']}", "emptyDir": {"sizeLimit": storage.env}} for ctr in init]
    if serves_vllm(spec):
        if c.gpus == 0:
            raise BadInput("cluster.gpus: 0, but the pod serves its own vLLM (policy.kind vllm without a remote "
                           "policy.url), which needs a GPU: set cluster.gpus >= 1, or aim policy.url at a vLLM "
                           "served elsewhere")
        init.append(_vllm_container(spec))
        claim = c.model_cache.claim
        cache = ({"persistentVolumeClaim": {"claimName": claim}} if claim
                 else {"emptyDir": {"sizeLimit": model_cache_size(spec)}})
        volumes += [
            {"name": "model-cache", **cache},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": c.shm_size}},
            {"name": "tmp-vllm", "emptyDir": {"sizeLimit": storage.vllm}},
        ]
    pod = _common_pod(spec, c.node_selector, c.tolerations)
    if serves_vllm(spec):  # GPU pods: fill a large GPU node before the next (thicket.k8s.pod_packing)
        pod["affinity"] = packing_affinity(spec.name)
    if c.service_account:
        pod["serviceAccountName"] = c.service_account  # workload identity for S3
    pod["automountServiceAccountToken"] = False  # the rollout pods never talk to the API server
    # After SIGTERM (preemption, a drain) the worker saves its growing trees (thicket.rollout.checkpoint)
    pod["terminationGracePeriodSeconds"] = spec.run.checkpoint.grace_s
    # From the pod's start: a pod stuck before its worker runs (an image that cannot be pulled, a
    # missing Secret key, a volume that does not mount) fails then (thicket.k8s.deadlines).
    pod["activeDeadlineSeconds"] = rollout_pod_deadline(spec, wait_ready_timeout(spec, sidecars))
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
                # EKS's identity webhook: the role's token for the worker only (thicket.k8s.network).
                **identity_annotations(pod),
            },
        },
        "spec": pod,
    }
    job_spec: Obj = {
        "completionMode": "Indexed",
        "completions": completions,
        "parallelism": parallelism,
        "backoffLimitPerIndex": c.backoff_limit_per_index,
        "maxFailedIndexes": max_failed,  # a fault in every pod stops the sweep after a few indexes
    }
    job_spec["podFailurePolicy"] = {
        "rules": [
            # Preemption, API eviction, node drain, node-pressure eviction: not the pod's fault, retry
            # without counting it. A pod's own disk use past its ephemeral-storage limit or an emptyDir's
            # sizeLimit is evicted as a limit violation, without this condition: it counts.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # Bad input (exit 2): retrying this index cannot help. A server or storage that stayed
            # unreachable (exit 3) fails the index at once too: an outage meets every pod, and its retries
            # would hold every GPU again (thicket.k8s.fault_price); `submit --resume` reruns the index.
            {"action": "FailIndex", "onExitCodes": {"containerName": WORKER, "operator": "In",
                                                    "values": [int(ExitCode.BAD_INPUT), int(ExitCode.UNAVAILABLE)]}},
        ]
    }
    if c.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = c.ttl_seconds_after_finished
    job_spec["template"] = template
    immutable = {k: job_spec[k] for k in ("completionMode", "completions", "backoffLimitPerIndex", "podFailurePolicy", "template")}
    job_labels = labels(spec, "rollout")
    if c.queue:
        job_labels[QUEUE_LABEL] = c.queue
        # Created suspended, as Kueue asks (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/): Kueue
        # unsuspends it once it admits the Job's Workload.
        job_spec["suspend"] = True
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


WAIT_RESOURCES = Resources(requests={"cpu": "10m", "memory": "96Mi"}, limits={"memory": "256Mi"})
WAIT_TMP = "64Mi"
RELEASES_TEMPLATE = "thicket.dev/releases-template-sha256"


def _cpu_pod(spec: SweepSpec) -> Obj:
    agg = spec.cluster.aggregate
    pod = _common_pod(spec, agg.node_selector, agg.tolerations)
    if agg.avoid_node_labels:
        pod["affinity"] = cpu_node_affinity(agg.avoid_node_labels)
    return pod


def kueue_stop_rules(queue: str | None) -> list[Obj]:
    """With a Kueue queue, the watchdog stops the rollout by deactivating its Workload (thicket.k8s.kueue),
    whose name Kueue generates: the namespace's Workloads, read and patched."""
    if not queue:
        return []
    return [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "patch"]}]


def aggregate_objects(spec: SweepSpec, spec_hash: str) -> list[Obj]:
    """The aggregation, as two Jobs, so that nothing sized for the work is reserved while the
    rollout runs (a pod reserves the larger of its init containers' and its main containers'
    requests for its whole life, so a small waiting container cannot share a pod with the work):

    - `<sweep>-aggregate-wait`: a pod of 10m CPU and 96Mi that waits for the rollout Job (`thicket
      wait-job`, retrying the API's 429s, 5xx and dropped connections) and then releases the
      aggregation Job: `spec.suspend: false`, or with aggregate.queue the Kueue queue label, so
      that Kueue admits it then. It also watches the rollout's start (`--start-watchdog`,
      thicket.k8s.start_watch). Its ServiceAccount may get and patch the rollout and aggregation Jobs,
      by name, list the namespace's pods and evict them, and with a Kueue queue read and patch its
      Workloads; nothing else. It has no deadline: the rollout's pods may wait
      for GPUs without limit, which no deadline of the rollout counts.
    - `<sweep>-aggregate`: created suspended (a suspended Job has no pods), it runs `thicket
      aggregate` once released, with no API token, within aggregate.active_deadline_s.

    Both run off GPU nodes (aggregate.avoid_node_labels) unless told otherwise."""
    c = spec.cluster
    n = names(spec.name)
    name, waiter = n["aggregate"], n["aggregate-wait"]
    agg = c.aggregate

    def meta(component: str = "aggregate") -> Obj:
        return {"name": name, "namespace": c.namespace, "labels": labels(spec, component)}

    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(),
               "automountServiceAccountToken": False}  # only the waiter's pod mounts its token
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(),
        "rules": [
            # get: wait for it; patch: the start-up watchdog suspends it (thicket.k8s.start_watch)
            {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": [n["rollout"]], "verbs": ["get", "patch"]},
            {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": [name], "verbs": ["get", "patch"]},
            # The watchdog reads the rollout pods' states and evicts one that cannot start; RBAC cannot
            # narrow a list or a pod's generated name, so these hold for the namespace's pods.
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
            *kueue_stop_rules(c.queue),
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": c.namespace}],
    }
    release = ["--release", name] + (["--release-queue", agg.queue] if agg.queue else [])
    wait = {
        "name": "wait-rollout",
        "image": c.images.worker,
        "imagePullPolicy": c.images.policy_for(c.images.worker),
        "command": ["thicket"],
        "args": ["wait-job", n["rollout"], "--namespace", c.namespace, *release,
                 "--start-watchdog", str(c.start_allowance_s)],
        "env": [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1")],
        "resources": _resources(WAIT_RESOURCES, storage=ephemeral(WAIT_TMP)),
        "securityContext": _security(read_only=True),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    wait_pod = _cpu_pod(spec)
    wait_pod["serviceAccountName"] = name
    wait_pod["automountServiceAccountToken"] = True  # wait-job reads the rollout Job, patches the aggregation's
    wait_pod["containers"] = [wait]
    wait_pod["volumes"] = [{"name": "tmp", "emptyDir": {"sizeLimit": WAIT_TMP}}]

    main = {
        "name": "aggregate",
        "image": c.images.worker,
        "imagePullPolicy": c.images.policy_for(c.images.worker),
        "command": ["thicket"],
        "args": ["aggregate", spec.sweep_uri],
        "env": [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1"), *s3_env(spec), *_user_env(spec, "aggregate")],
        "resources": _resources(c.resources.aggregate, storage=ephemeral(c.ephemeral_storage.aggregate)),
        "securityContext": _security(read_only=True),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod = _cpu_pod(spec)
    if c.service_account:
        pod["serviceAccountName"] = c.service_account  # workload identity for S3
    pod["automountServiceAccountToken"] = False  # the work reads and writes S3, never the API server
    pod["activeDeadlineSeconds"] = agg.active_deadline_s
    pod["containers"] = [main]
    pod["volumes"] = [{"name": "tmp", "emptyDir": {"sizeLimit": c.ephemeral_storage.aggregate}}]

    def job(job_name: str, component: str, template_spec: Obj, default_container: str, queued: bool,
            annotations: Obj | None = None, **extra: Any) -> Obj:
        job_labels = labels(spec, component)
        if queued and agg.queue:
            job_labels[QUEUE_LABEL] = agg.queue
        job_spec: Obj = {"backoffLimit": agg.backoff_limit, **extra}
        if c.ttl_seconds_after_finished is not None:
            job_spec["ttlSecondsAfterFinished"] = c.ttl_seconds_after_finished
        job_spec["template"] = {
            "metadata": {"labels": labels(spec, component),
                         "annotations": {"kubectl.kubernetes.io/default-container": default_container,
                                         **(annotations or {})}},
            "spec": template_spec,
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job_name,
                "namespace": c.namespace,
                "labels": job_labels,
                "annotations": {SPEC_HASH: spec_hash, SWEEP_URI: spec.sweep_uri,
                                TEMPLATE_HASH: digest({"template": job_spec["template"]})},
            },
            "spec": job_spec,
        }

    # With a queue the waiter adds the queue label on release: Kueue would admit (unsuspend) a
    # labelled Job at once.
    aggregate_job = job(name, "aggregate", pod, "aggregate", queued=False, suspend=True)
    # The waiter's template names the aggregation's: a new aggregation Job (`submit --replace`)
    # comes with a new waiter to release it, even when the old waiter has finished.
    releases = {RELEASES_TEMPLATE: aggregate_job["metadata"]["annotations"][TEMPLATE_HASH]}
    wait_job = job(waiter, "aggregate-wait", wait_pod, "wait-rollout", queued=True, annotations=releases)
    return [account, role, binding, wait_job, aggregate_job]


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
    objects += aggregate[:-2]
    objects += [*([prefetch] if prefetch else []), rollout_job(spec, spec_hash), *aggregate[-2:]]
    if check:
        from thicket.k8s.rules import check_objects, policy_problems, sweep_problems

        problems = check_objects(objects)
        if problems:
            raise ThicketError(f"rendered manifests break an API rule (a thicket bug): {problems[0]}")
        problems = [problem for obj in objects for problem in policy_problems(obj)] + sweep_problems(objects)
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
