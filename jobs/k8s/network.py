"""Optional objects around the rollout pods: a NetworkPolicy that admits traffic to the worker's
metrics port only (the servers listen on 127.0.0.1 anyway: this is the second wall), and a
Prometheus Operator PodMonitor that scrapes that port."""

from __future__ import annotations

from typing import Any

from thicket.k8s.names import COMPONENT_LABEL, METRICS_PORT_NAME, SWEEP_LABEL, labels, names
from thicket.spec import SweepSpec

Obj = dict[str, Any]


def _rollout_pods(spec: SweepSpec) -> Obj:
    return {"matchLabels": {SWEEP_LABEL: spec.name, COMPONENT_LABEL: "rollout"}}


def _meta(spec: SweepSpec, suffix: str) -> Obj:
    return {"name": names(spec.name)["rollout"] + suffix, "namespace": spec.cluster.namespace,
            "labels": labels(spec, "rollout")}


def network_policy(spec: SweepSpec) -> Obj:
    """Ingress to the rollout pods: the metrics port, from anywhere in the cluster; nothing else.
    Egress stays open (S3, the model hub, DNS)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(spec, "-ingress"),
        "spec": {
            "podSelector": _rollout_pods(spec),
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": spec.cluster.metrics_port}]}],
        },
    }


def pod_monitor(spec: SweepSpec) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(spec, "-metrics"),
        "spec": {
            "selector": _rollout_pods(spec),
            "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics", "interval": "30s"}],
        },
    }


def network_objects(spec: SweepSpec) -> list[Obj]:
    c = spec.cluster
    return ([network_policy(spec)] if c.network_policy else []) + ([pod_monitor(spec)] if c.pod_monitor else [])
