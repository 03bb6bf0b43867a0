"""thicket's own policy for its pods, beyond what the API server checks: how they run
(non-root, read-only, no capabilities), what they expose (the metrics port, nothing else) and
that their start is bounded (a server that never answers fails the pod in time)."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

LOCAL_ONLY = "127.0.0.1"


def policy_problems(obj: Obj) -> list[str]:
    return security_problems(obj) + exposure_problems(obj) + startup_problems(obj)


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
