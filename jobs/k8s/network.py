"""Optional objects around the rollout pods, and what keeps cloud credentials to the worker.

- A NetworkPolicy (`cluster.network_policy: true`): ingress to the worker's metrics port only (the
  servers listen on 127.0.0.1 anyway: this is the second wall), and egress anywhere except the
  cloud metadata addresses (METADATA_CIDRS), so no container of the pod (the env sidecar running
  model-written code included) can take the node's or the pod's cloud identity from there; DNS
  (port 53) to the node-local resolvers stays open (DNS_RESOLVERS: with Cloud DNS, GKE's resolver
  is the metadata address).
- A Prometheus Operator PodMonitor that scrapes the metrics port.
- The pod annotation `eks.amazonaws.com/skip-containers` (`identity_annotations`, on every rollout
  pod): EKS's pod identity webhook (IRSA and EKS Pod Identity) injects the role's web-identity
  token and variables into every container and init container of a pod whose service account has
  a role, except those the annotation names; it names every container but the worker.

Why the metadata addresses can be closed for the whole pod (a NetworkPolicy cannot tell a pod's
containers apart): the worker never needs them. With static keys it reads the Secret's variables;
with IRSA it exchanges the projected token with STS (over HTTPS, not the metadata address); with EKS
Pod Identity it asks the agent at 169.254.170.23 / fd00:ec2::23, which stays open and answers only
with the token the webhook keeps out of the sidecars; on GKE thicket's S3 client uses HMAC keys (GCS's
S3-compatible API), not the metadata server. docs/security.md, "Cloud credentials", says what holds.
"""

from __future__ import annotations

from typing import Any

from thicket.k8s.names import COMPONENT_LABEL, METRICS_PORT_NAME, SWEEP_LABEL, WORKER, labels, names
from thicket.spec import SweepSpec

Obj = dict[str, Any]

SKIP_CONTAINERS = "eks.amazonaws.com/skip-containers"
# EC2's instance metadata service (and GCE's metadata server, same address), GKE's metadata server
# for Workload Identity, and EC2's IPv6 metadata address.
METADATA_CIDRS_V4 = ("169.254.169.254/32", "169.254.169.252/32")
METADATA_CIDRS_V6 = ("fd00:ec2::254/128",)
METADATA_CIDRS = METADATA_CIDRS_V4 + METADATA_CIDRS_V6
# Node-local DNS resolvers that are not pods, so no namespaceSelector admits them: GKE with Cloud
# DNS (always on Autopilot) writes the metadata server, 169.254.169.254, into every pod's
# resolv.conf ("Using Cloud DNS for GKE"; Cloud DNS "Name resolution order": the metadata server
# answers on port 53); NodeLocal DNSCache listens on 169.254.20.10 ("Using NodeLocal DNSCache in
# Kubernetes Clusters"). Port 53 only: the metadata server's HTTP (80) stays closed.
DNS_RESOLVERS = ("169.254.169.254/32", "169.254.20.10/32")
DNS_PORT = 53


def _rollout_pods(spec: SweepSpec) -> Obj:
    return {"matchLabels": {SWEEP_LABEL: spec.name, COMPONENT_LABEL: "rollout"}}


def _meta(spec: SweepSpec, suffix: str) -> Obj:
    return {"name": names(spec.name)["rollout"] + suffix, "namespace": spec.cluster.namespace,
            "labels": labels(spec, "rollout")}


def identity_annotations(pod: Obj) -> dict[str, str]:
    """Annotations of a rollout pod's template: the identity webhook skips every container but
    the worker (vLLM and the env sidecars need no cloud credentials)."""
    skip = [c["name"] for c in (pod.get("initContainers") or []) + pod["containers"] if c["name"] != WORKER]
    return {SKIP_CONTAINERS: ",".join(skip)} if skip else {}


# The policy holds both directions (ingress and egress) of the rollout pods: named for that, not "-ingress".
NETWORK_POLICY_SUFFIX = "-network"


def network_policy(spec: SweepSpec) -> Obj:
    """Ingress to the rollout pods: the metrics port, from anywhere in the cluster; nothing else.
    Egress: every pod in the cluster (DNS, an in-cluster S3) and every address outside it (S3, STS,
    the model hub) except the metadata addresses."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(spec, NETWORK_POLICY_SUFFIX),
        "spec": {
            "podSelector": _rollout_pods(spec),
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": spec.cluster.metrics_port}]}],
            "egress": [
                {"to": [{"namespaceSelector": {}}]},
                {"to": [
                    {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(METADATA_CIDRS_V4)}},
                    {"ipBlock": {"cidr": "::/0", "except": list(METADATA_CIDRS_V6)}},
                ]},
                dns_rule(),
            ],
        },
    }


def dns_rule() -> Obj:
    """Egress to the node-local resolvers, DNS only (UDP and TCP 53)."""
    return {"to": [{"ipBlock": {"cidr": cidr}} for cidr in DNS_RESOLVERS],
            "ports": [{"protocol": protocol, "port": DNS_PORT} for protocol in ("UDP", "TCP")]}


def _dns_only(rule: Obj) -> bool:
    ports = rule.get("ports") or []
    return bool(ports) and all(p.get("port") == DNS_PORT for p in ports)


def pod_monitor(spec: SweepSpec) -> Obj:
    """cluster.pod_monitor_labels go on it: a Prometheus picks PodMonitors by its podMonitorSelector
    (kube-prometheus-stack's: release: <its release name>)."""
    meta = _meta(spec, "-metrics")
    meta["labels"] = {**spec.cluster.pod_monitor_labels, **meta["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": _rollout_pods(spec),
            "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics", "interval": "30s"}],
        },
    }


def network_objects(spec: SweepSpec) -> list[Obj]:
    c = spec.cluster
    return ([network_policy(spec)] if c.network_policy else []) + ([pod_monitor(spec)] if c.pod_monitor else [])


# --- rules over rendered objects ---------------------------------------------------------------


def _rollout_templates(objects: list[Obj]) -> list[tuple[str, Obj]]:
    return [(f"Job/{o['metadata']['name']}", o["spec"]["template"]) for o in objects
            if o.get("kind") == "Job" and o["spec"].get("completionMode") == "Indexed"]


def credential_problems(objects: list[Obj]) -> list[str]:
    """Cloud credentials stay with the worker: every rollout pod names every other container in
    the identity webhook's skip-containers annotation, and a NetworkPolicy, when rendered, closes
    the metadata addresses (and leaves the rest of egress open: S3, STS, DNS)."""
    problems = []
    for where, template in _rollout_templates(objects):
        pod = template["spec"]
        others = {c["name"] for c in (pod.get("initContainers") or []) + pod["containers"]} - {WORKER}
        value = (template["metadata"].get("annotations") or {}).get(SKIP_CONTAINERS, "")
        skipped = set(filter(None, value.split(",")))
        if missing := sorted(others - skipped):
            problems.append(f"{where}: annotation {SKIP_CONTAINERS} must name {', '.join(missing)}: the identity "
                            "webhook would give them the role's token")
        if WORKER in skipped:
            problems.append(f"{where}: annotation {SKIP_CONTAINERS} names the worker, which writes to S3")
    for policy in (o for o in objects if o.get("kind") == "NetworkPolicy"):
        where = f"NetworkPolicy/{policy['metadata']['name']}"
        spec = policy["spec"]
        if "Egress" not in spec.get("policyTypes", []):
            problems.append(f"{where}: no Egress policy type: the metadata addresses stay open")
            continue
        # A rule for port 53 alone (the node-local resolvers) leaves the metadata server's HTTP closed.
        blocks = [peer["ipBlock"] for rule in spec.get("egress") or [] if not _dns_only(rule)
                  for peer in rule.get("to") or [] if "ipBlock" in peer]
        open_rules = [rule for rule in spec.get("egress") or [] if not rule.get("to")]
        if open_rules:
            problems.append(f"{where}: an egress rule with no `to` admits every address, metadata included")
        for cidr in METADATA_CIDRS:
            wide = [b for b in blocks if _contains(b["cidr"], cidr) and cidr not in (b.get("except") or [])]
            if wide:
                problems.append(f"{where}: egress to {cidr} (cloud metadata) is admitted by ipBlock {wide[0]['cidr']}")
        if not any(b["cidr"] == "0.0.0.0/0" for b in blocks):
            problems.append(f"{where}: egress to the internet (S3, STS, the model hub) must stay open")
    return problems


def _contains(network: str, cidr: str) -> bool:
    import ipaddress

    net, sub = ipaddress.ip_network(network), ipaddress.ip_network(cidr)
    return net.version == sub.version and sub.subnet_of(net)  # type: ignore[arg-type]
