"""The API server's rules for a pod spec: restart policies, native sidecars, containers, probes,
ports, env, volumes, resources, security context, tolerations; and thicket's own security policy."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from thicket.k8s.rules.report import (
    ENV_VAR_NAME,
    IANA_SVC_NAME,
    NATIVE_RESOURCES,
    VOLUME_SOURCES,
    _Report,
)
from thicket.k8s.spec import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    label_value,
    parse_quantity,
    qualified_name,
)

Obj = dict[str, Any]


def _pod_spec(r: _Report, path: str, pod: Obj, owner: str | None) -> None:
    r.enum(f"{path}.restartPolicy", pod.get("restartPolicy"), "restartPolicy")
    containers = pod.get("containers") or []
    init = pod.get("initContainers") or []
    if not containers:
        r.add(f"{path}.containers", "at least one container is required")
    volumes = pod.get("volumes") or []
    volume_names: set[str] = set()
    for i, volume in enumerate(volumes):
        vname = volume.get("name", "")
        if len(vname) > 63 or not DNS_LABEL.match(vname):
            r.add(f"{path}.volumes[{i}].name", f"{vname!r} must be a DNS-1123 label")
        if vname in volume_names:
            r.add(f"{path}.volumes[{i}].name", f"duplicate volume {vname!r}")
        volume_names.add(vname)
        sources = [k for k in volume if k in VOLUME_SOURCES]
        if len(sources) != 1:
            r.add(f"{path}.volumes[{i}]", f"exactly one volume source is required, got {sources}")
        empty = volume.get("emptyDir")
        if empty is not None:
            r.enum(f"{path}.volumes[{i}].emptyDir.medium", empty.get("medium", ""), "emptyDirMedium")
            if "sizeLimit" in empty:
                _quantity(r, f"{path}.volumes[{i}].emptyDir.sizeLimit", empty["sizeLimit"])
        claim = volume.get("persistentVolumeClaim")
        if claim is not None and not claim.get("claimName"):
            r.add(f"{path}.volumes[{i}].persistentVolumeClaim.claimName", "required")
        for ref in ("configMap", "secret"):
            if ref in volume and not (volume[ref].get("name") or volume[ref].get("secretName")):
                r.add(f"{path}.volumes[{i}].{ref}", "a name is required")
    all_names: set[str] = set()
    port_names: dict[str, str] = {}
    port_numbers: dict[tuple[int, str], str] = {}
    for group, items in (("initContainers", init), ("containers", containers)):
        for i, container in enumerate(items):
            cpath = f"{path}.{group}[{i}]"
            cname = container.get("name", "")
            if len(cname) > 63 or not DNS_LABEL.match(cname):
                r.add(f"{cpath}.name", f"{cname!r} must be a DNS-1123 label")
            if cname in all_names:
                r.add(f"{cpath}.name", f"duplicate container name {cname!r} (names are unique across containers and initContainers)")
            all_names.add(cname)
            _container(r, cpath, container, group == "initContainers", volume_names, port_names, port_numbers)
    for i, secret in enumerate(pod.get("imagePullSecrets") or []):
        if not secret.get("name"):
            r.add(f"{path}.imagePullSecrets[{i}].name", "required")
    if pod.get("priorityClassName") is not None and not DNS_SUBDOMAIN.match(pod["priorityClassName"]):
        r.add(f"{path}.priorityClassName", "must be a DNS-1123 subdomain")
    if pod.get("serviceAccountName") is not None and not DNS_SUBDOMAIN.match(pod["serviceAccountName"]):
        r.add(f"{path}.serviceAccountName", "must be a DNS-1123 subdomain")
    for key, value in (pod.get("nodeSelector") or {}).items():
        if not qualified_name(key) or not label_value(str(value)):
            r.add(f"{path}.nodeSelector[{key}]", "invalid label key or value")
    for i, toleration in enumerate(pod.get("tolerations") or []):
        _toleration(r, f"{path}.tolerations[{i}]", toleration)
    security = pod.get("securityContext") or {}
    _seccomp(r, f"{path}.securityContext.seccompProfile", security.get("seccompProfile"))
    r.enum(f"{path}.securityContext.fsGroupChangePolicy", security.get("fsGroupChangePolicy"), "fsGroupChangePolicy")
    if security.get("runAsNonRoot") and security.get("runAsUser") == 0:
        r.add(f"{path}.securityContext", "runAsNonRoot with runAsUser 0 can never start")
    grace = pod.get("terminationGracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or grace < 0):
        r.add(f"{path}.terminationGracePeriodSeconds", "must be a non-negative integer")


def _container(
    r: _Report, path: str, c: Obj, is_init: bool, volumes: set[str], port_names: dict[str, str],
    port_numbers: dict[tuple[int, str], str],
) -> None:
    if not c.get("image"):
        r.add(f"{path}.image", "required")
    r.enum(f"{path}.imagePullPolicy", c.get("imagePullPolicy"), "imagePullPolicy")
    restart = c.get("restartPolicy")
    sidecar = restart == "Always"
    if restart is not None:
        if not is_init:
            r.add(f"{path}.restartPolicy", "only init containers (native sidecars) may set restartPolicy")
        elif restart != "Always":
            r.add(f"{path}.restartPolicy", f"an init container's restartPolicy may only be Always, got {restart!r}")
    if is_init and not sidecar:
        for probe in ("livenessProbe", "readinessProbe", "startupProbe", "lifecycle"):
            if probe in c:
                r.add(f"{path}.{probe}", "only native sidecars (restartPolicy Always) may have probes or lifecycle hooks in initContainers")
    own_ports: set[str] = set()
    for i, port in enumerate(c.get("ports") or []):
        ppath = f"{path}.ports[{i}]"
        number = port.get("containerPort")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            r.add(f"{ppath}.containerPort", f"must be 1-65535, got {number!r}")
        protocol = port.get("protocol", "TCP")
        r.enum(f"{ppath}.protocol", protocol, "protocol")
        pname = port.get("name")
        if pname is not None:
            _port_name(r, f"{ppath}.name", pname)
            if pname in port_names:
                r.add(f"{ppath}.name", f"port name {pname!r} is already used by {port_names[pname]}")
            port_names[pname] = c.get("name", "?")
            own_ports.add(pname)
        if isinstance(number, int):
            if (number, protocol) in port_numbers:
                r.add(f"{ppath}.containerPort", f"port {number}/{protocol} is already used by {port_numbers[(number, protocol)]}")
            port_numbers[(number, protocol)] = c.get("name", "?")
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = c.get(probe_name)
        if probe is not None:
            _probe(r, f"{path}.{probe_name}", probe, probe_name, own_ports)
    env_names: set[str] = set()
    for i, var in enumerate(c.get("env") or []):
        epath = f"{path}.env[{i}]"
        name = var.get("name", "")
        if not ENV_VAR_NAME.match(name):
            r.add(f"{epath}.name", f"{name!r} is not a valid environment variable name")
        if name in env_names:
            r.add(f"{epath}.name", f"duplicate environment variable {name!r}")
        env_names.add(name)
        source = var.get("valueFrom")
        if source is not None:
            if var.get("value"):
                r.add(epath, "value and valueFrom are exclusive")
            kinds = [k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef", "fileKeyRef") if k in source]
            if len(kinds) != 1:
                r.add(f"{epath}.valueFrom", "exactly one source is required")
            for ref in ("secretKeyRef", "configMapKeyRef"):
                if ref in source and not (source[ref].get("name") and source[ref].get("key")):
                    r.add(f"{epath}.valueFrom.{ref}", "name and key are required")
        elif "value" in var and not isinstance(var["value"], str):
            r.add(f"{epath}.value", "must be a string")
    for i, source in enumerate(c.get("envFrom") or []):
        if len([k for k in ("configMapRef", "secretRef") if k in source]) != 1:
            r.add(f"{path}.envFrom[{i}]", "exactly one of configMapRef and secretRef is required")
    mounts: set[str] = set()
    for i, mount in enumerate(c.get("volumeMounts") or []):
        mpath = f"{path}.volumeMounts[{i}]"
        if mount.get("name") not in volumes:
            r.add(f"{mpath}.name", f"volume {mount.get('name')!r} is not defined in the pod's volumes")
        target = mount.get("mountPath", "")
        if not target.startswith("/"):
            r.add(f"{mpath}.mountPath", "must be an absolute path")
        if target in mounts:
            r.add(f"{mpath}.mountPath", f"{target!r} is mounted twice")
        mounts.add(target)
    _resources(r, f"{path}.resources", c.get("resources") or {})
    security = c.get("securityContext") or {}
    if security.get("allowPrivilegeEscalation") is False:
        if security.get("privileged"):
            r.add(f"{path}.securityContext", "cannot set allowPrivilegeEscalation false and privileged true")
        if "SYS_ADMIN" in ((security.get("capabilities") or {}).get("add") or []):
            r.add(f"{path}.securityContext", "cannot set allowPrivilegeEscalation false and add CAP_SYS_ADMIN")
    _seccomp(r, f"{path}.securityContext.seccompProfile", security.get("seccompProfile"))


def _port_name(r: _Report, path: str, name: str) -> None:
    if len(name) > 15 or not IANA_SVC_NAME.match(name) or "--" in name or not re.search("[a-z]", name):
        r.add(path, f"{name!r} must be an IANA service name: at most 15 lowercase letters, digits and '-', with a letter")


def _probe(r: _Report, path: str, probe: Obj, kind: str, own_ports: set[str]) -> None:
    handlers = [k for k in ("exec", "httpGet", "tcpSocket", "grpc") if k in probe]
    if len(handlers) != 1:
        r.add(path, "exactly one handler (exec, httpGet, tcpSocket, grpc) is required")
    for field, low in (("periodSeconds", 1), ("timeoutSeconds", 1), ("failureThreshold", 1), ("successThreshold", 1),
                       ("initialDelaySeconds", 0)):
        value = probe.get(field)
        if value is not None and (not isinstance(value, int) or value < low):
            r.add(f"{path}.{field}", f"must be an integer >= {low}")
    if kind in ("livenessProbe", "startupProbe") and probe.get("successThreshold", 1) != 1:
        r.add(f"{path}.successThreshold", "must be 1 for liveness and startup probes")
    for handler in ("httpGet", "tcpSocket"):
        if handler in probe:
            port = probe[handler].get("port")
            if isinstance(port, str) and port not in own_ports:
                r.add(f"{path}.{handler}.port", f"named port {port!r} is not a port of this container")
            elif isinstance(port, int) and not 1 <= port <= 65535:
                r.add(f"{path}.{handler}.port", "must be 1-65535")
            elif port is None:
                r.add(f"{path}.{handler}.port", "required")
    if "httpGet" in probe:
        r.enum(f"{path}.httpGet.scheme", probe["httpGet"].get("scheme"), "scheme")
        if not str(probe["httpGet"].get("path", "/")).startswith("/"):
            r.add(f"{path}.httpGet.path", "must start with '/'")


def _quantity(r: _Report, path: str, value: Any) -> Decimal | None:
    try:
        return parse_quantity(value)
    except ValueError as err:
        r.add(path, str(err))
        return None


def _resources(r: _Report, path: str, res: Obj) -> None:
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    parsed = {
        (section, name): _quantity(r, f"{path}.{section}[{name}]", value)
        for section, values in (("limits", limits), ("requests", requests))
        for name, value in values.items()
    }
    for name in requests:
        low, high = parsed.get(("requests", name)), parsed.get(("limits", name))
        if low is not None and high is not None and low > high:
            r.add(f"{path}.requests[{name}]", f"must be <= the limit {limits[name]!r}")
    for name in set(limits) | set(requests):
        if name in NATIVE_RESOURCES or name.startswith("hugepages-") or "/" not in name:
            continue
        # Extended resources (nvidia.com/gpu, ...): integers, no overcommit, requests == limits.
        for section in ("limits", "requests"):
            value = parsed.get((section, name))
            if value is not None and value != value.to_integral_value():
                r.add(f"{path}.{section}[{name}]", "an extended resource must be a whole number")
        if name not in limits:
            r.add(f"{path}.limits[{name}]", "an extended resource must be set in limits")
        elif name in requests and parsed.get(("requests", name)) != parsed.get(("limits", name)):
            r.add(f"{path}.requests[{name}]", "an extended resource's request must equal its limit")


def _seccomp(r: _Report, path: str, profile: Obj | None) -> None:
    if profile is None:
        return
    r.enum(f"{path}.type", profile.get("type"), "seccomp")
    if (profile.get("type") == "Localhost") != bool(profile.get("localhostProfile")):
        r.add(path, "localhostProfile is required for, and only for, type Localhost")


def _toleration(r: _Report, path: str, t: Obj) -> None:
    operator = t.get("operator", "Equal")
    r.enum(f"{path}.operator", operator, "tolerationOperator")
    r.enum(f"{path}.effect", t.get("effect") or None, "taintEffect")
    key = t.get("key")
    if key and not qualified_name(key):
        r.add(f"{path}.key", "invalid label key")
    if not key and operator != "Exists":
        r.add(f"{path}.operator", "must be Exists when key is empty")
    if operator == "Exists" and t.get("value"):
        r.add(f"{path}.value", "must be empty when operator is Exists")
    if t.get("tolerationSeconds") is not None and t.get("effect") != "NoExecute":
        r.add(f"{path}.effect", "must be NoExecute when tolerationSeconds is set")


def security_problems(obj: Obj) -> list[str]:
    """thicket's policy for its pods: non-root, no privilege escalation, no capabilities,
    RuntimeDefault seccomp, read-only root filesystem except for vLLM."""
    if obj.get("kind") != "Job":
        return []
    where = f"Job/{obj['metadata']['name']}"
    pod = obj["spec"]["template"]["spec"]
    pod_security = pod.get("securityContext") or {}
    problems = []
    for container in (pod.get("initContainers") or []) + pod["containers"]:
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
        if name != "vllm" and sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: {name}: readOnlyRootFilesystem must be true")
        if sc.get("readOnlyRootFilesystem") and not any(m["mountPath"] == "/tmp" for m in container.get("volumeMounts") or []):
            problems.append(f"{where}: {name}: a read-only root filesystem needs an emptyDir at /tmp")
    return problems
