"""The API server's rules for a pod spec: restart policies, native sidecars, containers, probes,
ports, env, volumes, resources, security context, tolerations; and thicket's own security policy."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from thicket.cluster_spec.values import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    label_value,
    parse_quantity,
    qualified_name,
)
from thicket.k8s.rules.report import (
    ENV_VAR_NAME,
    IANA_SVC_NAME,
    NATIVE_RESOURCES,
    VOLUME_SOURCES,
    _Report,
)

Obj = dict[str, Any]


def _unique_label(report: _Report, path: str, name: str, seen: set[str], duplicate: str) -> None:
    """`name` is a DNS-1123 label not in `seen` (which it joins)."""
    if len(name) > 63 or not DNS_LABEL.match(name):
        report.add(path, f"{name!r} must be a DNS-1123 label")
    if name in seen:
        report.add(path, duplicate)
    seen.add(name)


def _pod_spec(report: _Report, path: str, pod: Obj, owner: str | None) -> None:
    report.enum(f"{path}.restartPolicy", pod.get("restartPolicy"), "restartPolicy")
    containers = pod.get("containers") or []
    init = pod.get("initContainers") or []
    if not containers:
        report.add(f"{path}.containers", "at least one container is required")
    volumes = pod.get("volumes") or []
    volume_names: set[str] = set()
    for i, volume in enumerate(volumes):
        vname = volume.get("name", "")
        _unique_label(report, f"{path}.volumes[{i}].name", vname, volume_names, f"duplicate volume {vname!r}")
        sources = [k for k in volume if k in VOLUME_SOURCES]
        if len(sources) != 1:
            report.add(f"{path}.volumes[{i}]", f"exactly one volume source is required, got {sources}")
        empty = volume.get("emptyDir")
        if empty is not None:
            report.enum(f"{path}.volumes[{i}].emptyDir.medium", empty.get("medium", ""), "emptyDirMedium")
            if "sizeLimit" in empty:
                _quantity(report, f"{path}.volumes[{i}].emptyDir.sizeLimit", empty["sizeLimit"])
        claim = volume.get("persistentVolumeClaim")
        if claim is not None and not claim.get("claimName"):
            report.add(f"{path}.volumes[{i}].persistentVolumeClaim.claimName", "required")
        for ref in ("configMap", "secret"):
            if ref in volume and not (volume[ref].get("name") or volume[ref].get("secretName")):
                report.add(f"{path}.volumes[{i}].{ref}", "a name is required")
    all_names: set[str] = set()
    port_names: dict[str, str] = {}
    port_numbers: dict[tuple[int, str], str] = {}
    for group, items in (("initContainers", init), ("containers", containers)):
        for i, container in enumerate(items):
            cpath = f"{path}.{group}[{i}]"
            cname = container.get("name", "")
            _unique_label(report, f"{cpath}.name", cname, all_names,
                          f"duplicate container name {cname!r} (names are unique across containers and initContainers)")
            _container(report, cpath, container, group == "initContainers", volume_names, port_names, port_numbers)
    for i, secret in enumerate(pod.get("imagePullSecrets") or []):
        if not secret.get("name"):
            report.add(f"{path}.imagePullSecrets[{i}].name", "required")
    if pod.get("priorityClassName") is not None and not DNS_SUBDOMAIN.match(pod["priorityClassName"]):
        report.add(f"{path}.priorityClassName", "must be a DNS-1123 subdomain")
    if pod.get("serviceAccountName") is not None and not DNS_SUBDOMAIN.match(pod["serviceAccountName"]):
        report.add(f"{path}.serviceAccountName", "must be a DNS-1123 subdomain")
    for key, value in (pod.get("nodeSelector") or {}).items():
        if not qualified_name(key) or not label_value(str(value)):
            report.add(f"{path}.nodeSelector[{key}]", "invalid label key or value")
    for i, toleration in enumerate(pod.get("tolerations") or []):
        _toleration(report, f"{path}.tolerations[{i}]", toleration)
    security = pod.get("securityContext") or {}
    _seccomp(report, f"{path}.securityContext.seccompProfile", security.get("seccompProfile"))
    report.enum(f"{path}.securityContext.fsGroupChangePolicy", security.get("fsGroupChangePolicy"),
                "fsGroupChangePolicy")
    if security.get("runAsNonRoot") and security.get("runAsUser") == 0:
        report.add(f"{path}.securityContext", "runAsNonRoot with runAsUser 0 can never start")
    grace = pod.get("terminationGracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or grace < 0):
        report.add(f"{path}.terminationGracePeriodSeconds", "must be a non-negative integer")


def _container(
    report: _Report, path: str, container: Obj, is_init: bool, volumes: set[str], port_names: dict[str, str],
    port_numbers: dict[tuple[int, str], str],
) -> None:
    if not container.get("image"):
        report.add(f"{path}.image", "required")
    report.enum(f"{path}.imagePullPolicy", container.get("imagePullPolicy"), "imagePullPolicy")
    restart = container.get("restartPolicy")
    sidecar = restart == "Always"
    if restart is not None:
        if not is_init:
            report.add(f"{path}.restartPolicy", "only init containers (native sidecars) may set restartPolicy")
        elif restart != "Always":
            report.add(f"{path}.restartPolicy",
                       f"an init container's restartPolicy may only be Always, got {restart!r}")
    if is_init and not sidecar:
        for probe in ("livenessProbe", "readinessProbe", "startupProbe", "lifecycle"):
            if probe in container:
                report.add(f"{path}.{probe}", "only native sidecars (restartPolicy Always) may have probes or lifecycle hooks in initContainers")
    own_ports: set[str] = set()
    for i, port in enumerate(container.get("ports") or []):
        ppath = f"{path}.ports[{i}]"
        number = port.get("containerPort")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            report.add(f"{ppath}.containerPort", f"must be 1-65535, got {number!r}")
        protocol = port.get("protocol", "TCP")
        report.enum(f"{ppath}.protocol", protocol, "protocol")
        pname = port.get("name")
        if pname is not None:
            _port_name(report, f"{ppath}.name", pname)
            if pname in port_names:
                report.add(f"{ppath}.name", f"port name {pname!r} is already used by {port_names[pname]}")
            port_names[pname] = container.get("name", "?")
            own_ports.add(pname)
        if isinstance(number, int):
            if (number, protocol) in port_numbers:
                report.add(f"{ppath}.containerPort", f"port {number}/{protocol} is already used by {port_numbers[(number, protocol)]}")
            port_numbers[(number, protocol)] = container.get("name", "?")
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if probe is not None:
            _probe(report, f"{path}.{probe_name}", probe, probe_name, own_ports)
    env_names: set[str] = set()
    for i, var in enumerate(container.get("env") or []):
        epath = f"{path}.env[{i}]"
        name = var.get("name", "")
        if not ENV_VAR_NAME.match(name):
            report.add(f"{epath}.name", f"{name!r} is not a valid environment variable name")
        if name in env_names:
            report.add(f"{epath}.name", f"duplicate environment variable {name!r}")
        env_names.add(name)
        source = var.get("valueFrom")
        if source is not None:
            if var.get("value"):
                report.add(epath, "value and valueFrom are exclusive")
            kinds = [k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef", "fileKeyRef") if k in source]
            if len(kinds) != 1:
                report.add(f"{epath}.valueFrom", "exactly one source is required")
            for ref in ("secretKeyRef", "configMapKeyRef"):
                if ref in source and not (source[ref].get("name") and source[ref].get("key")):
                    report.add(f"{epath}.valueFrom.{ref}", "name and key are required")
        elif "value" in var and not isinstance(var["value"], str):
            report.add(f"{epath}.value", "must be a string")
    for i, source in enumerate(container.get("envFrom") or []):
        if len([k for k in ("configMapRef", "secretRef") if k in source]) != 1:
            report.add(f"{path}.envFrom[{i}]", "exactly one of configMapRef and secretRef is required")
    mounts: set[str] = set()
    for i, mount in enumerate(container.get("volumeMounts") or []):
        mpath = f"{path}.volumeMounts[{i}]"
        if mount.get("name") not in volumes:
            report.add(f"{mpath}.name", f"volume {mount.get('name')!r} is not defined in the pod's volumes")
        target = mount.get("mountPath", "")
        if not target.startswith("/"):
            report.add(f"{mpath}.mountPath", "must be an absolute path")
        if target in mounts:
            report.add(f"{mpath}.mountPath", f"{target!r} is mounted twice")
        mounts.add(target)
    _resources(report, f"{path}.resources", container.get("resources") or {})
    security = container.get("securityContext") or {}
    if security.get("allowPrivilegeEscalation") is False:
        if security.get("privileged"):
            report.add(f"{path}.securityContext", "cannot set allowPrivilegeEscalation false and privileged true")
        if "SYS_ADMIN" in ((security.get("capabilities") or {}).get("add") or []):
            report.add(f"{path}.securityContext", "cannot set allowPrivilegeEscalation false and add CAP_SYS_ADMIN")
    _seccomp(report, f"{path}.securityContext.seccompProfile", security.get("seccompProfile"))


def _port_name(report: _Report, path: str, name: str) -> None:
    if len(name) > 15 or not IANA_SVC_NAME.match(name) or "--" in name or not re.search("[a-z]", name):
        report.add(path, f"{name!r} must be an IANA service name: at most 15 lowercase letters, digits and '-', with a letter")


def _probe(report: _Report, path: str, probe: Obj, kind: str, own_ports: set[str]) -> None:
    handlers = [k for k in ("exec", "httpGet", "tcpSocket", "grpc") if k in probe]
    if len(handlers) != 1:
        report.add(path, "exactly one handler (exec, httpGet, tcpSocket, grpc) is required")
    for field, low in (("periodSeconds", 1), ("timeoutSeconds", 1), ("failureThreshold", 1), ("successThreshold", 1),
                       ("initialDelaySeconds", 0)):
        value = probe.get(field)
        if value is not None and (not isinstance(value, int) or value < low):
            report.add(f"{path}.{field}", f"must be an integer >= {low}")
    if kind in ("livenessProbe", "startupProbe") and probe.get("successThreshold", 1) != 1:
        report.add(f"{path}.successThreshold", "must be 1 for liveness and startup probes")
    for handler in ("httpGet", "tcpSocket"):
        if handler in probe:
            port = probe[handler].get("port")
            if isinstance(port, str) and port not in own_ports:
                report.add(f"{path}.{handler}.port", f"named port {port!r} is not a port of this container")
            elif isinstance(port, int) and not 1 <= port <= 65535:
                report.add(f"{path}.{handler}.port", "must be 1-65535")
            elif port is None:
                report.add(f"{path}.{handler}.port", "required")
    if "httpGet" in probe:
        report.enum(f"{path}.httpGet.scheme", probe["httpGet"].get("scheme"), "scheme")
        if not str(probe["httpGet"].get("path", "/")).startswith("/"):
            report.add(f"{path}.httpGet.path", "must start with '/'")


def _quantity(report: _Report, path: str, value: Any) -> Decimal | None:
    try:
        return parse_quantity(value)
    except ValueError as err:
        report.add(path, str(err))
        return None


def _resources(report: _Report, path: str, res: Obj) -> None:
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    parsed = {
        (section, name): _quantity(report, f"{path}.{section}[{name}]", value)
        for section, values in (("limits", limits), ("requests", requests))
        for name, value in values.items()
    }
    for name in requests:
        low, high = parsed.get(("requests", name)), parsed.get(("limits", name))
        if low is not None and high is not None and low > high:
            report.add(f"{path}.requests[{name}]", f"must be <= the limit {limits[name]!r}")
    for name in set(limits) | set(requests):
        if name in NATIVE_RESOURCES or name.startswith("hugepages-") or "/" not in name:
            continue
        # Extended resources (nvidia.com/gpu, ...): integers, no overcommit, requests == limits.
        for section in ("limits", "requests"):
            value = parsed.get((section, name))
            if value is not None and value != value.to_integral_value():
                report.add(f"{path}.{section}[{name}]", "an extended resource must be a whole number")
        if name not in limits:
            report.add(f"{path}.limits[{name}]", "an extended resource must be set in limits")
        elif name in requests and parsed.get(("requests", name)) != parsed.get(("limits", name)):
            report.add(f"{path}.requests[{name}]", "an extended resource's request must equal its limit")


def _seccomp(report: _Report, path: str, profile: Obj | None) -> None:
    if profile is None:
        return
    report.enum(f"{path}.type", profile.get("type"), "seccomp")
    if (profile.get("type") == "Localhost") != bool(profile.get("localhostProfile")):
        report.add(path, "localhostProfile is required for, and only for, type Localhost")


def _toleration(report: _Report, path: str, toleration: Obj) -> None:
    operator = toleration.get("operator", "Equal")
    report.enum(f"{path}.operator", operator, "tolerationOperator")
    report.enum(f"{path}.effect", toleration.get("effect") or None, "taintEffect")
    key = toleration.get("key")
    if key and not qualified_name(key):
        report.add(f"{path}.key", "invalid label key")
    if not key and operator != "Exists":
        report.add(f"{path}.operator", "must be Exists when key is empty")
    if operator == "Exists" and toleration.get("value"):
        report.add(f"{path}.value", "must be empty when operator is Exists")
    if toleration.get("tolerationSeconds") is not None and toleration.get("effect") != "NoExecute":
        report.add(f"{path}.effect", "must be NoExecute when tolerationSeconds is set")
