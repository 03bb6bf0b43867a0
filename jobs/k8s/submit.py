"""submit and cancel: create-or-update a sweep's objects after checking what they need (namespace,
S3 Secret, model-cache PVC, pull secrets); delete them again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from thicket.errors import BadInput, Unavailable
from thicket.k8s.client import Conflict, Forbidden, Kube, NotFound
from thicket.k8s.containers import pod_model
from thicket.k8s.names import SWEEP_LABEL, TEMPLATE_HASH, serves_vllm
from thicket.k8s.owners import adopt, release
from thicket.k8s.prefetch import is_prefetch
from thicket.k8s.status import finished, job_state, wait_job
from thicket.spec import SweepSpec

Obj = dict[str, Any]


# What `cancel` deletes, in this order (Jobs first: their pods go with them).
SWEEP_KINDS = ("Job", "ConfigMap", "RoleBinding", "Role", "ServiceAccount", "NetworkPolicy", "PodMonitor")


EXAMPLE_ANNOTATION = "thicket.dev/example"


S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


PREFETCH_POLL_S = 10.0


# -- submit -------------------------------------------------------------------------------------
def is_subset(want: Any, have: Any) -> bool:
    """Whether everything in `want` is in `have` (the server adds defaults and status)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have


def _meta_subset(obj: Obj) -> Obj:
    return {k: obj["metadata"][k] for k in ("labels", "annotations") if k in obj["metadata"]}


def preflight(kube: Kube, spec: SweepSpec) -> list[str]:
    """Refuse what would leave pods stuck: a missing namespace, Secret or PVC. Returns warnings."""
    c = spec.cluster
    ns = c.namespace
    warnings: list[str] = []
    if "://" not in spec.output or spec.output.startswith("file://"):
        raise BadInput(
            f"output: {spec.output!r} is a local path; a cluster sweep needs an object store "
            "(s3://bucket/prefix): a pod's disk goes away with the pod"
        )

    def check(kind: str, name: str, field_name: str, hint: str) -> Obj | None:
        try:
            obj = kube.get(kind, ns, name)
        except Forbidden:
            warnings.append(f"cannot read {kind.lower()}/{name} (forbidden): not checked")
            return None
        if obj is None:
            raise BadInput(f"{field_name}: {kind.lower()} {name!r} not found in namespace {ns!r}: {hint}")
        return obj

    try:
        if kube.get("Namespace", "", ns) is None:
            raise BadInput(
                f"cluster.namespace: namespace {ns!r} does not exist: create it (kubectl apply -k k8s/) "
                "or set cluster.namespace"
            )
    except Forbidden:
        pass  # namespaced accounts cannot read namespaces; the first create will tell
    if c.s3_secret:
        secret = check("Secret", c.s3_secret, "cluster.s3_secret",
                       "create it with your S3 credentials (see k8s/examples/s3-credentials.yaml), or set "
                       "cluster.s3_secret: null and cluster.service_account for workload identity")
        if secret is not None:
            if (secret["metadata"].get("annotations") or {}).get(EXAMPLE_ANNOTATION) == "true":
                raise BadInput(
                    f"cluster.s3_secret: secret {c.s3_secret!r} still holds the example placeholder values "
                    "from k8s/examples/: put your real S3 credentials in it and drop its thicket.dev/example annotation"
                )
            have = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
            missing = [k for k in S3_KEYS if k not in have]
            if missing:
                raise BadInput(f"cluster.s3_secret: secret {c.s3_secret!r} has no key {missing[0]}")
    if c.service_account:
        check("ServiceAccount", c.service_account, "cluster.service_account",
              "create it, annotated for your cloud's workload identity (docs/kubernetes.md)")
    cache = c.model_cache
    if serves_vllm(spec) and cache.claim and not cache.size:
        check("PersistentVolumeClaim", cache.claim, "cluster.model_cache.claim",
              "create it (see k8s/examples/model-cache-pvc.yaml), set cluster.model_cache.size for thicket to "
              "create it, or set cluster.model_cache.claim: null for an emptyDir per pod")
    if serves_vllm(spec) and c.hf_token_secret:
        check("Secret", c.hf_token_secret, "cluster.hf_token_secret", "create it with key HF_TOKEN")
    for name in c.image_pull_secrets:
        check("Secret", name, "cluster.image_pull_secrets", "create it (kubectl create secret docker-registry)")
    return warnings


def _wait_gone(kube: Kube, kind: str, ns: str, name: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while kube.get(kind, ns, name) is not None:
        if time.monotonic() > deadline:
            raise Unavailable(f"{kind.lower()}/{name} was not deleted within {timeout_s:g} s")
        time.sleep(1)


def apply_object(kube: Kube, obj: Obj, replace: bool = False) -> str:
    """Create or update one object; returns created / unchanged / updated / replaced."""
    kind, meta = obj["kind"], obj["metadata"]
    ns, name = meta["namespace"], meta["name"]
    live = kube.get(kind, ns, name)
    if live is None:
        try:
            kube.create(obj)
            return "created"
        except Conflict:
            live = kube.get(kind, ns, name)
            if live is None:
                raise
    if kind == "PersistentVolumeClaim":
        return "kept"  # the model cache outlives sweeps, and a claim's spec barely changes
    if kind == "Job":
        want_hash = meta["annotations"][TEMPLATE_HASH]
        have_hash = (live["metadata"].get("annotations") or {}).get(TEMPLATE_HASH)
        if want_hash != have_hash:
            if not replace:
                raise BadInput(
                    f"job/{name} exists with a different pod template (a Job's template cannot change): "
                    "rerun with --replace to delete and recreate it (committed tasks are kept and skipped), "
                    "or rename the sweep"
                )
            kube.delete("Job", ns, name, propagation="Foreground")
            _wait_gone(kube, "Job", ns, name)
            kube.create(obj)
            return "replaced"
        mutable = {k: obj["spec"][k] for k in ("parallelism", "ttlSecondsAfterFinished", "maxFailedIndexes") if k in obj["spec"]}
        want = {"metadata": _meta_subset(obj), "spec": mutable}
        if is_subset(want, live):
            return "unchanged"
        kube.patch("Job", ns, name, want)
        return "updated"
    if kind == "RoleBinding" and live.get("roleRef") != obj.get("roleRef"):
        kube.delete(kind, ns, name)  # roleRef is immutable
        _wait_gone(kube, kind, ns, name)
        kube.create(obj)
        return "updated"
    if is_subset(obj, live):
        return "unchanged"
    body = json.loads(json.dumps(obj))
    body["metadata"]["resourceVersion"] = live["metadata"].get("resourceVersion")
    kube.replace(body)
    return "updated"


def _finished_jobs(kube: Kube, objects: list[Obj]) -> list[Obj]:
    """The sweep's Jobs that exist and have finished, for --resume (refused while one runs)."""
    ended = []
    for obj in (o for o in objects if o["kind"] == "Job"):
        meta = obj["metadata"]
        live = kube.get("Job", meta["namespace"], meta["name"])
        if live is None or (is_prefetch(obj) and job_state(live) == "Complete"):
            continue  # a cache filled once stays filled
        if not finished(live):
            raise BadInput(f"job/{meta['name']} is still running: --resume reruns a finished sweep "
                           f"(wait for it, or `thicket cancel {meta['name']}` first)")
        ended.append(obj)
    return ended


def submit(kube: Kube, spec: SweepSpec, objects: list[Obj], replace: bool = False, resume: bool = False,
           echo: Callable[[str], None] = print) -> dict[str, str]:
    """Create or update the sweep's objects, in order, waiting for the prefetch Job (if any) before
    the rollout's; then make the Jobs own the rest (thicket.k8s.owners). `resume` recreates its
    finished Jobs: every index runs again, and one whose tasks are all committed exits at once (the
    worker checks before it waits for its servers), so only the failed or unfinished indexes do work."""
    for warning in preflight(kube, spec):
        echo(f"warning: {warning}")
    rerun = _finished_jobs(kube, objects) if resume else []
    # Jobs whose pod template changed go first, before the ConfigMap changes under running pods.
    stale = []
    for obj in objects:
        if obj["kind"] == "Job":
            meta = obj["metadata"]
            live = kube.get("Job", meta["namespace"], meta["name"])
            if live is not None and (live["metadata"].get("annotations") or {}).get(TEMPLATE_HASH) != meta["annotations"][TEMPLATE_HASH]:
                stale.append(obj)
    if stale and not replace:
        raise BadInput(
            f"job/{stale[0]['metadata']['name']} exists with a different pod template (a Job's template cannot "
            "change): rerun with --replace to delete and recreate it (committed tasks are kept and skipped), "
            "or rename the sweep"
        )
    if stale or rerun:
        release(kube, objects)  # or the garbage collector deletes them with the old Jobs
    for obj in stale + [o for o in rerun if o not in stale]:
        meta = obj["metadata"]
        kube.delete("Job", meta["namespace"], meta["name"], propagation="Foreground")
        _wait_gone(kube, "Job", meta["namespace"], meta["name"])
    replaced = {f"job/{o['metadata']['name']}" for o in stale}
    resumed = {f"job/{o['metadata']['name']}" for o in rerun} - replaced
    done: dict[str, str] = {}
    for obj in objects:
        key = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        action = apply_object(kube, obj, replace)
        if action == "created" and key in replaced | resumed:
            action = "replaced" if key in replaced else "resumed"
        done[key] = action
        echo(f"{key} {done[key]}")
        if is_prefetch(obj):
            wait_prefetched(kube, spec, obj, echo)
    adopt(kube, objects)
    return done


def wait_prefetched(kube: Kube, spec: SweepSpec, job: Obj, echo: Callable[[str], None]) -> None:
    """Wait for the prefetch Job: the rollout's pods start only once their model is in the cache."""
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    timeout = spec.cluster.model_cache.prefetch_timeout_s
    echo(f"job/{name}: downloading {pod_model(spec)} into the model cache (up to {timeout} s) before the rollout")
    if wait_job(kube, ns, name, timeout_s=timeout, interval_s=PREFETCH_POLL_S, echo=echo) == "Failed":
        raise Unavailable(f"job/{name} could not fill the model cache with {pod_model(spec)}: see "
                          f"`kubectl -n {ns} logs job/{name}` (a wrong model id, a gated model without "
                          "cluster.hf_token_secret, a full volume); the rollout was not submitted")


def cancel(kube: Kube, namespace: str, sweep: str, echo: Callable[[str], None] = print) -> int:
    deleted = 0
    for kind in SWEEP_KINDS:
        try:
            found = kube.list(kind, namespace, f"{SWEEP_LABEL}={sweep}")
        except NotFound:  # a kind the cluster does not serve (PodMonitor without the Prometheus Operator)
            continue
        for obj in found:
            name = obj["metadata"]["name"]
            if kube.delete(kind, namespace, name):
                deleted += 1
                echo(f"{kind.lower()}/{name} deleted")
    if not deleted:
        raise BadInput(f"no sweep {sweep!r} in namespace {namespace!r} (nothing to cancel)")
    return deleted
