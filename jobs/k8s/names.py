"""Names, labels and the few facts every rendered object shares: object names from the sweep's
name, the labels that find a sweep's objects, whether the pod serves its own vLLM, the spec the
pods run."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from thicket.version import __version__
from thicket.spec import SweepSpec, parse_spec

Obj = dict[str, Any]


APP = "thicket"


SWEEP_LABEL = "thicket.dev/sweep"


COMPONENT_LABEL = "app.kubernetes.io/component"


SPEC_HASH = "thicket.dev/spec-sha256"


TEMPLATE_HASH = "thicket.dev/template-sha256"


SWEEP_URI = "thicket.dev/sweep-uri"


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


SPEC_DIR = "/etc/thicket"


SPEC_KEY = "spec.yaml"


WORKER = "worker"


METRICS_PORT_NAME = "metrics"


VLLM = "vllm"


MAX_JOB_NAME = 52  # pods are named <job>-<index>-<5 random>; their hostname <job>-<index> must fit 63


MAX_COMPLETIONS = 100_000  # above this an Indexed Job needs maxFailedIndexes and parallelism <= 10,000


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


LOCALHOST = "127.0.0.1"  # where the pod's servers listen: reachable from inside the pod only


VLLM_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]


def k8s_name(base: str, suffix: str = "", limit: int = 63) -> str:
    """`base + suffix`, shortened with a stable hash when longer than `limit` (a DNS-1123 label)."""
    name = base + suffix
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:6]
    keep = limit - len(suffix) - len(digest) - 1
    return f"{base[:keep].rstrip('-')}-{digest}{suffix}"


def names(sweep: str) -> dict[str, str]:
    return {
        "rollout": k8s_name(sweep, limit=MAX_JOB_NAME),
        "aggregate": k8s_name(sweep, "-aggregate", MAX_JOB_NAME),
        "aggregate-wait": k8s_name(sweep, "-aggregate-wait", MAX_JOB_NAME),
        "prefetch": k8s_name(sweep, "-prefetch", MAX_JOB_NAME),
        "spec": k8s_name(sweep, "-spec"),
    }


def labels(spec: SweepSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/instance": spec.name,
        COMPONENT_LABEL: component,
        "app.kubernetes.io/part-of": APP,
        "app.kubernetes.io/managed-by": APP,
        "app.kubernetes.io/version": __version__,
        SWEEP_LABEL: spec.name,
    }


def serves_vllm(spec: SweepSpec) -> bool:
    """A vLLM sidecar when the policy is vLLM served here (a model to load, or a localhost URL)."""
    policy = spec.policy
    if policy.kind != "vllm":
        return False
    return policy.url is None or (urlparse(policy.url).hostname or "") in LOCAL_HOSTS


def served_model_name(spec: SweepSpec) -> str:
    model = spec.policy.model or ""
    return Path(model).name if spec.policy.url is None else model  # as `thicket run` names it


def pod_spec_data(spec: SweepSpec) -> dict[str, Any]:
    """The spec the pods run: as written (unset defaults left out), the policy aimed at the pod's
    vLLM, without the `cluster` section (the controller's business: changing parallelism must
    not change the pods)."""
    data = spec.model_dump(mode="json", exclude_unset=True, exclude={"cluster"})
    if serves_vllm(spec):
        policy = data.setdefault("policy", {})
        policy.pop("server", None)
        policy.update(kind="vllm", model=served_model_name(spec), url=f"http://127.0.0.1:{spec.cluster.vllm_port}/v1")
        data = parse_spec(data, "cluster spec").model_dump(mode="json", exclude_unset=True)
    return data


def index_count(spec: SweepSpec) -> int:
    """len(spec.tasks.index_ranges()) without building the ranges: the Job's completions."""
    return math.ceil(spec.tasks.count / spec.tasks.per_index)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
