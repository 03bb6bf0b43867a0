"""Does a sweep's rollout pod fit the GPU nodes it asks for, and can the model cache feed them all
at once? `thicket validate` prints both (docs/kubernetes-walkthrough.md).

**The pod's request** is computed from the rendered pod as the scheduler does with native sidecars
(KEP-753, Kubernetes docs "Sidecar containers", "Resource sharing within containers"): for each
resource, max(the largest init container that is not a sidecar plus the sidecars started before it,
the sum of every sidecar and every main container). Pod overhead (RuntimeClass) is not counted.

**A node's allocatable** resources, per machine type, come from thicket.k8s.machine_types. One more
deduction, an estimate and said so in `validate`'s output:

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

from thicket.cluster_spec.values import parse_quantity
from thicket.k8s import node_disk
from thicket.k8s.spot_grace import grace_warnings
from thicket.k8s.machine_types import (
    EKS,
    EKS_NODEGROUP,
    GFD_PRODUCT,
    GKE,
    GKE_ACCELERATOR,
    INSTANCE_TYPE,
    KARPENTER_GPU_NAME,
    NODE_TYPES,
    OS_MEMORY_OVERHEAD,
    NodeType,
)
from thicket.k8s.pod_packing import packing_lines

Obj = dict[str, Any]
GiB = 2**30
MiB = 2**20

DAEMONSET_CPU = 0.5  # estimate: kube-proxy, CNI, CSI node plugins, device plugin, logging agent
DAEMONSET_MEMORY_GIB = 1.0


# --- the pod's request ------------------------------------------------------------------------

RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage")


@dataclass(frozen=True)
class PodRequest:
    cpu: float
    memory_gib: float
    gpus: int
    containers: tuple[tuple[str, Obj], ...] = field(default=())  # (name, requests) as rendered
    ephemeral_gib: float = 0.0  # local disk: emptyDirs and logs (thicket.k8s.node_disk)

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
    return PodRequest(float(totals["cpu"]), float(totals["memory"]) / GiB, int(totals["nvidia.com/gpu"]), names,
                      float(totals["ephemeral-storage"]) / GiB)


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
    short: str  # what is short when pods == 0: "memory", "CPU", "GPUs", "GPU memory", "disk"
    disk_gib: float = 0.0  # the node's disk assumed (cluster.node_disk_gib, else the provider's default)
    without_disk: int = 0  # pods it would hold on a disk large enough (CPU, memory and GPUs alone)

    @property
    def fits(self) -> bool:
        return self.pods > 0


def weights_gib(model: str) -> float | None:
    """The model's weights, from its name (thicket.k8s.vllm_memory); None when the name says no size."""
    from thicket.k8s.vllm_memory import bytes_per_parameter, parameters_b

    billions = parameters_b(model)
    return None if billions is None else billions * 1e9 * bytes_per_parameter(model) / GiB


def fit(request: PodRequest, node: NodeType, model_gib: float | None = None, disk_gib: float | None = None) -> Fit:
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
    without_disk = max(0, min(counts.values()))
    disk = disk_gib or node_disk.DEFAULT_DISK[node.provider].gib
    counts["disk"] = node_disk.pods_on_disk(node.provider, disk, request.ephemeral_gib)
    short = min(counts, key=lambda k: counts[k])
    pods = max(0, counts[short])
    return Fit(node, pods, "" if pods else short, disk, without_disk)


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


def fits(request: PodRequest, model_gib: float | None = None, disk_gib: float | None = None) -> list[Fit]:
    return [fit(request, node, model_gib, disk_gib) for node in NODE_TYPES]


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


def spec_fits(spec: Any, pod: Obj) -> tuple[PodRequest, list[Fit]]:
    """The rollout pod's request and its fit on every GPU node type, with the spec's model and disk."""
    from thicket.k8s.containers import pod_model
    from thicket.k8s.names import serves_vllm

    request = pod_request(pod)
    model_gib = weights_gib(pod_model(spec)) if serves_vllm(spec) else None
    return request, fits(request, model_gib, spec.cluster.node_disk_gib)


def report(spec: Any, objects: list[Obj]) -> FitReport | None:
    pod = rollout_pod(objects)
    if pod is None:
        return None
    request, every = spec_fits(spec, pod)
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
        lines += disk_lines(request, every, spec.cluster.node_disk_gib)
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
                warnings += disk_warnings(request, selected)
                lines.append("nodes   node_selector picks " + ", ".join(
                    f"{f.node.name} ({f.pods} pod{'s' if f.pods != 1 else ''} a node)" if f.fits
                    else f"{f.node.name} (too small: {f.short})" for f in selected))
                lines += [f"        {line}" for line in packing_lines(request, selected)]  # thicket.k8s.pod_packing
        lines.append(f"        (allocatable after the providers' reservations, {OS_MEMORY_OVERHEAD:.1%} of memory for "
                     f"the kernel, {_number(DAEMONSET_CPU)} CPU and {_number(DAEMONSET_MEMORY_GIB)} GiB for DaemonSets)")
    warnings += grace_warnings(spec)  # Spot nodes: the provider's grace, not the pod's
    from thicket.k8s.prefetch import revision_warnings

    warnings += revision_warnings(spec)
    for estimate in load_estimates(spec):
        lines.append(f"load    {estimate.text()}")
        if estimate.too_slow:
            warnings.append(f"model load: {estimate.text()}: pods would fail their start-up window and retry. Use a "
                            "faster cache (EFS elastic or provisioned throughput, Filestore Basic SSD or Zonal), lower "
                            "cluster.parallelism, or raise cluster.probes.vllm_startup_s")
    return FitReport(request, every, selected, lines, warnings)


def disk_lines(request: PodRequest, every: list[Fit], disk_gib: int | None) -> list[str]:
    """The node disk assumed, and the disk each machine type needs for the pods its CPU, memory and
    GPUs hold (thicket.k8s.node_disk)."""
    if not request.ephemeral_gib:
        return []
    assumed = []
    for provider in (GKE, EKS):
        disk = disk_gib or node_disk.DEFAULT_DISK[provider].gib
        allocatable = node_disk.allocatable_gib(provider, disk)
        pods = node_disk.pods_on_disk(provider, disk, request.ephemeral_gib)
        assumed.append(f"{provider} {disk} GiB ({_number(allocatable)} GiB allocatable: {_pods(pods)})")
    source = "cluster.node_disk_gib" if disk_gib else "the providers' defaults; set cluster.node_disk_gib"
    needs = [_disk_needed(f, request.ephemeral_gib) for f in every if f.without_disk]
    return [f"disk    {_number(request.ephemeral_gib)} GiB of ephemeral storage a pod; node disk {', '.join(assumed)} "
            f"({source})",
            f"        node disk for the pods a node holds: {', '.join(needs)}"]


def _pods(count: int) -> str:
    return f"{count} pod{'s' if count != 1 else ''}"


def _disk_needed(f: Fit, pod_gib: float) -> str:
    disk = node_disk.disk_needed_gib(f.node.provider, f.without_disk * pod_gib)
    return f"{f.node.name} {disk} GiB" + (f" ({f.without_disk} pods)" if f.without_disk > 1 else "")


def disk_warnings(request: PodRequest, selected: list[Fit]) -> list[str]:
    """The selected nodes' disk holds fewer pods than their CPU, memory and GPUs would."""
    short = [f for f in selected if f.fits and f.pods < f.without_disk]
    if not short:
        return []
    each = ", ".join(f"{f.node.name} with {_number(f.disk_gib)} GiB holds {f.pods} pod(s) of "
                     f"{_number(request.ephemeral_gib)} GiB ephemeral storage, its GPUs {f.without_disk}" for f in short)
    return [f"node disk: {each}: give the nodes a larger boot disk, local SSD or instance store (docs/kubernetes-walkthrough.md, step 1, \"The node's disk\") "
            "and set cluster.node_disk_gib, or the autoscaler buys more nodes (or the pods wait)"]


def _table_names(provider: str | None) -> str:
    return ", ".join(n.name for n in NODE_TYPES if provider in (None, n.provider))
