"""How long a preempted rollout pod really has to save its trees, on Spot / preemptible nodes.

The pod asks `terminationGracePeriodSeconds: run.checkpoint.grace_s` (thicket.k8s.render), but on
reclaimed capacity the provider decides:

- GKE Spot and preemptible VMs ("Spot VMs" and "Preemptible VMs" in GKE's docs): 30 s from the
  preemption notice to the VM's end; the kubelet's graceful node shutdown gives non-system pods
  the first 15 s, system pods the rest. A larger terminationGracePeriodSeconds has no effect.
  GKE 1.35+ Standard node pools may raise the window (up to 120 s).
- EKS Spot (EC2 "Spot Instance interruption notices"): a two-minute notice, which drains nothing
  by itself: the AWS Node Termination Handler, or Karpenter with its interruption queue
  (`settings.interruptionQueue`), cordons and drains the node; without either the pods die with
  the instance, before any SIGTERM.

`thicket validate` warns (`grace_warnings`) when the rollout pods select or tolerate such nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GKE_SPOT = {"cloud.google.com/gke-spot": "true", "cloud.google.com/gke-preemptible": "true"}
EKS_SPOT = {"eks.amazonaws.com/capacityType": "spot", "karpenter.sh/capacity-type": "spot"}


@dataclass(frozen=True)
class SpotGrace:
    provider: str
    grace_s: int  # the most a pod gets after the notice
    fact: str


GKE_GRACE = SpotGrace("GKE", 15, "GKE gives pods on Spot and preemptible nodes at most 15 s after the preemption "
                      "notice (30 s in all, the last 15 for system pods), whatever terminationGracePeriodSeconds "
                      "says (GKE docs, \"Spot VMs\")")
EKS_GRACE = SpotGrace("EKS", 120, "EC2 gives a Spot instance a two-minute interruption notice, and only the AWS Node "
                      "Termination Handler or Karpenter's interruption queue (settings.interruptionQueue) drains the "
                      "node in that time; without one the pods die with the instance, with no SIGTERM (EC2 docs, "
                      "\"Spot Instance interruption notices\")")


def _picks(keys: dict[str, str], selector: dict[str, str], tolerations: list[Any]) -> bool:
    if any(selector.get(key, "").lower() == value for key, value in keys.items()):
        return True
    return any(t.key in keys and (t.operator == "Exists" or (t.value or "").lower() == keys[t.key])
               for t in tolerations)


def spot_grace(selector: dict[str, str], tolerations: list[Any]) -> SpotGrace | None:
    """The provider's grace when the pods select or tolerate its Spot / preemptible nodes."""
    if _picks(GKE_SPOT, selector, tolerations):
        return GKE_GRACE
    if _picks(EKS_SPOT, selector, tolerations):
        return EKS_GRACE
    return None


def grace_warnings(spec: Any) -> list[str]:
    c = spec.cluster
    found = spot_grace(c.node_selector, c.tolerations)
    if found is None:
        return []
    grace = spec.run.checkpoint.grace_s
    if found.provider == "GKE" and grace > found.grace_s:
        return [f"run.checkpoint.grace_s {grace} s is more than a Spot pod gets: {found.fact}. Set "
                f"run.checkpoint.grace_s <= {found.grace_s} (the worker saves its trees within it), or raise the "
                "node pool's graceful-shutdown window (GKE 1.35+ Standard, up to 120 s)"]
    if found.provider == "EKS":
        over = (f"; run.checkpoint.grace_s {grace} s does not fit in the notice: set it below {found.grace_s}"
                if grace >= found.grace_s else "")
        return [f"Spot nodes: {found.fact}. Install one of them, or trees grown since the last checkpoint "
                f"are lost{over}"]
    return []
