"""The node's disk in the node fit (thicket.k8s.node_disk, thicket.k8s.node_fit): a rollout pod asks
about 17 GiB of ephemeral storage, and the providers' default disks hold far fewer such pods than
an 8-GPU node's GPUs. Each figure is worked out by hand from the documents the module cites."""

from __future__ import annotations

import pytest

from tests.support.manifests import ROOT, rollout, spec_with
from thicket.k8s import node_disk
from thicket.k8s.machine_types import node_type
from thicket.k8s.node_fit import fit, pod_request, report
from thicket.k8s.render import render
from thicket.spec import load_spec

GiB = 2**30


def _request(spec):
    return pod_request(rollout(render(spec))["spec"]["template"]["spec"])


def test_the_rollout_pod_asks_17_gib_of_ephemeral_storage():
    # Each container: its /tmp emptyDir (cluster.ephemeral_storage) + 1 GiB for its logs; the env and
    # vLLM sidecars run beside the worker, so they add up: (2+1) + (10+1) + (2+1) = 17 GiB.
    assert _request(spec_with()).ephemeral_gib == 17


def test_gke_allocatable_matches_the_example_of_plan_node_sizes():
    """GKE, "Plan GKE Standard node sizes": a node with a 100 GB boot disk shows capacity
    ephemeral-storage 98831908Ki and allocatable 47060071478 (bytes). The reservation: the eviction
    threshold, 10% of the capacity, and min(50% x 100, 6 + 35% x 100, 100) = 41 GiB."""
    capacity = 98831908 * 1024  # 101,203,873,792 bytes
    by_hand = capacity - 0.10 * capacity - 41 * GiB  # = 47,060,071,629 bytes
    assert by_hand == pytest.approx(47060071478, abs=1024)  # the page's figure, to a KiB
    assert node_disk.allocatable_gib("GKE", 100) * GiB == pytest.approx(47060071478, abs=1024)


def test_pods_a_node_holds_by_disk_on_the_default_disks():
    # GKE 100 GB: 43.83 GiB allocatable (above) / 17 = 2 pods.
    assert node_disk.pods_on_disk("GKE", 100, 17) == 2
    # EKS node groups (CreateNodegroup diskSize) and Karpenter default to 20 GiB: file system
    # 20 x 0.9425 = 18.85 GiB, less 10% (1.885) and the AMI's 1 GiB kube-reserved = 15.97 GiB < 17.
    assert node_disk.allocatable_gib("EKS", 20) == pytest.approx(20 * 0.94254 * 0.9 - 1, abs=0.01)
    assert node_disk.pods_on_disk("EKS", 20, 17) == 0
    # eksctl's 80 GiB: 80 x 0.9425 x 0.9 - 1 = 66.86 GiB: 3 pods.
    assert node_disk.pods_on_disk("EKS", 80, 17) == 3


def test_an_eight_gpu_node_is_held_back_by_its_disk():
    """Before, a3-highgpu-8g and p5.48xlarge held 8 pods (their 8 GPUs); the disk was not counted."""
    request = _request(spec_with())
    gke = fit(request, node_type("a3-highgpu-8g"))
    assert (gke.pods, gke.without_disk, gke.disk_gib) == (2, 8, 100)
    eks = fit(request, node_type("p5.48xlarge"))
    assert (eks.pods, eks.short, eks.without_disk) == (0, "disk", 8)
    # With a disk that holds them: 8 x 17 = 136 GiB allocatable. GKE: above 268.6 GiB the system
    # reservation is its 100 GiB cap, so 0.9425 x 0.9 x D - 100 >= 136 -> D >= 278.2: 280 in tens.
    assert node_disk.disk_needed_gib("GKE", 8 * 17) == 280
    # EKS: 0.9425 x 0.9 x D - 1 >= 136 -> D >= 161.5: 170.
    assert node_disk.disk_needed_gib("EKS", 8 * 17) == 170
    assert fit(request, node_type("p5.48xlarge"), disk_gib=170).pods == 8
    assert fit(request, node_type("a3-highgpu-8g"), disk_gib=280).pods == 8


def test_validate_prints_the_disk_and_warns_when_the_selected_nodes_disk_is_short():
    spec = spec_with(node_selector={"node.kubernetes.io/instance-type": "a3-highgpu-8g"}, node_disk_gib=100)
    fit_report = report(spec, render(spec))
    disk = [line for line in fit_report.lines if line.startswith("disk")]
    assert disk and "17 GiB of ephemeral storage a pod" in disk[0] and "GKE 100 GiB (43.83 GiB allocatable: 2 pods)" in disk[0]
    assert any("a3-highgpu-8g 280 GiB (8 pods)" in line for line in fit_report.lines)
    assert any(w.startswith("node disk: a3-highgpu-8g with 100 GiB holds 2 pod(s)") and "cluster.node_disk_gib" in w
               for w in fit_report.warnings), fit_report.warnings
    bigger = spec_with(node_selector={"node.kubernetes.io/instance-type": "a3-highgpu-8g"}, node_disk_gib=280)
    assert not [w for w in report(bigger, render(bigger)).warnings if w.startswith("node disk")]


def test_the_eks_examples_name_the_walk_throughs_disk_and_fit():
    for name in ("textcraft-mcts.yaml", "webshop-mcts.yaml"):
        spec = load_spec(ROOT / "sweeps" / "cluster" / name)
        assert spec.cluster.node_disk_gib == 80  # eksctl's default root volume
        fit_report = report(spec, render(spec))
        assert [f.pods for f in fit_report.selected] == [1], name
