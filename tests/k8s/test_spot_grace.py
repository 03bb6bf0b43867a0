"""`thicket validate` warns when the rollout pods run on Spot / preemptible nodes whose provider gives
a preempted pod less time than run.checkpoint.grace_s (thicket.k8s.spot_grace)."""

from __future__ import annotations

import copy

from tests.support.manifests import BASE, spec_with
from thicket.k8s.node_fit import report
from thicket.k8s.render import render
from thicket.k8s.spot_grace import grace_warnings
from thicket.spec import parse_spec

GKE_L4 = {"cloud.google.com/gke-accelerator": "nvidia-l4"}


def _spec(grace_s: int = 60, **cluster):
    data = copy.deepcopy(BASE)
    data["cluster"] = cluster
    data.setdefault("run", {})["checkpoint"] = {"grace_s": grace_s}
    return parse_spec(data, "s.yaml")


def test_gke_spot_gives_pods_15_s_whatever_the_spec_asks():
    """GKE docs, "Spot VMs": 30 s from the preemption notice to the VM's end, the first 15 s for
    non-system pods; a larger terminationGracePeriodSeconds has no effect. The spec's default
    grace_s is 60 s: 45 s of saving that never happens."""
    spot = _spec(node_selector={**GKE_L4, "cloud.google.com/gke-spot": "true"})
    (warning,) = grace_warnings(spot)
    assert warning.startswith("run.checkpoint.grace_s 60 s is more than a Spot pod gets: GKE gives pods on Spot")
    assert "at most 15 s" in warning and "run.checkpoint.grace_s <= 15" in warning
    # Validate prints it among the node-fit warnings.
    assert warning in report(spot, render(spot)).warnings
    # A toleration of the Spot taint says the same; preemptible VMs too.
    tolerated = _spec(tolerations=[{"key": "cloud.google.com/gke-spot", "operator": "Exists", "effect": "NoSchedule"}])
    assert len(grace_warnings(tolerated)) == 1
    assert len(grace_warnings(_spec(node_selector={"cloud.google.com/gke-preemptible": "true"}))) == 1
    # Within 15 s, or on on-demand nodes: nothing to say.
    assert grace_warnings(_spec(15, node_selector={"cloud.google.com/gke-spot": "true"})) == []
    assert grace_warnings(spec_with(node_selector=GKE_L4)) == []


def test_eks_spot_needs_a_termination_handler_and_grace_below_the_two_minute_notice():
    """EC2, "Spot Instance interruption notices": two minutes; only the AWS Node Termination Handler
    or Karpenter's interruption queue turns the notice into a drain (SIGTERM, then the grace)."""
    for selector in ({"eks.amazonaws.com/capacityType": "SPOT"}, {"karpenter.sh/capacity-type": "spot"}):
        (warning,) = grace_warnings(_spec(node_selector=selector))
        assert "Node Termination Handler" in warning and "settings.interruptionQueue" in warning
        assert "does not fit" not in warning  # 60 s < 120 s
    (long,) = grace_warnings(_spec(150, node_selector={"karpenter.sh/capacity-type": "spot"}))
    assert "run.checkpoint.grace_s 150 s does not fit in the notice: set it below 120" in long
    assert grace_warnings(_spec(node_selector={"karpenter.sh/capacity-type": "on-demand"})) == []
