"""Semantic rules the Kubernetes API server enforces and a JSON schema cannot express.

`check_objects(objects)` returns one line per broken rule ("Job/x: spec.template...: why"), empty
when every object would be admitted. Schema-level checks (unknown fields, types) are left to
`kubernetes-validate`. The rules follow the API server's validation (pkg/apis/{core,batch}/validation)
for what thicket renders and the k8s/ base holds: names, labels, Jobs (Indexed, per-index backoff,
pod failure policy), pods (restart policies, native sidecars, probes, ports, env, volumes,
resources, security context, tolerations), RBAC, ConfigMaps, Secrets and PVCs. `policy_problems`
(rules/policy.py) adds thicket's own policy for its pods: security, exposure, a bounded start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from thicket.cluster_spec.values import DNS_LABEL, DNS_SUBDOMAIN, label_value, qualified_name
from thicket.k8s.rules.pods import _pod_spec, _quantity
from thicket.k8s.rules.policy import (
    bounded_problems,
    exposure_problems,
    placement_problems,
    policy_problems,
    rbac_problems,
    security_problems,
    startup_problems,
    sweep_problems,
)
from thicket.k8s.rules.report import (
    COMPLETIONS_SOFT_LIMIT,
    CONFIG_KEY,
    HIGH_COMPLETIONS_LIMIT,
    MAX_PARALLELISM_INDEXED,
    NAMESPACED_KINDS,
    _Report,
)

Obj = dict[str, Any]


def check_objects(objects: Iterable[Obj]) -> list[str]:
    problems: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        problems += check_object(obj)
        key = (obj.get("kind", ""), (obj.get("metadata") or {}).get("namespace", ""), (obj.get("metadata") or {}).get("name", ""))
        if key in seen:
            problems.append(f"{key[0]}/{key[2]}: duplicate object")
        seen.add(key)
    return problems


def check_object(obj: Obj) -> list[str]:
    kind = obj.get("kind", "?")
    meta = obj.get("metadata") or {}
    r = _Report(f"{kind}/{meta.get('name', '?')}")
    _metadata(r, kind, meta)
    checker = {
        "Job": _job,
        "Pod": lambda report, o: _pod_spec(report, "spec", o.get("spec") or {}, owner=None),
        "ConfigMap": _config_data,
        "Secret": _config_data,
        "RoleBinding": _role_binding,
        "Role": _role,
        "PersistentVolumeClaim": _pvc,
    }.get(kind)
    if checker:
        checker(r, obj)
    return r.problems


def _metadata(report: _Report, kind: str, meta: Obj) -> None:
    name = meta.get("name")
    if not name:
        report.add("metadata.name", "required")
        return
    if kind in ("Namespace", "Job"):
        if len(name) > 63 or not DNS_LABEL.match(name):
            report.add("metadata.name", f"{name!r} must be a DNS-1123 label of at most 63 characters")
    elif len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        report.add("metadata.name", f"{name!r} must be a DNS-1123 subdomain")
    namespace = meta.get("namespace")
    if namespace is not None:
        if kind not in NAMESPACED_KINDS:
            report.add("metadata.namespace", f"{kind} is not namespaced")
        elif len(namespace) > 63 or not DNS_LABEL.match(namespace):
            report.add("metadata.namespace", f"{namespace!r} must be a DNS-1123 label")
    _labels(report, "metadata.labels", meta.get("labels"))
    _annotations(report, "metadata.annotations", meta.get("annotations"))


def _labels(report: _Report, path: str, labels: Obj | None) -> None:
    for key, value in (labels or {}).items():
        if not qualified_name(key):
            report.add(f"{path}[{key}]", "invalid label key")
        if not isinstance(value, str) or not label_value(value):
            report.add(f"{path}[{key}]",
                       f"invalid label value {value!r} (at most 63 of [-A-Za-z0-9_.], alphanumeric ends)")


def _annotations(report: _Report, path: str, annotations: Obj | None) -> None:
    total = 0
    for key, value in (annotations or {}).items():
        if not qualified_name(key):
            report.add(f"{path}[{key}]", "invalid annotation key")
        if not isinstance(value, str):
            report.add(f"{path}[{key}]", "annotation values must be strings")
        total += len(key) + len(str(value))
    if total > 256 * 1024:
        report.add(path, "annotations may total at most 256 KiB")


def _job(report: _Report, obj: Obj) -> None:
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    pod = template.get("spec") or {}
    name = (obj.get("metadata") or {}).get("name", "")
    _labels(report, "spec.template.metadata.labels", (template.get("metadata") or {}).get("labels"))
    _annotations(report, "spec.template.metadata.annotations", (template.get("metadata") or {}).get("annotations"))
    restart = pod.get("restartPolicy")
    if restart not in ("Never", "OnFailure"):
        report.add("spec.template.spec.restartPolicy", f"a Job's pods need Never or OnFailure, got {restart!r}")
    mode = spec.get("completionMode", "NonIndexed")
    report.enum("spec.completionMode", mode, "completionMode")
    completions = spec.get("completions")
    parallelism = spec.get("parallelism")
    for field in ("completions", "parallelism", "backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes",
                  "ttlSecondsAfterFinished", "activeDeadlineSeconds"):
        value = spec.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < (1 if field == "activeDeadlineSeconds" else 0)):
            report.add(f"spec.{field}", f"must be a non-negative integer, got {value!r}")
    if mode == "Indexed":
        if completions is None:
            report.add("spec.completions", "required when completionMode is Indexed")
        if isinstance(parallelism, int) and parallelism > MAX_PARALLELISM_INDEXED:
            report.add("spec.parallelism", f"must be <= {MAX_PARALLELISM_INDEXED} for an Indexed Job")
        if isinstance(completions, int) and completions > 0:
            hostname = f"{name}-{completions - 1}"
            if len(hostname) > 63:
                report.add("metadata.name", f"too long for an Indexed Job: pod hostname {hostname!r} would exceed 63 characters")
    per_index = spec.get("backoffLimitPerIndex")
    max_failed = spec.get("maxFailedIndexes")
    if per_index is not None:
        if mode != "Indexed":
            report.add("spec.backoffLimitPerIndex", "requires completionMode Indexed")
        if restart != "Never":
            report.add("spec.backoffLimitPerIndex", "requires the pod template's restartPolicy Never")
        if isinstance(completions, int) and completions > COMPLETIONS_SOFT_LIMIT:
            if max_failed is None or max_failed > HIGH_COMPLETIONS_LIMIT:
                report.add("spec.maxFailedIndexes", f"required and <= {HIGH_COMPLETIONS_LIMIT} when completions > {COMPLETIONS_SOFT_LIMIT}")
            if isinstance(parallelism, int) and parallelism > HIGH_COMPLETIONS_LIMIT:
                report.add("spec.parallelism", f"must be <= {HIGH_COMPLETIONS_LIMIT} when completions > {COMPLETIONS_SOFT_LIMIT}")
    if max_failed is not None:
        if per_index is None:
            report.add("spec.maxFailedIndexes", "requires backoffLimitPerIndex")
        if isinstance(completions, int) and isinstance(max_failed, int) and max_failed > completions:
            report.add("spec.maxFailedIndexes", "must be <= completions")
    report.enum("spec.podReplacementPolicy", spec.get("podReplacementPolicy"), "podReplacementPolicy")
    policy = spec.get("podFailurePolicy")
    if policy is not None:
        _pod_failure_policy(report, policy, pod, restart, per_index)
        if spec.get("podReplacementPolicy") not in (None, "Failed"):
            report.add("spec.podReplacementPolicy", "must be Failed when podFailurePolicy is set")
    _pod_spec(report, "spec.template.spec", pod, owner="Job")


def _pod_failure_policy(report: _Report, policy: Obj, pod: Obj, restart: Any, per_index: Any) -> None:
    if restart != "Never":
        report.add("spec.podFailurePolicy", "requires the pod template's restartPolicy Never")
    rules = policy.get("rules") or []
    if len(rules) > 20:
        report.add("spec.podFailurePolicy.rules", "at most 20 rules")
    names = {c.get("name") for c in (pod.get("containers") or []) + (pod.get("initContainers") or [])}
    for i, rule in enumerate(rules):
        path = f"spec.podFailurePolicy.rules[{i}]"
        action = rule.get("action")
        report.enum(f"{path}.action", action, "podFailureAction")
        if action == "FailIndex" and per_index is None:
            report.add(f"{path}.action", "FailIndex requires backoffLimitPerIndex")
        codes, conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if (codes is None) == (conditions is None):
            report.add(path, "exactly one of onExitCodes and onPodConditions is required")
        if codes is not None:
            report.enum(f"{path}.onExitCodes.operator", codes.get("operator"), "exitCodesOperator")
            values = codes.get("values") or []
            if not values or len(values) > 255:
                report.add(f"{path}.onExitCodes.values", "1 to 255 values are required")
            if len(set(values)) != len(values) or values != sorted(values):
                report.add(f"{path}.onExitCodes.values", "must be unique and sorted ascending")
            if codes.get("operator") == "In" and 0 in values:
                report.add(f"{path}.onExitCodes.values", "0 is not allowed with operator In")
            container = codes.get("containerName")
            if container is not None and container not in names:
                report.add(f"{path}.onExitCodes.containerName", f"{container!r} is not a container of the pod template")
        for j, condition in enumerate(conditions or []):
            if not condition.get("type"):
                report.add(f"{path}.onPodConditions[{j}].type", "required")
            if condition.get("status", "True") not in ("True", "False", "Unknown"):
                report.add(f"{path}.onPodConditions[{j}].status", "must be True, False or Unknown")


def _config_data(report: _Report, obj: Obj) -> None:
    size = 0
    keys: set[str] = set()
    for section in ("data", "stringData", "binaryData"):
        for key, value in (obj.get(section) or {}).items():
            if len(key) > 253 or not CONFIG_KEY.match(key):
                report.add(f"{section}[{key}]", "keys may hold only letters, digits, '-', '_' and '.'")
            if key in keys and section != "stringData":
                report.add(f"{section}[{key}]", "duplicate key")
            keys.add(key)
            size += len(str(value))
    if size > 1024 * 1024:
        report.add("data", "a ConfigMap or Secret holds at most 1 MiB")


def _role(report: _Report, obj: Obj) -> None:
    for i, rule in enumerate(obj.get("rules") or []):
        if not rule.get("verbs"):
            report.add(f"rules[{i}].verbs", "at least one verb is required")
        if "apiGroups" in rule and not rule.get("resources"):
            report.add(f"rules[{i}].resources", "required with apiGroups")


def _role_binding(report: _Report, obj: Obj) -> None:
    ref = obj.get("roleRef") or {}
    report.enum("roleRef.kind", ref.get("kind"), "roleRefKind")
    if ref.get("apiGroup") != "rbac.authorization.k8s.io":
        report.add("roleRef.apiGroup", "must be rbac.authorization.k8s.io")
    if not ref.get("name"):
        report.add("roleRef.name", "required")
    for i, subject in enumerate(obj.get("subjects") or []):
        report.enum(f"subjects[{i}].kind", subject.get("kind"), "subjectKind")
        if subject.get("kind") == "ServiceAccount":
            if subject.get("apiGroup", ""):
                report.add(f"subjects[{i}].apiGroup", "must be empty for a ServiceAccount")
            if not subject.get("namespace") and not (obj.get("metadata") or {}).get("namespace"):
                report.add(f"subjects[{i}].namespace", "required for a ServiceAccount")


def _pvc(report: _Report, obj: Obj) -> None:
    spec = obj.get("spec") or {}
    modes = spec.get("accessModes") or []
    if not modes:
        report.add("spec.accessModes", "at least one access mode is required")
    for i, mode in enumerate(modes):
        report.enum(f"spec.accessModes[{i}]", mode, "accessMode")
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if storage is None:
        report.add("spec.resources.requests.storage", "required")
    else:
        _quantity(report, "spec.resources.requests.storage", storage)


__all__ = ["bounded_problems", "check_object", "check_objects", "exposure_problems", "placement_problems",
           "policy_problems", "rbac_problems", "security_problems", "startup_problems", "sweep_problems"]
