"""A rule check's report: one line per broken rule, and the value sets the API server accepts."""

from __future__ import annotations

import re
from typing import Any

Obj = dict[str, Any]


IANA_SVC_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


ENV_VAR_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


MAX_PARALLELISM_INDEXED = 100_000


COMPLETIONS_SOFT_LIMIT = 100_000


HIGH_COMPLETIONS_LIMIT = 10_000


NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "storage")


VOLUME_SOURCES = (
    "emptyDir", "configMap", "secret", "persistentVolumeClaim", "projected", "downwardAPI", "hostPath",
    "ephemeral", "csi", "nfs", "image",
)


ENUMS = {
    "restartPolicy": ("Always", "OnFailure", "Never"),
    "imagePullPolicy": ("Always", "IfNotPresent", "Never"),
    "protocol": ("TCP", "UDP", "SCTP"),
    "completionMode": ("NonIndexed", "Indexed"),
    "podFailureAction": ("FailJob", "FailIndex", "Ignore", "Count"),
    "exitCodesOperator": ("In", "NotIn"),
    "tolerationOperator": ("Exists", "Equal"),
    "taintEffect": ("NoSchedule", "PreferNoSchedule", "NoExecute"),
    "seccomp": ("RuntimeDefault", "Unconfined", "Localhost"),
    "emptyDirMedium": ("", "Memory", "HugePages"),
    "accessMode": ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"),
    "podReplacementPolicy": ("TerminatingOrFailed", "Failed"),
    "fsGroupChangePolicy": ("OnRootMismatch", "Always"),
    "subjectKind": ("ServiceAccount", "User", "Group"),
    "roleRefKind": ("Role", "ClusterRole"),
    "scheme": ("HTTP", "HTTPS"),
}


# Names whose length must leave room: Indexed Job pods get the hostname <job>-<index>.
NAMESPACED_KINDS = ("ConfigMap", "Secret", "ServiceAccount", "Role", "RoleBinding", "Job", "Pod",
                    "PersistentVolumeClaim", "NetworkPolicy", "PodMonitor")


class _Report:
    def __init__(self, where: str) -> None:
        self.where = where
        self.problems: list[str] = []

    def add(self, path: str, why: str) -> None:
        self.problems.append(f"{self.where}: {path}: {why}")

    def enum(self, path: str, value: Any, kind: str) -> None:
        if value is not None and value not in ENUMS[kind]:
            self.add(path, f"unsupported value {value!r}; expected one of {', '.join(map(repr, ENUMS[kind]))}")
