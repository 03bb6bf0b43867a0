"""thicket's own policy for its pods, beyond what the API server checks: how they run
(non-root, read-only, no capabilities), what they expose (the metrics port, nothing else) and
that their start is bounded (a server that never answers fails the pod in time)."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

LOCAL_ONLY = "127.0.0.1"


def policy_problems(obj: Obj) -> list[str]:
    return (security_problems(obj) + exposure_problems(obj) + startup_problems(obj) + bounded_problems(obj)
            + rbac_problems(obj))


def _pod(obj: Obj) -> Obj | None:
    return obj["spec"]["template"]["spec"] if obj.get("kind") == "Job" else None


def _containers(pod: Obj) -> list[Obj]:
    return (pod.get("initContainers") or []) + pod["containers"]


def security_problems(obj: Obj) -> list[str]:
    """thicket's policy for its pods: non-root, no privilege escalation, no capabilities,
    RuntimeDefault seccomp, read-only root filesystem."""
    pod = _pod(obj)
    if pod is None:
        return []
    where = f"Job/{obj['metadata']['name']}"
    pod_security = pod.get("securityContext") or {}
    problems = []
    for container in _containers(pod):
        sc = container.get("securityContext") or {}
        name = container["name"]

        def effective(key: str) -> Any:
            return sc.get(key, pod_security.get(key))

        if effective("runAsNonRoot") is not True:
            problems.append(f"{where}: {name}: runAsNonRoot must be true")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: {name}: allowPrivilegeEscalation must be false")
        if (sc.get("capabilities") or {}).get("drop") != ["ALL"] or (sc.get("capabilities") or {}).get("add"):
            problems.append(f"{where}: {name}: capabilities must drop ALL and add none")
        if (effective("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: {name}: seccompProfile must be RuntimeDefault")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: {name}: readOnlyRootFilesystem must be true")
        if sc.get("readOnlyRootFilesystem") and not any(m["mountPath"] == "/tmp" for m in container.get("volumeMounts") or []):
            problems.append(f"{where}: {name}: a read-only root filesystem needs an emptyDir at /tmp")
    return problems


def _sidecars(pod: Obj) -> list[Obj]:
    return [c for c in pod.get("initContainers") or [] if c.get("restartPolicy") == "Always"]


def exposure_problems(obj: Obj) -> list[str]:
    """Only the worker's metrics port is reachable from outside the pod: every server (vLLM,
    env servers) listens on 127.0.0.1, declares no port and is probed from inside."""
    pod = _pod(obj)
    if pod is None:
        return []
    where = f"Job/{obj['metadata']['name']}"
    problems = []
    for container in _containers(pod):
        name = container["name"]
        ports = [p.get("name") for p in container.get("ports") or []]
        if ports and ports != ["metrics"]:
            problems.append(f"{where}: {name}: declares ports {ports}; only the worker's metrics port may be open")
    for container in _sidecars(pod):
        name, args = container["name"], container.get("args") or []
        hosts = [value for flag, value in zip(args, args[1:]) if flag == "--host"]
        if hosts != [LOCAL_ONLY]:
            problems.append(f"{where}: {name}: must listen on --host {LOCAL_ONLY} only, got {hosts or 'no --host'}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "httpGet" in (container.get(probe) or {}) or "tcpSocket" in (container.get(probe) or {}):
                problems.append(f"{where}: {name}: {probe} reaches the pod IP, where nothing listens; use exec")
    return problems


def startup_problems(obj: Obj) -> list[str]:
    """A server that never answers must fail the pod within a deadline: no sidecar has a startup
    probe (it would hold the worker, and the worker's deadline, back), the worker waits for every
    server with --wait-ready-timeout, and every sidecar has a liveness probe for after its start."""
    pod = _pod(obj)
    if pod is None or not _sidecars(pod):
        return []
    where = f"Job/{obj['metadata']['name']}"
    problems = []
    for container in _sidecars(pod):
        if "startupProbe" in container:
            problems.append(f"{where}: {container['name']}: a sidecar's startupProbe holds the worker's deadline back")
        if "livenessProbe" not in container:
            problems.append(f"{where}: {container['name']}: no livenessProbe")
    worker = pod["containers"][0]
    args = worker.get("args") or []
    if "--wait-ready-timeout" not in args or args.count("--wait-for") < len(_sidecars(pod)):
        problems.append(f"{where}: {worker['name']}: must wait for each server with --wait-for and --wait-ready-timeout")
    return problems


# -- bounded cost: deadlines, failure budgets, local disk, tokens, RBAC, placement ------------------
WAITER = "aggregate-wait"  # the aggregation's waiter: no deadline (the rollout may wait for GPUs unboundedly)
SIDECAR_LIVENESS_MAX_S = 600  # a sidecar that stops answering after its start is restarted within this


def _component(obj: Obj) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component", "")


def bounded_problems(obj: Obj) -> list[str]:
    """What keeps a sweep from holding a cluster's resources without bound:

    - every Job's pods have a deadline (activeDeadlineSeconds in the pod or the Job), except the
      aggregation's waiter, which holds almost nothing;
    - an Indexed Job with per-index retries sets maxFailedIndexes (or every index of a broken
      sweep runs to its retry limit);
    - every container requests and limits ephemeral-storage, and every disk emptyDir has a
      sizeLimit (a pod past them is evicted as a limit violation, which the Job counts);
    - only the waiter mounts an API token;
    - a sidecar's liveness probe has no initialDelaySeconds (the start-up window is in its script)
      and restarts a server that stops answering within SIDECAR_LIVENESS_MAX_S;
    - no container with HF_HUB_OFFLINE=1 gets HF_TOKEN."""
    pod = _pod(obj)
    if pod is None:
        return []
    where = f"Job/{obj['metadata']['name']}"
    spec = obj.get("spec") or {}
    component = _component(obj)
    problems = []
    if component != WAITER and "activeDeadlineSeconds" not in pod and "activeDeadlineSeconds" not in spec:
        problems.append(f"{where}: no activeDeadlineSeconds: a pod stuck before its containers run holds its node's "
                        "resources forever")
    if spec.get("backoffLimitPerIndex") is not None and spec.get("maxFailedIndexes") is None:
        problems.append(f"{where}: backoffLimitPerIndex without maxFailedIndexes: a fault in every pod runs every index")
    for volume in pod.get("volumes") or []:
        empty = volume.get("emptyDir")
        if empty is not None and "sizeLimit" not in empty:
            problems.append(f"{where}: emptyDir {volume['name']} has no sizeLimit")
    for container in _containers(pod):
        res = container.get("resources") or {}
        for section in ("requests", "limits"):
            if "ephemeral-storage" not in (res.get(section) or {}):
                problems.append(f"{where}: {container['name']}: no ephemeral-storage in {section}")
    if pod.get("automountServiceAccountToken") is not False and component != WAITER:
        problems.append(f"{where}: automountServiceAccountToken must be false (only the aggregation's waiter "
                        "talks to the API server)")
    for container in _sidecars(pod):
        live = container.get("livenessProbe") or {}
        if live.get("initialDelaySeconds"):
            problems.append(f"{where}: {container['name']}: livenessProbe initialDelaySeconds blinds it after every "
                            "restart; the start-up window belongs in the probe's script")
        if live.get("periodSeconds", 10) * live.get("failureThreshold", 3) > SIDECAR_LIVENESS_MAX_S:
            problems.append(f"{where}: {container['name']}: livenessProbe takes over {SIDECAR_LIVENESS_MAX_S} s to "
                            "notice a hung server")
    for container in _containers(pod):
        env = {var.get("name"): var for var in container.get("env") or []}
        if (env.get("HF_HUB_OFFLINE") or {}).get("value") == "1" and "HF_TOKEN" in env:
            problems.append(f"{where}: {container['name']}: runs offline (HF_HUB_OFFLINE=1) but gets HF_TOKEN")
    return problems


# The rules a Role of thicket's may hold without resourceNames, each exactly: the start-up watchdog
# (thicket.k8s.start_watch) lists the rollout's pods and evicts one that cannot start, and under
# Kueue deactivates the rollout's Workload; RBAC cannot narrow a list, a pod's generated name or a
# Workload's generated name.
UNNAMED_RULES = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "patch"]},
)


def rbac_problems(obj: Obj) -> list[str]:
    """A Role of thicket's names the objects it may touch (resourceNames) and may only get or
    patch them: no list, watch, create, delete or wildcard; but for the start-up watchdog's
    UNNAMED_RULES, exactly as written there."""
    if obj.get("kind") != "Role":
        return []
    where = f"Role/{obj['metadata']['name']}"
    problems = []
    for i, rule in enumerate(obj.get("rules") or []):
        if rule in UNNAMED_RULES:
            continue
        if not rule.get("resourceNames"):
            problems.append(f"{where}: rules[{i}]: no resourceNames: it reaches every object of its kinds")
        extra = set(rule.get("verbs") or []) - {"get", "patch"}
        if extra:
            problems.append(f"{where}: rules[{i}]: verbs {sorted(extra)} beyond get and patch")
    return problems


def placement_problems(obj: Obj) -> list[str]:
    """A Job whose pods need no GPU stays off GPU nodes: a nodeSelector, or a required node
    affinity. (Not in render's checks: a spec may turn the default affinity off.)"""
    pod = _pod(obj)
    if pod is None or any("nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {}) for c in _containers(pod)):
        return []
    required = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not pod.get("nodeSelector") and not required:
        return [f"Job/{obj['metadata']['name']}: a CPU-only pod with no nodeSelector or node affinity may land on a GPU node"]
    return []


def _flag(args: list[str], flag: str) -> str | None:
    return next((value for name, value in zip(args, args[1:]) if name == flag), None)


def sweep_problems(objects: list[Obj]) -> list[str]:
    """Rules across a sweep's objects:

    - the rollout pod's activeDeadlineSeconds is above the worker's own deadlines
      (--wait-ready-timeout, and run.index_timeout_s from the spec in the ConfigMap it mounts), so
      the worker's clean exit comes first;
    - a suspended Job is released by another of the sweep's Jobs (`wait-job --release NAME`), or by
      Kueue (it carries the queue label)."""
    import yaml

    problems = []
    configs = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "ConfigMap"}
    jobs = [o for o in objects if o.get("kind") == "Job"]
    released = {_flag(c.get("args") or [], "--release") for job in jobs for c in _containers(_pod(job))}
    for job in jobs:
        where = f"Job/{job['metadata']['name']}"
        pod = _pod(job)
        queued = "kueue.x-k8s.io/queue-name" in (job["metadata"].get("labels") or {})  # Kueue releases it
        if job["spec"].get("suspend") and job["metadata"]["name"] not in released and not queued:
            problems.append(f"{where}: suspended, and no Job of the sweep releases it")
        worker = next((c for c in pod["containers"] if "--wait-ready-timeout" in (c.get("args") or [])), None)
        if worker is None:
            continue
        own = float(_flag(worker["args"], "--wait-ready-timeout") or 0)
        for volume in pod.get("volumes") or []:
            config = configs.get((volume.get("configMap") or {}).get("name"))
            if config is not None:
                for text in (config.get("data") or {}).values():
                    own += float(((yaml.safe_load(text) or {}).get("run") or {}).get("index_timeout_s") or 0)
        deadline = pod.get("activeDeadlineSeconds")
        if deadline is None or deadline <= own:
            problems.append(f"{where}: activeDeadlineSeconds {deadline} is not above the worker's own deadlines "
                            f"({own:g} s): the pod would be killed before the worker's clean exit")
    return problems
