"""Rendered defaults an operator relies on: vLLM's CPU request scales with its GPUs, each image's
imagePullPolicy follows how it is pinned, the NetworkPolicy is named for what it holds, and validate
warns when small GPU pods are sent to large GPU nodes they would not share."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.support.manifests import ROOT, by_kind, containers, rollout, spec_with
from thicket.cluster_spec.image_pull import PullPolicy, pull_policy
from thicket.k8s.render import render
from thicket.spec import load_spec


def vllm_cpu(**cluster) -> str:
    pod = rollout(render(spec_with(**cluster)))["spec"]["template"]["spec"]
    return containers(pod)["vllm"]["resources"]["requests"]["cpu"]


def test_vllm_cpu_scales_with_its_gpus():
    """vLLM runs an API server, an engine core and one worker process per GPU
    (https://docs.vllm.ai/en/latest/design/arch_overview/): 4 CPUs, and 2 more per GPU past the first."""
    assert vllm_cpu() == "4"
    assert vllm_cpu(gpus=2) == "6"
    assert vllm_cpu(gpus=8) == "18"
    assert vllm_cpu(gpus=8, resources={"vllm": {"requests": {"cpu": "6"}}}) == "6"  # the spec's own stays


@pytest.mark.parametrize(("image", "expected"), [
    ("ghcr.io/thicket/thicket:0.1.0", PullPolicy.IF_NOT_PRESENT),
    ("vllm/vllm-openai:v0.33.0", PullPolicy.IF_NOT_PRESENT),
    ("vllm/vllm-openai:v0.9.1-cu124", PullPolicy.IF_NOT_PRESENT),
    ("ghcr.io/thicket/thicket@sha256:" + "a" * 64, PullPolicy.IF_NOT_PRESENT),
    ("registry:5000/thicket:main", PullPolicy.ALWAYS),
    ("ghcr.io/thicket/thicket:nightly", PullPolicy.ALWAYS),
    ("ghcr.io/thicket/thicket:0.2.0.dev3", PullPolicy.ALWAYS),
    ("ghcr.io/thicket/thicket:my-branch", PullPolicy.ALWAYS),
])
def test_the_pull_policy_follows_how_the_image_is_pinned(image, expected):
    """https://kubernetes.io/docs/concepts/containers/images/#image-pull-policy: IfNotPresent uses a
    node's cached copy, so only a reference that cannot move may use it."""
    assert pull_policy(image) is expected


def test_rendered_pull_policies_per_image_and_the_override():
    spec = spec_with(images={"worker": "ghcr.io/thicket/thicket:main"})
    pod = rollout(render(spec))["spec"]["template"]["spec"]
    by_name = containers(pod)
    assert by_name["worker"]["imagePullPolicy"] == "Always"  # a moving tag
    assert by_name["vllm"]["imagePullPolicy"] == "IfNotPresent"  # a release tag
    forced = rollout(render(spec_with(images={"worker": "ghcr.io/thicket/thicket:main", "pull_policy": "Never"})))
    assert {c["imagePullPolicy"] for c in containers(forced["spec"]["template"]["spec"]).values()} == {"Never"}


def test_the_network_policy_is_named_for_both_directions():
    policy = by_kind(render(spec_with(network_policy=True)), "NetworkPolicy")[0]
    assert policy["metadata"]["name"] == "tc-network"
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}


def test_one_gpu_pods_prefer_the_nodes_that_run_the_sweeps_pods(cli, tmp_path):
    """kube-scheduler's default LeastAllocated scoring spreads pods over the emptiest nodes
    (https://kubernetes.io/docs/concepts/scheduling-eviction/resource-bin-packing/): the rollout pods
    carry a preferred pod affinity to nodes that run the sweep's rollout pods, which the default
    profile weighs twice NodeResourcesFit (https://kubernetes.io/docs/reference/scheduling/config/)."""
    data = yaml.safe_load((ROOT / "sweeps/cluster/textcraft-mcts.yaml").read_text())
    big = copy.deepcopy(data)
    big["cluster"]["node_selector"] = {"node.kubernetes.io/instance-type": "a3-highgpu-8g"}
    big["cluster"]["gpus"] = 1
    big["cluster"]["node_disk_gib"] = 300  # 8 pods of 17 GiB (an 80 GiB disk holds 1: nothing to pack)
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(big))
    job = next(o for o in render(load_spec(tmp_path / "big.yaml")) if o["kind"] == "Job"
               and o["metadata"]["labels"]["app.kubernetes.io/component"] == "rollout")
    terms = job["spec"]["template"]["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms == [{"weight": 100, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {"thicket.dev/sweep": data["name"], "app.kubernetes.io/component": "rollout"}},
        "topologyKey": "kubernetes.io/hostname"}}]
    code, out, err = cli("validate", str(tmp_path / "big.yaml"))
    assert code == 0, err
    assert "packing pods of 1 GPU(s) on a3-highgpu-8g (8 GPUs, 8 pods a node): they prefer nodes" in out
    assert "pod packing" not in err  # no longer a warning: it is done
    # A node's preemption ends the 8 pods it holds: the table prices 8 pods per event.
    assert "node preempted" in out and "8 pod(s) x 1 attempt(s)" in out.split("node preempted")[1].splitlines()[0]
    one = copy.deepcopy(data)
    one["cluster"]["node_selector"] = {"node.kubernetes.io/instance-type": "a3-highgpu-1g"}
    one["cluster"]["gpus"] = 1
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(one))
    code, out, err = cli("validate", str(tmp_path / "one.yaml"))
    assert code == 0 and "packing pods" not in out, err
    assert "1 pod(s) x 1 attempt(s)" in out.split("node preempted")[1].splitlines()[0]


def test_security_md_states_the_rendered_waiter_role():
    """docs/security.md describes the Role `thicket render` writes, and vLLM's root filesystem as rendered."""
    objects = render(spec_with())
    role = by_kind(objects, "Role")[0]
    grants = {(rule.get("resourceNames", ["*"])[0], rule["resources"][0], tuple(rule["verbs"])) for rule in role["rules"]}
    assert grants == {("tc", "jobs", ("get", "patch")), ("tc-aggregate", "jobs", ("get", "patch")),
                      ("*", "pods", ("list",)), ("*", "pods/eviction", ("create",))}
    text = " ".join((ROOT / "docs" / "security.md").read_text().split())
    assert ("whose Role may `get`, `patch` the rollout Job `<sweep>` and the aggregation Job "
            "`<sweep>-aggregate`, each by name") in text
    assert "may also `list` the namespace's pods and `create` their `pods/eviction`" in text
    assert "get/list/watch" not in text
    pod = rollout(objects)["spec"]["template"]["spec"]
    assert containers(pod)["vllm"]["securityContext"]["readOnlyRootFilesystem"] is True
    assert "except vLLM" not in text and "vLLM included" in text
    tokens = {job["metadata"]["name"]: job["spec"]["template"]["spec"].get("automountServiceAccountToken")
              for job in by_kind(objects, "Job")}
    assert [name for name, token in tokens.items() if token] == ["tc-aggregate-wait"]
