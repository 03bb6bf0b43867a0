"""thicket.k8s.node_fit (and thicket.k8s.machine_types): the rollout pod's request as the scheduler
sums it, the allocatable resources of common GPU machine types from the providers' reservation
formulas, the node labels each provider sets, the model-load estimate, and what `thicket validate`
prints. Every example in sweeps/cluster fits the machine type its walk-through (docs/kubernetes-walkthrough.md)
creates."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from tests.support.manifests import ROOT, rollout, spec_with
from thicket.k8s import node_fit
from thicket.k8s.machine_types import NODE_TYPES, cpu_reserved, eks_memory_reserved_gib, gke_memory_reserved_gib, node_type
from thicket.k8s.node_fit import fit, load_estimates, pod_request, selector_notes, selector_picks
from thicket.k8s.render import render
from thicket.spec import load_spec, parse_spec

CLUSTER_SWEEPS = sorted((ROOT / "sweeps" / "cluster").glob("*.yaml"))
DOCS = ROOT / "docs" / "kubernetes-walkthrough.md"


def _pod(spec):
    return rollout(render(spec))["spec"]["template"]["spec"]


def _ctr(name, cpu, memory, sidecar=False, gpus=0):
    requests = {"cpu": cpu, "memory": memory}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    c = {"name": name, "resources": {"requests": requests}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


# -- the pod's request -----------------------------------------------------------------------------

def test_the_request_is_the_larger_of_the_biggest_init_container_and_sidecars_plus_main():
    pod = {"initContainers": [_ctr("s1", "1", "1Gi", sidecar=True), _ctr("setup", "6", "2Gi"),
                              _ctr("s2", "2", "4Gi", sidecar=True)],
           "containers": [_ctr("main", "1", "1Gi")]}
    r = pod_request(pod)
    assert r.cpu == 7  # setup (6) + the sidecar started before it (1) > 1 + 2 + 1
    assert r.memory_gib == 6  # 1 + 4 + 1 > 1 + 2
    # A limit with no request counts as the request, as the API server defaults it.
    limited = {"containers": [{"name": "m", "resources": {"limits": {"cpu": "2", "memory": "3Gi"}}}]}
    assert (pod_request(limited).cpu, pod_request(limited).memory_gib) == (2, 3)


def test_the_sciworld_example_asks_what_the_issue_measured():
    r = pod_request(_pod(load_spec(ROOT / "sweeps/cluster/sciworld-dense.yaml")))
    assert (r.cpu, r.memory_gib, r.gpus) == (5.5, 33.25, 1)  # vLLM 4/24Gi + sidecar 0.5/7424Mi + worker 1/2Gi
    assert r.text() == "5.5 CPU, 33.25 GiB, 1 GPU"


# -- allocatable -----------------------------------------------------------------------------------

def test_reservations_follow_the_providers_formulas():
    # GKE's example (gke-node-allocatable-memory-calculator, after "Plan node sizes"): 150 GiB
    # reserves 9.8577 GiB with the 100 MiB eviction threshold.
    assert gke_memory_reserved_gib(150) + 100 / 1024 == pytest.approx(9.8577, abs=1e-4)
    assert gke_memory_reserved_gib(16) == pytest.approx(1 + 0.8 + 0.8)
    assert cpu_reserved(1) == pytest.approx(0.06)
    assert cpu_reserved(4) == pytest.approx(0.08)
    assert cpu_reserved(12) == pytest.approx(0.08 + 8 * 0.0025)
    assert eks_memory_reserved_gib(58) * 1024 == pytest.approx(255 + 11 * 58)  # g5.xlarge: 893 MiB


def test_allocatable_is_below_capacity_and_g2_standard_8_cannot_hold_the_old_sciworld_pod():
    for node in NODE_TYPES:
        assert 0 < node.allocatable_memory_gib < node.memory_gib
        assert 0 < node.allocatable_cpu < node.vcpus
    old = node_fit.PodRequest(5.5, 33.25, 1)
    assert not fit(old, node_type("g2-standard-4")).fits
    small = fit(old, node_type("g2-standard-8"))
    assert (small.fits, small.short) == (False, "memory")
    assert fit(old, node_type("g2-standard-12")).pods == 1
    assert fit(old, node_type("g2-standard-24")).pods == 2  # two L4s
    assert fit(old, node_type("p4d.24xlarge")).pods == 8


def test_a_model_too_big_for_the_gpu_does_not_fit():
    request = node_fit.PodRequest(4, 40, 1)
    assert fit(request, node_type("g6.4xlarge"), model_gib=30).short == "GPU memory"  # a 15B in bf16 on one L4
    assert fit(request, node_type("a2-ultragpu-1g"), model_gib=30).fits


# -- node selectors --------------------------------------------------------------------------------

def test_selectors_on_labels_the_providers_set():
    g6 = node_type("g6.4xlarge")
    g2 = node_type("g2-standard-12")
    assert selector_picks(g6, {"node.kubernetes.io/instance-type": "g6.4xlarge"}) is True
    assert selector_picks(g6, {"karpenter.k8s.aws/instance-gpu-name": "l4"}) is True
    assert selector_picks(g6, {"cloud.google.com/gke-accelerator": "nvidia-l4"}) is False
    assert selector_picks(g2, {"cloud.google.com/gke-accelerator": "nvidia-l4"}) is True
    assert selector_picks(g2, {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}) is False
    assert selector_picks(g6, {"eks.amazonaws.com/nodegroup": "gpus"}) is None  # its name is yours
    assert selector_notes({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})  # GPU Feature Discovery only
    assert selector_notes({"node.kubernetes.io/instance-type": "g6.4xlarge"}) == []


@pytest.mark.parametrize("path", CLUSTER_SWEEPS, ids=lambda p: p.name)
def test_no_example_selects_a_label_only_the_gpu_operator_sets(path):
    spec = load_spec(path)
    assert selector_notes(spec.cluster.node_selector) == []


# -- the walk-through's machine types ---------------------------------------------------------------

def _walkthrough_rows() -> dict[str, tuple[str, str, str]]:
    """example file -> (cloud, machine type, the other cloud's machine type), from the table in
    docs/kubernetes-walkthrough.md."""
    rows = {}
    row = re.compile(r"^\s*\| `(?P<file>[\w-]+\.yaml)` \| (?P<cloud>GKE|EKS) \| `(?P<type>[\w.-]+)` \|"
                     r".*\| (?:GKE|EKS) `(?P<other>[\w.-]+)` \|$")
    for line in DOCS.read_text().splitlines():
        if m := row.match(line):
            rows[m["file"]] = (m["cloud"], m["type"], m["other"])
    return rows


def test_the_walkthrough_names_a_machine_type_for_every_example():
    assert sorted(_walkthrough_rows()) == sorted(p.name for p in CLUSTER_SWEEPS)


@pytest.mark.parametrize("path", CLUSTER_SWEEPS, ids=lambda p: p.name)
def test_every_example_fits_the_machine_type_its_walkthrough_creates(path):
    cloud, machine, other = _walkthrough_rows()[path.name]
    spec = load_spec(path)
    objects = render(spec)
    request = pod_request(rollout(objects)["spec"]["template"]["spec"])
    node = node_type(machine)
    assert node.provider == cloud
    assert selector_picks(node, spec.cluster.node_selector) is True, spec.cluster.node_selector
    # The walk-through's disks: eksctl's 80 GiB root volume, GKE's 100 GB boot disk (thicket.k8s.node_disk).
    disk = {"EKS": 80, "GKE": 100}
    assert fit(request, node, node_fit.weights_gib(spec.policy.model), disk[cloud]).fits, (machine, request.text())
    # The other cloud's type, which the example's comment names for its node_selector.
    other_node = node_type(other)
    assert fit(request, other_node, node_fit.weights_gib(spec.policy.model), disk[other_node.provider]).fits
    assert f"node.kubernetes.io/instance-type: {other}" in path.read_text()
    report = node_fit.report(spec, objects)
    assert report is not None and not report.warnings, report.warnings if report else None
    assert any(f.node.name == machine and f.fits for f in report.selected)


# -- loading the model -----------------------------------------------------------------------------

def test_64_pods_reading_16_gb_from_bursting_efs_miss_the_start_up_window():
    spec = spec_with(parallelism=64, model_cache={"claim": "m", "size": "200Gi", "storage_class": "efs-sc"})
    spec = parse_spec({**spec.model_dump(), "tasks": {"env": "textcraft", "start": 0, "stop": 640, "per_index": 10}})
    (estimate,) = load_estimates(spec)
    assert estimate.pods == 64 and estimate.too_slow  # ~15 GiB x 64 at 100 MiB/s: ~2.7 h
    fast = spec_with(parallelism=64, model_cache={"claim": "m", "size": "2560Gi", "storage_class": "premium-rwx"})
    fast = parse_spec({**fast.model_dump(), "tasks": {"env": "textcraft", "start": 0, "stop": 640, "per_index": 10}})
    (estimate,) = load_estimates(fast)
    assert estimate.storage.read_mib_s == 1200 and not estimate.too_slow
    # A claim made beforehand: its class is unknown, so the slow modes it may have are shown.
    assert {e.storage.name.split(",")[0].split(" (")[0] for e in load_estimates(spec_with())} == {
        "EFS", "Filestore Basic HDD"}
    assert load_estimates(spec_with(model_cache={"claim": None})) == []  # each pod downloads itself


# -- validate --------------------------------------------------------------------------------------

def test_validate_prints_the_pods_request_and_the_machine_types_it_fits(cli):
    code, out, err = cli("validate", str(ROOT / "sweeps/cluster/sciworld-dense.yaml"))
    assert code == 0, err
    assert "pod     5.5 CPU, 33.25 GiB, 1 GPU" in out
    fits = next(line for line in out.splitlines() if line.startswith("fits    GKE:"))
    assert "g2-standard-12" in fits and "g2-standard-8" not in fits
    assert "g2-standard-8 (memory)" in out
    assert "node_selector picks g2-standard-12 (1 pod a node)" in out
    assert "warning" not in err


def test_validate_warns_of_a_pod_no_selected_node_holds_and_of_a_slow_model_load(cli, tmp_path):
    data = yaml.safe_load((ROOT / "sweeps/cluster/sciworld-dense.yaml").read_text())
    old = copy.deepcopy(data)
    old["cluster"]["node_selector"] = {"node.kubernetes.io/instance-type": "g2-standard-8"}
    old["cluster"]["parallelism"] = 24
    old["cluster"]["model_cache"] = {"claim": "thicket-models", "size": "1Ti", "storage_class": "standard-rwx"}
    old["tasks"]["stop"] = 2400
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    code, out, err = cli("validate", str(path))
    assert code == 0, err
    assert "fits none of the nodes cluster.node_selector picks (g2-standard-8: memory)" in err
    assert "warning: model load: 24 pods" in err and "Filestore Basic HDD" in err
    gfd = copy.deepcopy(data)
    gfd["cluster"]["node_selector"] = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    path.write_text(yaml.safe_dump(gfd))
    code, out, err = cli("validate", str(path))
    assert code == 0 and "set only by NVIDIA GPU Feature Discovery" in err


def test_a_node_group_selector_is_named_as_unchecked():
    spec = spec_with(node_selector={"eks.amazonaws.com/nodegroup": "gpus"})
    report = node_fit.report(spec, render(spec))
    assert any("cannot check" in line for line in report.lines)
    assert not [w for w in report.warnings if not w.startswith("policy.revision")]  # BASE pins no revision
