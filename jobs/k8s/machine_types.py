"""GPU machine types of GKE and EKS, the labels their nodes carry, and the resources the scheduler
sees on them (thicket.k8s.node_fit fits the rollout pod to them).

**A node's allocatable** resources are what the scheduler places pods against:
capacity - kube-reserved - system-reserved - the hard eviction threshold. NODE_TYPES holds
real machine types with their nominal vCPUs, memory and GPUs; allocatable is computed from the
providers' documented reservations:

- GKE ("Plan GKE Standard node sizes", section "Memory and CPU reservations"; "About GPUs in GKE"):
  memory: 25% of the first 4 GiB, 20% of the next 4 GiB, 10% of the next 8 GiB, 6% of the next
  112 GiB, 2% of anything above 128 GiB, plus a 100 MiB eviction threshold; CPU: 6% of the first
  core, 1% of the next, 0.5% of the next 2, 0.25% of every core above 4.
- EKS, AL2023 and Bottlerocket AMIs ("Amazon EKS optimized AMIs": nodeadm's / the bootstrap
  script's kube-reserved; "Choose an optimal Amazon EC2 node instance type": max pods from
  eni-max-pods.txt): memory 255 MiB + 11 MiB x max pods, CPU the same ladder as GKE, and a 100 Mi
  hard eviction threshold (memory.available<100Mi).

The kernel and firmware keep part of the nominal memory before the kubelet counts its capacity.
No provider documents how much; Karpenter budgets 7.5% (its `VM_MEMORY_OVERHEAD_PERCENT` default,
"Karpenter settings"), and that figure is used here for both clouds: an estimate, and `validate`
says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GKE = "GKE"
EKS = "EKS"

OS_MEMORY_OVERHEAD = 0.075  # Karpenter's VM_MEMORY_OVERHEAD_PERCENT default
EVICTION_MIB = 100

# Labels: who sets which (docs/kubernetes-walkthrough.md, step 1, "Selecting the GPU nodes").
INSTANCE_TYPE = "node.kubernetes.io/instance-type"  # the kubelet / cloud provider, on every node
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"  # GKE, on every GPU node pool
EKS_NODEGROUP = "eks.amazonaws.com/nodegroup"  # EKS managed node groups (the group's name)
KARPENTER_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"  # Karpenter on AWS
KARPENTER_FAMILY = "karpenter.k8s.aws/instance-family"
GFD_PRODUCT = "nvidia.com/gpu.product"  # NVIDIA GPU Feature Discovery only (the GPU Operator)


@dataclass(frozen=True)
class Gpu:
    name: str  # as people say it
    memory_gib: int
    gke_accelerator: str | None  # the value of cloud.google.com/gke-accelerator
    karpenter_name: str | None  # the value of karpenter.k8s.aws/instance-gpu-name


L4 = Gpu("L4", 24, "nvidia-l4", "l4")
A10G = Gpu("A10G", 24, None, "a10g")
A100_40 = Gpu("A100 40GB", 40, "nvidia-tesla-a100", "a100")
A100_80 = Gpu("A100 80GB", 80, "nvidia-a100-80gb", "a100")
H100 = Gpu("H100 80GB", 80, "nvidia-h100-80gb", "h100")


@dataclass(frozen=True)
class NodeType:
    provider: str
    name: str  # the machine type, node.kubernetes.io/instance-type
    vcpus: int
    memory_gib: float  # nominal (GCE's "GB" are GiB; EC2's are GiB)
    gpu: Gpu
    gpus: int
    max_pods: int = 110  # EKS: eni-max-pods.txt (VPC CNI without prefix delegation); GKE: 110
    note: str = ""

    def labels(self) -> dict[str, str]:
        labels = {INSTANCE_TYPE: self.name}
        if self.provider == GKE and self.gpu.gke_accelerator:
            labels[GKE_ACCELERATOR] = self.gpu.gke_accelerator
        if self.provider == EKS:
            labels[KARPENTER_FAMILY] = self.name.split(".", 1)[0]
            if self.gpu.karpenter_name:
                labels[KARPENTER_GPU_NAME] = self.gpu.karpenter_name
        return labels

    @property
    def allocatable_cpu(self) -> float:
        return self.vcpus - cpu_reserved(self.vcpus)

    @property
    def allocatable_memory_gib(self) -> float:
        capacity = self.memory_gib * (1 - OS_MEMORY_OVERHEAD)
        reserved = gke_memory_reserved_gib(capacity) if self.provider == GKE else eks_memory_reserved_gib(self.max_pods)
        return capacity - reserved - EVICTION_MIB / 1024


def cpu_reserved(cores: float) -> float:
    """GKE's and the EKS AMIs' kube-reserved CPU: 6% of the first core, 1% of the second, 0.5% of
    the next two, 0.25% of the rest."""
    ladder = ((1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025))
    return _ladder(cores, ladder)


def gke_memory_reserved_gib(gib: float) -> float:
    """GKE's kube-reserved memory (the eviction threshold is apart)."""
    return _ladder(gib, ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (math.inf, 0.02)))


def eks_memory_reserved_gib(max_pods: int) -> float:
    """The EKS AMIs' kube-reserved memory: 255 MiB + 11 MiB per pod the node may hold."""
    return (255 + 11 * max_pods) / 1024


def _ladder(amount: float, steps: tuple[tuple[float, float], ...]) -> float:
    total, left = 0.0, amount
    for size, share in steps:
        part = min(left, size)
        total += part * share
        left -= part
        if left <= 0:
            break
    return total


NODE_TYPES: tuple[NodeType, ...] = (
    # GKE: G2 (L4), A2 (A100), A3 High (H100). Compute Engine "Accelerator-optimized machine family".
    NodeType(GKE, "g2-standard-4", 4, 16, L4, 1),
    NodeType(GKE, "g2-standard-8", 8, 32, L4, 1),
    NodeType(GKE, "g2-standard-12", 12, 48, L4, 1),
    NodeType(GKE, "g2-standard-16", 16, 64, L4, 1),
    NodeType(GKE, "g2-standard-24", 24, 96, L4, 2),
    NodeType(GKE, "g2-standard-32", 32, 128, L4, 1),
    NodeType(GKE, "a2-highgpu-1g", 12, 85, A100_40, 1),
    NodeType(GKE, "a2-ultragpu-1g", 12, 170, A100_80, 1),
    NodeType(GKE, "a3-highgpu-1g", 26, 234, H100, 1, note="Spot or flex-start only"),
    NodeType(GKE, "a3-highgpu-8g", 208, 1872, H100, 8),
    # EKS: G5 (A10G), G6 (L4), P4d (A100), P5 (H100). EC2 "Accelerated computing instances".
    NodeType(EKS, "g5.xlarge", 4, 16, A10G, 1, max_pods=58),
    NodeType(EKS, "g5.2xlarge", 8, 32, A10G, 1, max_pods=58),
    NodeType(EKS, "g5.4xlarge", 16, 64, A10G, 1, max_pods=234),
    NodeType(EKS, "g5.8xlarge", 32, 128, A10G, 1, max_pods=234),
    NodeType(EKS, "g6.xlarge", 4, 16, L4, 1, max_pods=58),
    NodeType(EKS, "g6.2xlarge", 8, 32, L4, 1, max_pods=58),
    NodeType(EKS, "g6.4xlarge", 16, 64, L4, 1, max_pods=234),
    NodeType(EKS, "p4d.24xlarge", 96, 1152, A100_40, 8, max_pods=737),
    NodeType(EKS, "p5.48xlarge", 192, 2048, H100, 8, max_pods=100),
)


def node_type(name: str) -> NodeType:
    for node in NODE_TYPES:
        if node.name == name:
            return node
    raise KeyError(f"{name!r} is not in thicket.k8s.machine_types.NODE_TYPES")
