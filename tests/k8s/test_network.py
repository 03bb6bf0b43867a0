"""Cloud credentials stay with the worker (thicket.k8s.network): the identity webhook's
skip-containers annotation names every other container of the rollout pod, and the optional
NetworkPolicy closes the cloud metadata addresses while leaving the rest of egress open."""

from __future__ import annotations

import copy
import ipaddress

import kubernetes_validate
import pytest

from tests.support.manifests import SWEEPS, by_kind, containers, rollout, spec_with, sweep_id, variant_specs
from thicket.k8s.network import METADATA_CIDRS, SKIP_CONTAINERS, credential_problems
from thicket.k8s.render import render
from thicket.spec import load_spec

TOKEN_DIR = "/var/run/secrets/eks.amazonaws.com/serviceaccount"


def webhook_mutation(pod: dict, annotations: dict) -> dict:
    """What aws/amazon-eks-pod-identity-webhook does to a pod whose service account has a role
    (pkg/handler: the token volume, mounted with AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE into
    every container and init container not named in eks.amazonaws.com/skip-containers)."""
    pod = copy.deepcopy(pod)
    skip = set(filter(None, annotations.get(SKIP_CONTAINERS, "").split(",")))
    pod.setdefault("volumes", []).append({"name": "aws-iam-token", "projected": {"sources": [
        {"serviceAccountToken": {"audience": "sts.amazonaws.com", "expirationSeconds": 86400, "path": "token"}}]}})
    for container in pod.get("initContainers", []) + pod["containers"]:
        if container["name"] in skip:
            continue
        container.setdefault("env", []).append({"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"})
        container.setdefault("volumeMounts", []).append({"name": "aws-iam-token", "mountPath": TOKEN_DIR,
                                                         "readOnly": True})
    return pod


@pytest.mark.parametrize("path", SWEEPS, ids=sweep_id)
def test_every_shipped_sweep_keeps_credentials_to_the_worker(path):
    assert credential_problems(render(load_spec(path))) == []


@pytest.mark.parametrize("variant", sorted(variant_specs()))
def test_every_cluster_variant_keeps_credentials_to_the_worker(variant):
    assert credential_problems(render(variant_specs()[variant])) == []


def test_the_webhook_gives_the_token_to_the_worker_only():
    spec = spec_with(service_account="thicket-rollout", s3_secret=None,
                     envs=[{"family": "textcraft"}, {"family": "math", "port": 8101}])
    template = rollout(render(spec))["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations[SKIP_CONTAINERS] == "env-textcraft,env-math,vllm"
    mutated = containers(webhook_mutation(template["spec"], annotations))
    with_token = [name for name, c in mutated.items()
                  if any(m["mountPath"] == TOKEN_DIR for m in c.get("volumeMounts", []))]
    assert with_token == ["worker"]
    # The old rendering (no annotation): every container, the CodeAct sandbox's sidecar included.
    old = containers(webhook_mutation(template["spec"], {}))
    assert all(any(m["mountPath"] == TOKEN_DIR for m in c["volumeMounts"]) for c in old.values())


def test_the_rule_catches_a_pod_without_the_annotation_and_a_policy_without_egress():
    objects = render(spec_with(network_policy=True))
    job = rollout(objects)
    del job["spec"]["template"]["metadata"]["annotations"][SKIP_CONTAINERS]
    (policy,) = by_kind(objects, "NetworkPolicy")
    old_policy = copy.deepcopy(policy)
    old_policy["spec"] = {"podSelector": policy["spec"]["podSelector"], "policyTypes": ["Ingress"],
                          "ingress": policy["spec"]["ingress"]}
    problems = credential_problems([job, old_policy])
    assert any("must name env-textcraft, vllm" in p for p in problems), problems
    assert any("no Egress policy type" in p for p in problems), problems
    job["spec"]["template"]["metadata"]["annotations"][SKIP_CONTAINERS] = "env-textcraft,vllm,worker"
    assert any("names the worker" in p for p in credential_problems([job]))
    wide = copy.deepcopy(policy)
    wide["spec"]["egress"][1]["to"][0]["ipBlock"]["except"] = []
    assert credential_problems([wide]) == [
        f"NetworkPolicy/{policy['metadata']['name']}: egress to {cidr} (cloud metadata) is admitted by ipBlock 0.0.0.0/0"
        for cidr in ("169.254.169.254/32", "169.254.169.252/32")]
    everything = copy.deepcopy(policy)
    everything["spec"]["egress"].append({})
    assert any("no `to`" in p for p in credential_problems([everything]))


def _egress_admits(policy: dict, address: str, port: int = 80, protocol: str = "TCP") -> bool:
    """Whether the policy's ipBlock rules admit egress to an address outside the cluster, on a port.
    Kubernetes, "Network Policies" (NetworkPolicyEgressRule): a rule admits traffic that matches one
    of its peers and one of its ports (no ports: every port; a port's protocol defaults to TCP)."""
    ip = ipaddress.ip_address(address)
    for rule in policy["spec"]["egress"]:
        ports = rule.get("ports") or []
        if ports and not any(p["port"] == port and p.get("protocol", "TCP") == protocol for p in ports):
            continue
        for peer in rule.get("to", []):
            block = peer.get("ipBlock")
            if not block:
                continue
            net = ipaddress.ip_network(block["cidr"])
            if ip.version == net.version and ip in net and not any(
                    ip in ipaddress.ip_network(e) for e in block.get("except", [])):
                return True
    return False


def test_the_network_policy_closes_the_metadata_addresses_and_nothing_else():
    (policy,) = by_kind(render(spec_with(network_policy=True)), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    for cidr in METADATA_CIDRS:
        assert not _egress_admits(policy, cidr.split("/")[0]), cidr
    for address in ("52.216.8.5",  # S3
                    "169.254.170.23", "fd00:ec2::23",  # the EKS Pod Identity agent (needs the token)
                    "8.8.8.8", "2600:1f18::1", "10.0.0.10"):
        assert _egress_admits(policy, address), address
    assert {"to": [{"namespaceSelector": {}}]} in policy["spec"]["egress"]  # DNS, in-cluster S3
    for version in ("1.29.0", "1.37.0"):
        kubernetes_validate.validate(policy, version, strict=True)


def test_dns_reaches_the_node_local_resolvers_while_the_metadata_http_stays_closed():
    """GKE with Cloud DNS ("Using Cloud DNS for GKE"; always on Autopilot) gives every pod
    `nameserver 169.254.169.254`, the metadata server, which answers DNS on port 53 (Cloud DNS,
    "Name resolution order"); NodeLocal DNSCache listens on 169.254.20.10. Neither is a pod, so the
    namespaceSelector rule never admits them: before, the except list dropped every lookup on GKE
    and the worker could not resolve its storage (exit 3, every index retried)."""
    (policy,) = by_kind(render(spec_with(network_policy=True)), "NetworkPolicy")
    for resolver in ("169.254.169.254", "169.254.20.10"):
        for protocol in ("UDP", "TCP"):  # UDP first; TCP for answers over 512 bytes (RFC 7766)
            assert _egress_admits(policy, resolver, 53, protocol), (resolver, protocol)
    # The metadata server's HTTP API (80; 443 kept closed too) stays denied on every address.
    for cidr in METADATA_CIDRS:
        for port in (80, 443, 8080):
            assert not _egress_admits(policy, cidr.split("/")[0], port), (cidr, port)
    assert credential_problems([policy]) == []
    # A DNS rule that also opened port 80 to the metadata address is caught.
    leaky = copy.deepcopy(policy)
    leaky["spec"]["egress"][-1]["ports"].append({"protocol": "TCP", "port": 80})
    assert any("169.254.169.254/32 (cloud metadata) is admitted" in p for p in credential_problems([leaky]))
