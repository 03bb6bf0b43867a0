"""A node's local disk: how much ephemeral storage the scheduler sees on it, and how large a disk a
node needs to hold a number of rollout pods (thicket.k8s.node_fit).

Every container's `ephemeral-storage` request (its emptyDirs' sizeLimits and its logs,
thicket.k8s.containers.ephemeral) is placed against the node's allocatable ephemeral storage:
the capacity of the kubelet's file system (the boot / root disk) - kube-reserved -
system-reserved - the hard eviction threshold (Kubernetes, "Reserve Compute Resources for System
Daemons"; the kubelet's default `nodefs.available<10%`). The disks are the providers' defaults:

- GKE ("Plan GKE Standard node sizes", "Local ephemeral storage reservation"): the boot disk
  defaults to 100 GB (GCE's "GB" are GiB); the eviction threshold is 10% of the file system's
  capacity and the system reservation min(50% of the disk, 6 GiB + 35% of the disk, 100 GiB).
  The page's own example, a 100 GB boot disk: capacity 98831908Ki, allocatable 47060071478
  bytes (43.8 GiB).
- EKS: a managed node group's root volume defaults to 20 GiB (CreateNodegroup `diskSize`), and so
  does Karpenter's EC2NodeClass for AL2023 and Bottlerocket ("NodeClasses", blockDeviceMappings);
  eksctl makes 80 GiB. The AMIs reserve 1Gi (kube-reserved ephemeral-storage) and keep the
  kubelet's 10% eviction threshold.

A disk's file system holds a little less than the disk: the ratio of GKE's example
(98831908Ki on 100 GiB) is used for both clouds, an estimate. Container images live on the same
file system and are not part of any request: a node also needs room for the vLLM image.

The way out of a large boot disk: local SSDs (GKE `--ephemeral-storage-local-ssd`, whose
capacity then backs emptyDirs) or the instance store (EKS: nodeadm's `localStorage: RAID0`,
Karpenter's `instanceStorePolicy: RAID0`; p4d and p5 ship 8 NVMe drives): docs/kubernetes-walkthrough.md,
step 1, "The node's disk".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GKE = "GKE"
EKS = "EKS"

FILE_SYSTEM_SHARE = 98831908 / (100 * 2**20)  # GKE's example: KiB of capacity on a 100 GiB boot disk
EVICTION_SHARE = 0.10  # the kubelet's nodefs.available<10%, on both clouds


@dataclass(frozen=True)
class DiskDefault:
    provider: str
    gib: int
    source: str


DEFAULT_DISK = {
    GKE: DiskDefault(GKE, 100, "GKE's default boot disk"),
    EKS: DiskDefault(EKS, 20, "the EKS node group and Karpenter default root volume"),
}


def file_system_gib(disk_gib: float) -> float:
    return disk_gib * FILE_SYSTEM_SHARE


def reserved_gib(provider: str, disk_gib: float) -> float:
    """kube-reserved + system-reserved ephemeral storage (the eviction threshold apart)."""
    if provider == GKE:
        return min(0.5 * disk_gib, 6 + 0.35 * disk_gib, 100)
    return 1.0


def allocatable_gib(provider: str, disk_gib: float) -> float:
    capacity = file_system_gib(disk_gib)
    return max(0.0, capacity - EVICTION_SHARE * capacity - reserved_gib(provider, disk_gib))


def pods_on_disk(provider: str, disk_gib: float, pod_gib: float) -> int:
    """Rollout pods of `pod_gib` ephemeral storage that a node with this disk holds."""
    if pod_gib <= 0:
        return 10**6
    return math.floor(allocatable_gib(provider, disk_gib) / pod_gib + 1e-9)


def disk_needed_gib(provider: str, need_gib: float) -> int:
    """The smallest disk, in whole 10 GiB, whose allocatable ephemeral storage is `need_gib`."""
    disk = 10
    while allocatable_gib(provider, disk) + 1e-9 < need_gib:
        disk += 10
    return disk
