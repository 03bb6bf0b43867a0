"""Does a sweep's rollout pod fit the GPU nodes it asks for, and can the model cache feed them all
at once? `thicket validate` prints both (docs/kubernetes.md, "From an empty cluster to a dataset").

**The pod's request** is computed from the rendered pod as the scheduler does with native sidecars
(KEP-753, Kubernetes docs "Sidecar containers", "Resource sharing within containers"): for each
resource, max(the largest init container that is not a sidecar plus the sidecars started before it,
the sum of every sidecar and every main container). Pod overhead (RuntimeClass) is not counted.

**A node's allocatable** resources are what the scheduler places pods against:
capacity - kube-reserved - system-reserved - the hard eviction threshold. The table below holds
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

Two more deductions, both estimates and said so in `validate`'s output:

- The kernel and firmware keep part of the nominal memory before the kubelet counts its capacity.
  No provider documents how much; Karpenter budgets 7.5% (its `VM_MEMORY_OVERHEAD_PERCENT`
  default, "Karpenter settings"), and that figure is used here for both clouds.
- DaemonSets run on every node (CNI, kube-proxy, CSI drivers, the NVIDIA device plugin, logging):
  DAEMONSET_CPU and DAEMONSET_MEMORY_GIB are kept free for them. `kubectl describe node` shows
  the real figures ("Allocated resources").

**Loading the model**: every pod's vLLM reads the weights from the shared model cache when it
starts, `cluster.parallelism` pods at once. `load_seconds` divides parallelism x the weights' size
by the storage's documented read throughput (STORAGE below: EFS throughput modes, "Amazon EFS
performance specifications"; Filestore tiers, "Service tiers") and `validate` warns when that is
more than the start-up window (`probes.vllm_startup_s`): those pods would fail with exit 3, be
retried, and read the same weights again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from thicket.k8s.values import parse_quantity

Obj = dict[str, Any]
GiB = 2**30
MiB = 2**20

GKE = "GKE"
EKS = "EKS"

OS_MEMORY_OVERHEAD = 0.075  # Karpenter's VM_MEMORY_OVERHEAD_PERCENT default
DAEMONSET_CPU = 0.5  # estimate: kube-proxy, CNI, CSI node plugins, device plugin, logging agent
DAEMONSET_MEMORY_GIB = 1.0
EVICTION_MIB = 100

# Labels: who sets which (docs/kubernetes.md, "Selecting the GPU nodes").
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
    raise KeyError(f"{name!r} is not in thicket.k8s.node_fit.NODE_TYPES")


# --- the pod's request ------------------------------------------------------------------------

RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


@dataclass(frozen=True)
class PodRequest:
    cpu: float
    memory_gib: float
    gpus: int
    containers: tuple[tuple[str, Obj], ...] = field(default=())  # (name, requests) as rendered

    def text(self) -> str:
        gpus = f", {self.gpus} GPU{'s' if self.gpus != 1 else ''}" if self.gpus else ", no GPU"
        return f"{_number(self.cpu)} CPU, {_number(self.memory_gib)} GiB{gpus}"


def _number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _requests(container: Obj) -> dict[str, Decimal]:
    res = container.get("resources") or {}
    requests = dict(res.get("limits") or {})  # a limit with no request: the request defaults to it
    requests.update(res.get("requests") or {})
    return {k: parse_quantity(v) for k, v in requests.items() if k in RESOURCES}


def pod_request(pod: Obj) -> PodRequest:
    """The pod's effective request, as the scheduler computes it with native sidecars."""
    totals: dict[str, Decimal] = {}
    for resource in RESOURCES:
        sidecars = Decimal(0)
        init_peak = Decimal(0)
        for container in pod.get("initContainers") or []:
            value = _requests(container).get(resource, Decimal(0))
            if container.get("restartPolicy") == "Always":
                sidecars += value
            else:
                init_peak = max(init_peak, sidecars + value)
        main = sum((_requests(c).get(resource, Decimal(0)) for c in pod.get("containers") or []), Decimal(0))
        totals[resource] = max(init_peak, sidecars + main)
    names = tuple((c["name"], (c.get("resources") or {}).get("requests") or {})
                  for c in (pod.get("initContainers") or []) + (pod.get("containers") or []))
    return PodRequest(float(totals["cpu"]), float(totals["memory"]) / GiB, int(totals["nvidia.com/gpu"]), names)


def rollout_pod(objects: list[Obj]) -> Obj | None:
    """The rollout Job's pod spec among rendered objects (the Indexed Job)."""
    for obj in objects:
        if obj.get("kind") == "Job" and obj["spec"].get("completionMode") == "Indexed":
            return obj["spec"]["template"]["spec"]
    return None


# --- fitting ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    node: NodeType
    pods: int  # rollout pods one node holds (0: none)
    short: str  # what is short when pods == 0: "memory", "CPU", "GPUs", "GPU memory"

    @property
    def fits(self) -> bool:
        return self.pods > 0


def weights_gib(model: str) -> float | None:
    """The model's weights, from its name (thicket.k8s.vllm_memory); None when the name says no size."""
    from thicket.k8s.vllm_memory import bytes_per_parameter, parameters_b

    billions = parameters_b(model)
    return None if billions is None else billions * 1e9 * bytes_per_parameter(model) / GiB


def fit(request: PodRequest, node: NodeType, model_gib: float | None = None) -> Fit:
    cpu = node.allocatable_cpu - DAEMONSET_CPU
    memory = node.allocatable_memory_gib - DAEMONSET_MEMORY_GIB
    counts = {"CPU": math.floor(cpu / request.cpu + 1e-9) if request.cpu else 10**6,
              "memory": math.floor(memory / request.memory_gib + 1e-9) if request.memory_gib else 10**6}
    if request.gpus:
        counts["GPUs"] = node.gpus // request.gpus
        # The weights must fit in the GPUs' memory with room for the KV cache (vLLM's default
        # --gpu-memory-utilization is 0.9; a quarter of that kept for the cache and activations).
        if model_gib is not None and model_gib > 0.9 * 0.75 * node.gpu.memory_gib * request.gpus:
            counts["GPU memory"] = 0
    short = min(counts, key=lambda k: counts[k])
    pods = max(0, counts[short])
    return Fit(node, pods, "" if pods else short)


def selector_picks(node: NodeType, selector: dict[str, str]) -> bool | None:
    """Whether a node of this type carries the selector's labels: True, False, or None when the
    selector uses a label thicket cannot know (a node group's name, your own labels)."""
    labels = node.labels()
    unknown = False
    for key, value in selector.items():
        if key in labels:
            if labels[key] != value:
                return False
        elif key.startswith("cloud.google.com/") and node.provider == EKS:
            return False
        elif key.startswith(("eks.amazonaws.com/", "karpenter.k8s.aws/")) and node.provider == GKE:
            return False
        elif key == GKE_ACCELERATOR or key == KARPENTER_GPU_NAME:
            return False  # a GPU node of that provider always has it: the value differs
        else:
            unknown = True
    return None if unknown else True


def selector_notes(selector: dict[str, str]) -> list[str]:
    """Labels in a node selector that plain GPU nodes lack."""
    notes = []
    if GFD_PRODUCT in selector:
        notes.append(f"cluster.node_selector: {GFD_PRODUCT} is set only by NVIDIA GPU Feature Discovery (the GPU "
                     "Operator); GKE GPU pools, EKS accelerated AMIs and Karpenter nodes without it never match, so "
                     f"the pods stay Pending. Use {INSTANCE_TYPE} (every node), {GKE_ACCELERATOR} (GKE), "
                     f"{KARPENTER_GPU_NAME} (Karpenter) or {EKS_NODEGROUP} (EKS managed node groups)")
    return notes


def fits(request: PodRequest, model_gib: float | None = None) -> list[Fit]:
    return [fit(request, node, model_gib) for node in NODE_TYPES]


# --- loading the model from the shared cache --------------------------------------------------


@dataclass(frozen=True)
class Storage:
    name: str
    read_mib_s: float  # what the file system serves to all clients together
    per_client_mib_s: float | None  # one pod's ceiling
    note: str


# Documented read throughput. EFS: "Amazon EFS performance specifications" (throughput modes,
# per-client limits); Filestore: "Service tiers" (Basic HDD 1-10 TiB, Basic SSD, Zonal per TiB).
STORAGE: dict[str, Storage] = {
    "efs-bursting": Storage("EFS, bursting throughput (a file system under 1 TiB)", 100, 500,
                            "burst credits: 100 MiB/s while they last, then 50 MiB/s per TiB stored"),
    "efs-elastic": Storage("EFS, elastic throughput", 3 * 1024, 1500,
                           "20-60 GiB/s reads per file system by Region (3 GiB/s assumed); 1,500 MiB/s per client"),
    "filestore-basic-hdd": Storage("Filestore Basic HDD (1-10 TiB), class standard-rwx", 100, None,
                                   "180 MiB/s from 10 TiB"),
    "filestore-basic-ssd": Storage("Filestore Basic SSD (2.5 TiB and up), class premium-rwx", 1200, None, ""),
    "filestore-zonal": Storage("Filestore Zonal, 1 TiB (260 MiB/s per TiB), class zonal-rwx", 260, None,
                               "260 MiB/s per TiB provisioned, 1-9.75 TiB"),
}
# The storage classes the docs name, and the slowest mode each may be.
CLASS_STORAGE = {
    "efs-sc": "efs-bursting",  # the EFS CSI driver's class; the file system's mode is set on the file system
    "standard-rwx": "filestore-basic-hdd",
    "premium-rwx": "filestore-basic-ssd",
    "zonal-rwx": "filestore-zonal",
}


VLLM_START_S = 180  # estimate: what vLLM spends besides reading (CUDA context, torch.compile, CUDA graphs)


def load_seconds(pods: int, model_gib: float, storage: Storage) -> float:
    """Seconds for `pods` vLLMs to read `model_gib` each from `storage` at once (they share its
    throughput, each at most the per-client ceiling), plus VLLM_START_S."""
    rate = min(storage.read_mib_s / max(pods, 1), storage.per_client_mib_s or math.inf)
    return model_gib * 1024 / rate + VLLM_START_S


@dataclass(frozen=True)
class LoadEstimate:
    storage: Storage
    pods: int
    model_gib: float
    seconds: float
    window_s: int

    @property
    def too_slow(self) -> bool:
        return self.seconds > self.window_s

    def text(self) -> str:
        return (f"{self.pods} pods x {_number(self.model_gib)} GiB = {_number(self.pods * self.model_gib)} GiB "
                f"from {self.storage.name} at {_number(self.storage.read_mib_s)} MiB/s: "
                f"~{self.seconds:.0f} s with vLLM's own start, start-up window {self.window_s} s")


def load_estimates(spec: Any) -> list[LoadEstimate]:
    """The model-loading estimate for the spec's cache: its storage class when it names one the
    table knows, else the slow modes a claim made beforehand may have (EFS bursting, Filestore
    Basic HDD). Empty when the pods do not load from a shared claim or the name gives no size."""
    from thicket.k8s.containers import pod_model
    from thicket.k8s.names import index_count, serves_vllm

    c = spec.cluster
    if not serves_vllm(spec) or not c.model_cache.claim:
        return []
    model_gib = weights_gib(pod_model(spec))
    if model_gib is None:
        return []
    pods = min(c.parallelism, index_count(spec))
    known = CLASS_STORAGE.get(c.model_cache.storage_class or "")
    keys = [known] if known else ["efs-bursting", "filestore-basic-hdd"]
    window = c.probes.vllm_startup_s
    return [LoadEstimate(STORAGE[k], pods, model_gib, load_seconds(pods, model_gib, STORAGE[k]), window) for k in keys]


# --- what validate prints ---------------------------------------------------------------------


@dataclass
class FitReport:
    request: PodRequest
    fits: list[Fit]
    selected: list[Fit]  # the node types the selector picks (or may pick)
    lines: list[str]
    warnings: list[str]


def report(spec: Any, objects: list[Obj]) -> FitReport | None:
    pod = rollout_pod(objects)
    if pod is None:
        return None
    from thicket.k8s.containers import pod_model
    from thicket.k8s.names import serves_vllm

    request = pod_request(pod)
    model_gib = weights_gib(pod_model(spec)) if serves_vllm(spec) else None
    every = fits(request, model_gib)
    selector = spec.cluster.node_selector
    lines = [f"pod     {request.text()} requested (max of the largest init container and sidecars + worker)"]
    warnings = list(selector_notes(selector))
    selected: list[Fit] = []
    if request.gpus:
        for provider in (GKE, EKS):
            names = [f"{f.node.name} ({f.pods})" if f.pods > 1 else f.node.name
                     for f in every if f.fits and f.node.provider == provider]
            lines.append(f"fits    {provider}: {', '.join(names) or 'none of ' + _table_names(provider)}")
        small = [f"{f.node.name} ({f.short})" for f in every if not f.fits]
        if small:
            lines.append(f"        too small: {', '.join(small)}")
        picked = [(f, selector_picks(f.node, selector)) for f in every]
        selected = [f for f, picks in picked if picks]
        if selector and any(picks is None for _, picks in picked):
            lines.append(f"nodes   node_selector {selector} uses a label thicket cannot check (a node group's name, "
                         "your own): make sure those nodes are of a type the pod fits")
        elif selector:
            if not selected:
                warnings.append(f"cluster.node_selector {selector} matches none of the GPU node types thicket knows "
                                f"({_table_names(None)}): check the label's value")
            elif not any(f.fits for f in selected):
                warnings.append(f"the pod ({request.text()}) fits none of the nodes cluster.node_selector picks "
                                f"({', '.join(f'{f.node.name}: {f.short}' for f in selected)}): it would stay "
                                "Pending and the autoscaler would add nothing")
            else:
                lines.append("nodes   node_selector picks " + ", ".join(
                    f"{f.node.name} ({f.pods} pod{'s' if f.pods != 1 else ''} a node)" if f.fits
                    else f"{f.node.name} (too small: {f.short})" for f in selected))
        lines.append(f"        (allocatable after the providers' reservations, {OS_MEMORY_OVERHEAD:.1%} of memory for "
                     f"the kernel, {_number(DAEMONSET_CPU)} CPU and {_number(DAEMONSET_MEMORY_GIB)} GiB for DaemonSets)")
    for estimate in load_estimates(spec):
        lines.append(f"load    {estimate.text()}")
        if estimate.too_slow:
            warnings.append(f"model load: {estimate.text()}: pods would fail their start-up window and retry. Use a "
                            "faster cache (EFS elastic or provisioned throughput, Filestore Basic SSD or Zonal), lower "
                            "cluster.parallelism, or raise cluster.probes.vllm_startup_s")
    return FitReport(request, every, selected, lines, warnings)


def _table_names(provider: str | None) -> str:
    return ", ".join(n.name for n in NODE_TYPES if provider in (None, n.provider))
