"""submit and cancel: create-or-update a sweep's objects after checking what they need (the server's
Kubernetes version, namespace, every Secret key the pods read, model-cache PVC and StorageClass, pull
secrets); optionally run one index as a canary before scaling out; delete them again."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable
from typing import Any

from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.k8s.client import Conflict, Forbidden, Kube, NotFound
from thicket.k8s.containers import pod_model
from thicket.k8s.names import COMPONENT_LABEL, SWEEP_LABEL, TEMPLATE_HASH, serves_vllm
from thicket.k8s.owners import adopt, release
from thicket.k8s.pod_reasons import (
    FATAL_WAITING,
    ended_reason,
    index_row,
    latest_warnings,
    phase,
    pod_index,
    stuck_container,
    worker_exit,
)
from thicket.k8s.prefetch import is_prefetch
from thicket.k8s.status import finished, format_duration, job_state, parse_index_set, wait_job
from thicket.spec import SweepSpec

Obj = dict[str, Any]


# What `cancel` deletes, in this order (Jobs first: their pods go with them).
SWEEP_KINDS = ("Job", "ConfigMap", "RoleBinding", "Role", "ServiceAccount", "NetworkPolicy", "PodMonitor")


EXAMPLE_ANNOTATION = "thicket.dev/example"


S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


PREFETCH_POLL_S = 10.0
CANARY_POLL_S = 10.0
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


# Native sidecars (init containers with restartPolicy Always), backoffLimitPerIndex and the
# podFailurePolicy action FailIndex: beta and on by default in 1.29-1.32, GA in 1.33.
MIN_KUBERNETES = (1, 29)
GA_KUBERNETES = (1, 33)
FEATURES = "native sidecars, the Indexed Job's backoffLimitPerIndex and podFailurePolicy FailIndex"


def check_server_version(kube: Kube) -> str | None:
    """Refuse a server older than 1.29 (exit 2); a warning for 1.29-1.32 (beta features) or an
    unreadable version; None for 1.33+."""
    try:
        major, minor, git = kube.server_version()
    except (Forbidden, NotFound):
        return "cannot read the server's version (/version): not checked; thicket needs Kubernetes 1.29 or newer"
    if (major, minor) < MIN_KUBERNETES:
        raise BadInput(
            f"the cluster runs Kubernetes {git}; thicket needs 1.29 or newer: its pods use {FEATURES}, which older "
            "servers drop or reject (vLLM would never stop, or a failed index would retry forever): upgrade the control plane"
        )
    if (major, minor) < GA_KUBERNETES:
        return (f"the cluster runs Kubernetes {git}: {FEATURES} are beta there (on by default, GA in 1.33); "
                "if a feature gate turned them off, pods misbehave: check SidecarContainers and JobBackoffLimitPerIndex")
    return None


def secret_refs(objects: list[Obj]) -> list[tuple[str, str | None, str]]:
    """(Secret, key or None for the whole Secret, who reads it) for each Secret a rendered pod needs:
    env valueFrom.secretKeyRef, envFrom secretRef, secret volumes (and their items); optional ones left out."""
    refs: list[tuple[str, str | None, str]] = []
    for obj in objects:
        if obj["kind"] != "Job":
            continue
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        owner = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        for container in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            where = f"{owner} container {container.get('name')}"
            for var in container.get("env") or []:
                ref = (var.get("valueFrom") or {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    refs.append((ref["name"], ref["key"], f"{where} env {var.get('name')}"))
            for source in container.get("envFrom") or []:
                ref = source.get("secretRef")
                if ref and not ref.get("optional"):
                    refs.append((ref["name"], None, f"{where} envFrom"))
        for volume in pod.get("volumes") or []:
            secret = volume.get("secret")
            if secret and not secret.get("optional"):
                where = f"{owner} volume {volume.get('name')}"
                items = secret.get("items") or []
                refs += [(secret["secretName"], item["key"], where) for item in items] or [(secret["secretName"], None, where)]
    return refs


def check_secret_keys(kube: Kube, spec: SweepSpec, objects: list[Obj], warnings: list[str]) -> None:
    """Every Secret key the rendered pods read exists (else the pod waits in CreateContainerConfigError)."""
    c, ns = spec.cluster, spec.cluster.namespace
    fields = {name: f for name, f in ((c.s3_secret, "cluster.s3_secret"), (c.hf_token_secret, "cluster.hf_token_secret"))
              if name} | {name: "cluster.image_pull_secrets" for name in c.image_pull_secrets}
    rendered = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    seen: dict[str, Obj | None] = {}
    for name, key, where in secret_refs(objects):
        if name not in seen:
            try:
                seen[name] = rendered.get(name) or kube.get("Secret", ns, name)
            except Forbidden:
                seen[name] = None
                if not any(f"secret/{name} " in w for w in warnings):
                    warnings.append(f"cannot read secret/{name} (forbidden): its keys were not checked")
                continue
            if seen[name] is None:
                raise BadInput(f"{fields.get(name, where)}: secret {name!r} not found in namespace {ns!r} "
                               f"({where} reads it): create it")
        secret = seen[name]
        if secret is None or key is None:
            continue
        have = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
        if key not in have:
            raise BadInput(
                f"{fields.get(name, where)}: secret {name!r} has no key {key} ({where} reads it; it has "
                f"{', '.join(sorted(have)) or 'no keys'}): add it, e.g. kubectl -n {ns} create secret generic {name} "
                f"--from-literal={key}=... --dry-run=client -o yaml | kubectl apply -f -"
            )


def check_storage_class(kube: Kube, spec: SweepSpec) -> None:
    """The StorageClass of a model-cache claim thicket creates exists (else the claim stays Pending and
    the prefetch Job waits its whole timeout). Unreadable StorageClasses (a namespaced Role): not checked."""
    cache, ns = spec.cluster.model_cache, spec.cluster.namespace
    if not (serves_vllm(spec) and cache.claim and cache.size):
        return
    try:
        if kube.get("PersistentVolumeClaim", ns, cache.claim) is not None:
            return  # kept as it is; a Pending one is caught while waiting (claim_problem)
        if cache.storage_class:
            if kube.storage_class(cache.storage_class) is None:
                raise BadInput(f"cluster.model_cache.storage_class: StorageClass {cache.storage_class!r} does not exist "
                               f"on the cluster{_classes(kube)}: set one that does (kubectl get storageclass)")
            return
        classes = kube.storage_classes()
    except Forbidden:
        return
    if not any(_is_default(sc) for sc in classes):
        names_ = ", ".join(sc["metadata"]["name"] for sc in classes) or "none"
        raise BadInput(f"cluster.model_cache.storage_class: not set, and the cluster has no default StorageClass "
                       f"(it has: {names_}): set cluster.model_cache.storage_class, or the claim stays Pending")


def _is_default(storage_class: Obj) -> bool:
    annotations = (storage_class.get("metadata") or {}).get("annotations") or {}
    return any(annotations.get(k) == "true" for k in ("storageclass.kubernetes.io/is-default-class",
                                                      "storageclass.beta.kubernetes.io/is-default-class"))


def _classes(kube: Kube) -> str:
    try:
        names_ = [sc["metadata"]["name"] for sc in kube.storage_classes()]
    except (Forbidden, NotFound):
        return ""
    return f" (it has: {', '.join(names_) or 'none'})"


MISSING_CLASS = re.compile(r'storageclass\.storage\.k8s\.io "([^"]+)" not found')
NO_CLASS = "no storage class is set"


def claim_problem(kube: Kube, namespace: str, claim: str) -> str | None:
    """Why a Pending model-cache claim will never bind: its StorageClass does not exist, or none is set
    and the cluster has no default. None while it is Bound, or Pending for a reason that may pass
    (WaitForFirstConsumer waits for the prefetch pod: that is normal)."""
    pvc = kube.get("PersistentVolumeClaim", namespace, claim)
    if pvc is None or (pvc.get("status") or {}).get("phase") != "Pending":
        return None
    fix = (f"a claim's class cannot change: delete it (kubectl -n {namespace} delete pvc {claim}) and set "
           "cluster.model_cache.storage_class to one that exists")
    name = (pvc.get("spec") or {}).get("storageClassName")
    if name:
        try:
            if kube.storage_class(name) is None:
                return f"persistentvolumeclaim/{claim} stays Pending: StorageClass {name!r} does not exist{_classes(kube)}: {fix}"
        except Forbidden:
            pass  # the claim's Events tell
    try:
        events = kube.list("Event", namespace, "", fields=f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={claim}")
    except Forbidden:
        return None
    for event in reversed(events):
        message = event.get("message") or ""
        if found := MISSING_CLASS.search(message):
            return (f"persistentvolumeclaim/{claim} stays Pending: StorageClass {found[1]!r} does not exist "
                    f"(event {event.get('reason')}){_classes(kube)}: {fix}")
        if NO_CLASS in message:
            return (f"persistentvolumeclaim/{claim} stays Pending: it names no StorageClass and the cluster has no "
                    f"default one (event {event.get('reason')}){_classes(kube)}: {fix}")
    return None


def _claim_check(kube: Kube, spec: SweepSpec) -> Callable[[], None] | None:
    cache, ns = spec.cluster.model_cache, spec.cluster.namespace
    if not (serves_vllm(spec) and cache.claim):
        return None

    def check() -> None:
        if problem := claim_problem(kube, ns, cache.claim):
            raise BadInput(problem)

    return check


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


def preflight(kube: Kube, spec: SweepSpec, objects: list[Obj] | None = None) -> list[str]:
    """Refuse what would leave pods stuck: a server older than 1.29, a missing namespace, Secret, Secret
    key (of `objects`, the rendered ones), PVC or StorageClass. Returns warnings."""
    c = spec.cluster
    ns = c.namespace
    warnings: list[str] = []
    if note := check_server_version(kube):
        warnings.append(note)
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
    if objects is not None:
        check_secret_keys(kube, spec, objects, warnings)
    check_storage_class(kube, spec)
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
           echo: Callable[[str], None] = print, canary: bool = False, canary_timeout_s: float = 3600,
           sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None) -> dict[str, str]:
    """Create or update the sweep's objects, in order, waiting for the prefetch Job (if any) before
    the rollout's; then make the Jobs own the rest (thicket.k8s.owners). `resume` recreates its
    finished Jobs: every index runs again, and one whose tasks are all committed exits at once (the
    worker checks before it waits for its servers), so only the failed or unfinished indexes do work.
    A prefetch Job that failed before is deleted and created again. `canary`: a rollout Job this call
    creates starts with parallelism 1 and scales to the spec's only once index 0 succeeded (run_canary);
    the aggregation Job is created after that."""
    for warning in preflight(kube, spec, objects):
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
            obj, scale_to = _canary_job(kube, obj, echo)
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


def _canary_job(kube: Kube, job: Obj, echo: Callable[[str], None]) -> tuple[Obj, int | None]:
    """The rollout Job to create for a canary (parallelism 1) and the parallelism to scale to; the Job
    unchanged (and None) when it exists already or has nothing to scale."""
    meta, want = job["metadata"], int(job["spec"].get("parallelism") or 1)
    if kube.get("Job", meta["namespace"], meta["name"]) is not None:
        echo(f"note: job/{meta['name']} exists: --canary applies to a rollout Job that submit creates; no canary run")
        return job, None
    if want <= 1 or int(job["spec"].get("completions") or 1) <= 1:
        return job, None  # one pod at a time anyway
    first = copy.deepcopy(job)
    first["spec"]["parallelism"] = 1  # parallelism can be patched later; completions cannot
    return first, want


def run_canary(kube: Kube, spec: SweepSpec, job: Obj, parallelism: int, echo: Callable[[str], None],
               timeout_s: float = 3600, interval_s: float = CANARY_POLL_S,
               sleep: Callable[[float], None] | None = None, clock: Callable[[], float] | None = None) -> None:
    """Wait for the canary, index 0 of a rollout Job created with parallelism 1: once it succeeds, patch
    the Job's parallelism to `parallelism`. When it fails (a failed pod, a failed index or Job, a
    container that cannot start, a model cache that cannot bind) or times out, suspend the Job (no more
    pods; the failed pod stays for `thicket logs`) and raise, naming the reason (thicket.k8s.pod_reasons)."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    sleep, clock = sleep or time.sleep, clock or time.monotonic  # looked up now: tests patch time
    start = clock()
    check = _claim_check(kube, spec)
    echo(f"job/{name}: canary: index 0 runs alone (up to {format_duration(timeout_s)}) before scaling to parallelism {parallelism}")
    last = None
    while True:
        live = kube.get("Job", ns, name)
        if live is None:
            raise Unavailable(f"job/{name} was deleted during the canary: nothing scaled")
        status = live.get("status") or {}
        completed, failed = parse_index_set(status.get("completedIndexes")), parse_index_set(status.get("failedIndexes"))
        if 0 in completed:
            kube.patch("Job", ns, name, {"spec": {"parallelism": parallelism}})
            echo(f"job/{name}: canary index 0 succeeded in {format_duration(clock() - start)}: "
                 f"parallelism 1 -> {parallelism}")
            return
        pods = sorted((p for p in kube.list("Pod", ns, f"{JOB_NAME_LABEL}={name}") if pod_index(p) == 0),
                      key=lambda p: p["metadata"].get("creationTimestamp") or "")
        warnings = _pod_warnings(kube, ns, pods[-1:])
        ended = next((p for p in pods if phase(p) == "Failed"), None)
        stuck = next((r for p in pods[-1:] if (r := stuck_container(p)) and r.text.split(": ")[-1] in FATAL_WAITING), None)
        if ended is not None or stuck is not None or 0 in failed or finished(live):
            if ended is not None:
                why = ended_reason(ended, warnings.get(ended["metadata"]["name"]), worker_exit(ended))
                text, detail = why.text, why.detail
            elif stuck is not None:
                text, detail = stuck.text, stuck.detail
            else:
                row = index_row(0, completed, failed, pods, warnings, f"the job is {job_state(live)}")
                text, detail = row.reason, row.detail
            _stop_canary(kube, ns, name)
            raise ThicketError(
                f"canary failed: job/{name} index 0: {text}" + (f": {detail}" if detail else "") +
                f"; the Job is suspended, nothing scaled and no aggregation Job created (logs: `thicket logs {spec.name} "
                f"--index 0`); fix it, then `thicket cancel {spec.name}` and submit again"
            )
        if check is not None:
            try:
                check()
            except BadInput:
                _stop_canary(kube, ns, name)
                raise
        if clock() - start >= timeout_s:
            row = index_row(0, completed, failed, pods, warnings, "no pod yet")
            _stop_canary(kube, ns, name)
            raise Unavailable(
                f"canary: job/{name} index 0 did not succeed within {format_duration(timeout_s)} ({row.reason}"
                + (f": {row.detail}" if row.detail else "") + f"); the Job is suspended, nothing scaled: "
                f"see `thicket status {spec.name}`, then `thicket cancel {spec.name}` and submit again"
            )
        line = index_row(0, completed, failed, pods, warnings, "no pod yet").reason
        if line != last:
            echo(f"job/{name}: canary index 0: {line}")
            last = line
        sleep(interval_s)


def _pod_warnings(kube: Kube, namespace: str, pods: list[Obj]) -> dict[str, Obj]:
    """Pod name -> its latest Warning Event, read per pod (fieldSelector involvedObject.name)."""
    events: list[Obj] = []
    for pod in pods:
        try:
            events += kube.list("Event", namespace, "", fields=f"involvedObject.name={pod['metadata']['name']},type=Warning")
        except Forbidden:
            return {}
    return latest_warnings(events)


def _stop_canary(kube: Kube, namespace: str, name: str) -> None:
    """Suspend the rollout Job: its running pods stop, no new ones start, its failed pods stay."""
    kube.patch("Job", namespace, name, {"spec": {"suspend": True}})


def wait_prefetched(kube: Kube, spec: SweepSpec, job: Obj, echo: Callable[[str], None]) -> None:
    """Wait for the prefetch Job: the rollout's pods start only once their model is in the cache. A
    model-cache claim that can never bind (no such StorageClass) fails at once, naming the class."""
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    timeout = spec.cluster.model_cache.prefetch_timeout_s
    echo(f"job/{name}: downloading {pod_model(spec)} into the model cache (up to {timeout} s) before the rollout")
    if wait_job(kube, ns, name, timeout_s=timeout, interval_s=PREFETCH_POLL_S, echo=echo,
                check=_claim_check(kube, spec)) == "Failed":
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
