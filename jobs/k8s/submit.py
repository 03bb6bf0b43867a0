"""submit and cancel: create-or-update a sweep's objects after checking what they need (the server's
Kubernetes version, namespace, every Secret key the pods read, model-cache PVC and StorageClass, pull
secrets: thicket.k8s.preflight); optionally run one index as a canary before scaling out
(thicket.k8s.canary); delete them again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from thicket.errors import BadInput, Unavailable
from thicket.k8s.canary import canary_job, run_canary
from thicket.k8s.client import Conflict, Kube, NotFound
from thicket.k8s.containers import pod_model
from thicket.k8s.job_wait import finished, job_state, wait_job
from thicket.k8s.names import COMPONENT_LABEL, SWEEP_LABEL, TEMPLATE_HASH
from thicket.k8s.owners import adopt, release
from thicket.k8s.prefetch import is_prefetch
from thicket.k8s.preflight import preflight
from thicket.k8s.resume_indexes import clamp_to_live, plan, resumed_job
from thicket.k8s.storage_class import claim_check
from thicket.spec import SweepSpec

Obj = dict[str, Any]


# What `cancel` deletes, in this order (Jobs first: their pods go with them).
SWEEP_KINDS = ("Job", "ConfigMap", "RoleBinding", "Role", "ServiceAccount", "NetworkPolicy", "PodMonitor")

PREFETCH_POLL_S = 10.0


def is_subset(want: Any, have: Any) -> bool:
    """Whether everything in `want` is in `have` (the server adds defaults and status)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have


def _meta_subset(obj: Obj) -> Obj:
    return {k: obj["metadata"][k] for k in ("labels", "annotations") if k in obj["metadata"]}


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
        mutable = clamp_to_live(mutable, live)  # a resumed Job runs fewer indexes than the spec renders
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


def _resumed(kube: Kube, spec: SweepSpec, job: Obj, echo: Callable[[str], None]) -> Obj:
    """The finished rollout Job to create again, cut to its unfinished indexes (thicket.k8s.resume_indexes)."""
    live = kube.get("Job", job["metadata"]["namespace"], job["metadata"]["name"]) or {}
    found = plan(spec, live)
    echo(found.line(job["metadata"]["name"]))
    return resumed_job(job, found.unfinished)


def is_rollout(obj: Obj) -> bool:
    return obj["kind"] == "Job" and obj["metadata"]["labels"].get(COMPONENT_LABEL) == "rollout"


def _failed_prefetches(kube: Kube, objects: list[Obj]) -> list[tuple[Obj, str]]:
    """The prefetch Jobs that exist and failed (a wrong HF token, since fixed): (rendered Job, state)."""
    found = []
    for obj in (o for o in objects if is_prefetch(o)):
        live = kube.get("Job", obj["metadata"]["namespace"], obj["metadata"]["name"])
        if live is not None and job_state(live).startswith("Failed"):
            found.append((obj, job_state(live)))
    return found


def submit(kube: Kube, spec: SweepSpec, objects: list[Obj], replace: bool = False, resume: bool = False,
           echo: Callable[[str], None] = print, canary: bool = False, canary_timeout_s: float | None = None,
           sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None) -> dict[str, str]:
    """Create or update the sweep's objects, in order, waiting for the prefetch Job (if any) before
    the rollout's; then make the Jobs own the rest (thicket.k8s.owners). `resume` recreates its
    finished Jobs, the rollout Job with only its unfinished indexes (thicket.k8s.resume_indexes:
    neither the old Job's completedIndexes nor the indexes whose tasks are all committed take a node).
    A prefetch Job that failed before is deleted and created again. `canary`: a rollout Job this call
    creates starts with parallelism 1 and scales to the spec's only once index 0 committed its first
    shard (run_canary; canary_timeout_s None: derived from the pod's deadline); the aggregation Job is
    created after that."""
    for warning in preflight(kube, spec, objects):
        echo(f"warning: {warning}")
    rerun = _finished_jobs(kube, objects) if resume else []
    objects = [_resumed(kube, spec, o, echo) if o in rerun and is_rollout(o) else o for o in objects]
    rerun = [next(n for n in objects if n["metadata"]["name"] == o["metadata"]["name"] and n["kind"] == o["kind"])
             for o in rerun]
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
    retried = set()
    for obj, state in _failed_prefetches(kube, objects):  # not an owner of anything: nothing to release
        meta = obj["metadata"]
        echo(f"job/{meta['name']} {state} on an earlier submit: deleting it (propagationPolicy Background) "
             "and creating it again")
        kube.delete("Job", meta["namespace"], meta["name"], propagation="Background")
        _wait_gone(kube, "Job", meta["namespace"], meta["name"])
        retried.add(f"job/{meta['name']}")
    replaced = {f"job/{o['metadata']['name']}" for o in stale}
    resumed = {f"job/{o['metadata']['name']}" for o in rerun} - replaced
    done: dict[str, str] = {}
    for obj in objects:
        key = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        scale_to = None
        if canary and is_rollout(obj):
            obj, scale_to = canary_job(kube, obj, echo)
        try:
            action = apply_object(kube, obj, replace)
        except Conflict as err:
            raise Conflict(
                f"{key} already exists or was changed while thicket submitted it ({err}): another `thicket submit` "
                f"may be running; rerun submit, use --resume to rerun a finished sweep, or `thicket cancel {spec.name}` "
                "to start over"
            ) from None
        if action == "created" and key in replaced | resumed | retried:
            action = "replaced" if key in replaced else "resumed" if key in resumed else "recreated"
        done[key] = action
        echo(f"{key} {done[key]}")
        if is_prefetch(obj):
            wait_prefetched(kube, spec, obj, echo)
        if scale_to is not None:
            try:
                run_canary(kube, spec, obj, scale_to, echo, canary_timeout_s, sleep=sleep, clock=clock)
            finally:
                adopt(kube, objects)  # the objects so far belong to the rollout Job, whatever the canary's end
    adopt(kube, objects)
    return done


def wait_prefetched(kube: Kube, spec: SweepSpec, job: Obj, echo: Callable[[str], None]) -> None:
    """Wait for the prefetch Job: the rollout's pods start only once their model is in the cache. A
    model-cache claim that can never bind (no such StorageClass) fails at once, naming the class."""
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    timeout = spec.cluster.model_cache.prefetch_timeout_s
    echo(f"job/{name}: downloading {pod_model(spec)} into the model cache (up to {timeout} s) before the rollout")
    if wait_job(kube, ns, name, timeout_s=timeout, interval_s=PREFETCH_POLL_S, echo=echo,
                check=claim_check(kube, spec)) == "Failed":
        raise Unavailable(f"job/{name} could not fill the model cache with {pod_model(spec)}: see "
                          f"`kubectl -n {ns} logs job/{name}` (a wrong model id, a gated model without "
                          "cluster.hf_token_secret, a full volume); the rollout was not submitted; "
                          "the next `thicket submit` deletes and recreates it")


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
