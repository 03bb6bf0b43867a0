"""The model cache's objects: the PersistentVolumeClaim thicket creates when `model_cache.size` is
set, and the prefetch Job that downloads a hub model into it once, before the rollout starts.

`thicket submit` applies them first and waits for the Job (thicket.k8s.submit); the rollout's
vLLM then runs with HF_HUB_OFFLINE=1, so N pods never download the model N times. The claim
outlives the sweep (it has no sweep label: `thicket cancel` and the Jobs' TTL leave it).
"""

from __future__ import annotations

from typing import Any

from thicket.cluster_spec.resources import Resources
from thicket.k8s.affinity import cpu_node_affinity
from thicket.k8s.containers import (
    _common_pod,
    _env,
    _resources,
    _secret_env,
    _security,
    _user_env,
    ephemeral,
    model_revision,
    pod_model,
)
from thicket.k8s.names import APP, COMPONENT_LABEL, SPEC_HASH, TEMPLATE_HASH, digest, labels, names, serves_vllm
from thicket.spec import SweepSpec

Obj = dict[str, Any]

PREFETCH = "prefetch"  # the component label and the container's name
# Llama-style repositories also carry the original checkpoint (original/*), which vLLM never reads.
SKIPPED_FILES = ("original/*",)
DOWNLOAD_BLOCKERS = frozenset({"HF_HUB_OFFLINE", "HF_HUB_DISABLE_UPDATE_CHECK", "HF_HUB_DISABLE_TELEMETRY"})
PREFETCH_RESOURCES = Resources(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "4Gi"})
PREFETCH_TMP = "1Gi"  # its /tmp: the download itself goes to the claim


def cache_claim(spec: SweepSpec) -> Obj | None:
    """The model cache's claim, when thicket creates it (model_cache.size) and a pod mounts it."""
    cache = spec.cluster.model_cache
    if not (serves_vllm(spec) and cache.claim and cache.size):
        return None
    claim: Obj = {"accessModes": [cache.access_mode], "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class:
        claim["storageClassName"] = cache.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": cache.claim,
            "namespace": spec.cluster.namespace,
            "labels": {"app.kubernetes.io/name": APP, COMPONENT_LABEL: "model-cache", "app.kubernetes.io/part-of": APP},
        },
        "spec": claim,
    }


def prefetches(spec: SweepSpec) -> bool:
    return serves_vllm(spec) and spec.cluster.model_cache.prefetches(pod_model(spec))


def download_args(spec: SweepSpec) -> list[str]:
    """`hf download` of the pod's model at policy.revision (the hub's main when unset)."""
    revision = model_revision(spec)
    return ["download", pod_model(spec), *(["--revision", revision] if revision else []),
            *(arg for pattern in SKIPPED_FILES for arg in ("--exclude", pattern))]


def revision_warnings(spec: SweepSpec) -> list[str]:
    """A hub model prefetched without policy.revision: the hub's main at submit time."""
    if not prefetches(spec) or spec.policy.revision:
        return []
    return [f"policy.revision: not set: the prefetch downloads {pod_model(spec)} as the hub's main is at submit time, "
            "so two sweeps of this spec may use different weights; set it to a commit sha (the model page's "
            "\"Files and versions\" history, or `hf download` prints it)"]


def prefetch_job(spec: SweepSpec, spec_hash: str) -> Obj | None:
    """A Job that downloads the pod's hub model, at policy.revision, into the model cache (`hf
    download`, from the small prefetch image: huggingface_hub alone), on CPU nodes: the aggregation
    Job's node selector and tolerations, and its required affinity away from GPU nodes."""
    if not prefetches(spec):
        return None
    c = spec.cluster
    cache = c.model_cache
    env = [_env("HOME", "/tmp"), _env("HF_HOME", cache.hf_home), _env("HF_HUB_DISABLE_TELEMETRY", "1"),
           _env("HF_HUB_DISABLE_UPDATE_CHECK", "1")]
    if c.hf_token_secret:
        env.append(_secret_env("HF_TOKEN", c.hf_token_secret, "HF_TOKEN"))
    # The vLLM container's own variables (a hub mirror in HF_ENDPOINT, a proxy), but not an offline switch.
    env += [var for var in _user_env(spec, "vllm") if var["name"] not in DOWNLOAD_BLOCKERS]
    container = {
        "name": PREFETCH,
        "image": c.images.prefetch,
        "imagePullPolicy": c.images.policy_for(c.images.prefetch),
        "command": ["hf"],
        "args": download_args(spec),
        "env": env,
        "resources": _resources(PREFETCH_RESOURCES, storage=ephemeral(PREFETCH_TMP)),
        "securityContext": _security(read_only=True),
        "volumeMounts": [{"name": "model-cache", "mountPath": cache.path}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    pod = _common_pod(spec, c.aggregate.node_selector, c.aggregate.tolerations)
    if c.aggregate.avoid_node_labels:
        pod["affinity"] = cpu_node_affinity(c.aggregate.avoid_node_labels)
    pod["automountServiceAccountToken"] = False
    pod["containers"] = [container]
    pod["volumes"] = [
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.claim}},
        {"name": "tmp", "emptyDir": {"sizeLimit": PREFETCH_TMP}},
    ]
    template = {"metadata": {"labels": labels(spec, PREFETCH)}, "spec": pod}
    job_spec: Obj = {"backoffLimit": 3, "activeDeadlineSeconds": cache.prefetch_timeout_s}
    if c.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = c.ttl_seconds_after_finished
    job_spec["template"] = template
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": names(spec.name)["prefetch"],
            "namespace": c.namespace,
            "labels": labels(spec, PREFETCH),
            "annotations": {SPEC_HASH: spec_hash, TEMPLATE_HASH: digest({"template": template})},
        },
        "spec": job_spec,
    }


def is_prefetch(obj: Obj) -> bool:
    return obj["kind"] == "Job" and obj["metadata"]["labels"].get(COMPONENT_LABEL) == PREFETCH
