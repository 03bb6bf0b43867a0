"""The spec's `cluster` section: how a sweep runs as Kubernetes Indexed Jobs.

Every name that becomes a Kubernetes object name or label is checked here, so a bad
value fails `thicket validate` with one line naming the field, not the API server later.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from thicket.version import __version__
from thicket.cluster_spec.aggregate import AggregateSpec
from thicket.cluster_spec.base import ClusterModel
from thicket.cluster_spec.container_env import ContainerEnv
from thicket.cluster_spec.ephemeral_storage import EphemeralStorage
from thicket.cluster_spec.model_cache import ModelCache
from thicket.cluster_spec.placement import NodeSelector, QueueName, Toleration, checked_labels
from thicket.cluster_spec.image_pull import PullPolicy, pull_policy
from thicket.cluster_spec.resources import ContainerResources, Resources
from thicket.cluster_spec.sidecars import (
    JAVA_FAMILIES,
    JVM_BASE_MIB,
    JVM_INSTANCE_MIB,
    JVM_INSTANCES,
    JVM_MAX_MIB,
    EnvSidecar,
)
from thicket.cluster_spec.values import dns_label, dns_subdomain, image_reference, parse_quantity
from thicket.vllm_server import logprobs_mode_problem

REGISTRY = "ghcr.io/thicket"
VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"  # pinned: the GPU build the worker is tested against

# Flags thicket sets on the vLLM command line itself (they must agree with the pod's wiring).
MANAGED_VLLM_FLAGS = ("--model", "--served-model-name", "--host", "--port")


class Images(ClusterModel):
    worker: str = Field(f"{REGISTRY}/thicket:{__version__}", description="thicket worker (and aggregation) image")
    env: str = Field(f"{REGISTRY}/thicket-env:{__version__}", description="env sidecar image")
    env_java: str = Field(f"{REGISTRY}/thicket-env-java:{__version__}", description="env sidecar with Java 17 (ScienceWorld)")
    vllm: str = Field(VLLM_IMAGE, description="vLLM OpenAI server, pinned by tag or digest")
    prefetch: str = Field(f"{REGISTRY}/thicket-prefetch:{__version__}",
                          description="the prefetch Job's image: huggingface_hub's `hf` alone, for CPU nodes")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="default: by how each image is pinned (thicket.cluster_spec.image_pull: a digest or "
                          "release tag IfNotPresent, another tag Always)")

    def policy_for(self, image: str) -> str:
        """The imagePullPolicy of `image` (thicket.cluster_spec.image_pull)."""
        return pull_policy(image, PullPolicy(self.pull_policy) if self.pull_policy else None).value

    @field_validator("worker", "env", "env_java", "vllm", "prefetch")
    @classmethod
    def pinned(cls, value: str, info) -> str:  # noqa: ANN001
        return image_reference(value, info.field_name)


class Probes(ClusterModel):
    vllm_startup_s: int = Field(1800, ge=10, description="how long vLLM may take to load its model")
    env_startup_s: int = Field(300, ge=2, description="how long an env sidecar may take to start")
    period_s: int = Field(10, ge=1, le=300, description="readiness probe period")
    timeout_s: int = Field(5, ge=1, le=120, description="per probe request")
    readiness_failures: int = Field(3, ge=1, le=100, description="failed probes before a container is unready")
    liveness_failures: int = Field(6, ge=1, le=100, description="failed probes, after the start-up window, "
                                   "before the kubelet restarts a server")


class ClusterSpec(ClusterModel):
    namespace: str = Field("thicket", description="namespace of every object of the sweep")
    images: Images = Field(default_factory=Images)
    image_pull_secrets: list[str] = Field(default_factory=list)
    parallelism: int = Field(4, ge=1, le=100_000, description="pods running at once")
    gpus: int = Field(1, ge=0, le=64, description="nvidia.com/gpu per pod (vLLM container)")
    model: str | None = Field(None, description="what vLLM loads (HF id or a path in the model cache); default policy.model")
    vllm_args: list[str] = Field(default_factory=list, description="extra vLLM server flags; prefix caching is always on")
    vllm_port: int = Field(8000, ge=1024, le=65535)
    metrics_port: int = Field(9090, ge=1024, le=65535, description="the worker's Prometheus /metrics (port name metrics)")
    shm_size: str = Field("16Gi", description="size of the /dev/shm emptyDir (medium Memory)")
    model_cache: ModelCache = Field(default_factory=ModelCache, description="where the pods' vLLM finds its model")
    hf_token_secret: str | None = Field(None, description="Secret with key HF_TOKEN (gated models)")
    s3_secret: str | None = Field("thicket-s3", description="Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (+ optional AWS_ENDPOINT_URL, AWS_DEFAULT_REGION)")
    node_selector: NodeSelector = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    priority_class_name: str | None = None
    queue: QueueName = Field(None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name)")
    resources: ContainerResources = Field(default_factory=ContainerResources)
    backoff_limit_per_index: int = Field(
        1, ge=0, le=1000, description="retries of one index before it fails (exits 2 and 3 fail it at once); "
        "each retry of a fault every attempt meets burns the pod's GPUs again (thicket.k8s.fault_price)"
    )
    max_failed_indexes: int | None = Field(
        None, ge=0, description="the Job fails (no new pods) once more indexes than this fail; at most the "
        "number of indexes (default: max_failed_share of them)"
    )
    max_failed_share: float = Field(
        0.05, gt=0, le=1, description="default max_failed_indexes: this share of the indexes, at least 1"
    )
    start_allowance_s: int = Field(
        900, ge=60, description="time a pod may take from its start to its worker's start (image pulls, volume "
        "mounts, Secrets): part of the pod's activeDeadlineSeconds"
    )
    active_deadline_s: int | None = Field(
        None, ge=60, description="the rollout pod's activeDeadlineSeconds (default: derived, see "
        "thicket.k8s.deadlines); must exceed the worker's own deadlines"
    )
    ephemeral_storage: EphemeralStorage = Field(default_factory=EphemeralStorage)
    node_disk_gib: int | None = Field(
        None, ge=10, description="the GPU nodes' boot / root disk in GiB, for the node fit `thicket validate` "
        "prints (default: the provider's, GKE 100 GB, EKS node groups and Karpenter 20 GiB; thicket.k8s.node_disk)"
    )
    ttl_seconds_after_finished: int | None = Field(7 * 86400, ge=0, description="finished Jobs are deleted after this")
    probes: Probes = Field(default_factory=Probes)
    wait_ready_timeout_s: int | None = Field(
        None, ge=1, description="the worker's deadline for vLLM and the env sidecars to answer; the pod fails "
        "(exit 3, retried per index) when it passes (default: probes.vllm_startup_s, or env_startup_s "
        "without vLLM)"
    )
    service_account: str | None = Field(
        None, description="ServiceAccount of the rollout and aggregation pods, for workload identity (IRSA on "
        "EKS, Workload Identity on GKE) instead of static keys; the rollout pods still mount no API "
        "token (the clouds' identity webhooks add their own)"
    )
    env: ContainerEnv = Field(default_factory=ContainerEnv, description="extra environment variables per container")
    network_policy: bool = Field(False, description="render a NetworkPolicy: only the metrics port is reachable")
    pod_monitor: bool = Field(False, description="render a Prometheus Operator PodMonitor for the metrics port")
    pod_monitor_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"},
        description="labels of the PodMonitor, which the Prometheus' podMonitorSelector must match "
        "(kube-prometheus-stack selects release: <its release name> by default)",
    )
    envs: list[EnvSidecar] | None = Field(
        None, description="env sidecars; null: one for tasks.env on port 8100 (none when tasks.env_server "
        "is in_process or remote); []: none"
    )
    run_as_user: int = Field(1000, ge=1, description="non-root uid of every container")
    aggregate: AggregateSpec = Field(default_factory=AggregateSpec)

    @field_validator("namespace")
    @classmethod
    def namespace_label(cls, value: str) -> str:
        return dns_label(value, "namespace")

    @model_validator(mode="before")
    @classmethod
    def moved_fields(cls, data: Any) -> Any:
        moved = {"model_cache_pvc": "claim", "model_cache_path": "path", "hf_home": "hf_home"}
        for old, new in moved.items():
            if isinstance(data, dict) and old in data:
                raise ValueError(f"{old} is now model_cache.{new}")
        return data

    @field_validator("hf_token_secret", "s3_secret", "priority_class_name", "service_account")
    @classmethod
    def object_name(cls, value: str | None) -> str | None:
        return value if value is None else dns_subdomain(value)

    @field_validator("image_pull_secrets")
    @classmethod
    def secret_names(cls, value: list[str]) -> list[str]:
        for name in value:
            dns_subdomain(name, "Secret name")
        if len(set(value)) != len(value):
            raise ValueError("names must be unique")
        return value

    @field_validator("pod_monitor_labels")
    @classmethod
    def monitor_labels(cls, value: dict[str, str]) -> dict[str, str]:
        return checked_labels(value)

    @field_validator("shm_size")
    @classmethod
    def shm_quantity(cls, value: str) -> str:
        parse_quantity(value)
        return value

    @field_validator("vllm_args")
    @classmethod
    def prefix_caching_on(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.split("=", 1)[0]
            if flag == "--no-enable-prefix-caching":
                raise ValueError("prefix caching is always on: remove --no-enable-prefix-caching")
            if flag in MANAGED_VLLM_FLAGS:
                raise ValueError(f"{flag} is set by thicket (use cluster.model / cluster.vllm_port)")
            if flag == "--revision":  # the prefetch would download one revision and vLLM load another
                raise ValueError("--revision is set by thicket from policy.revision (the revision the prefetch "
                                 "downloads and vLLM loads): set policy.revision instead")
        if problem := logprobs_mode_problem(value):
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def ports_distinct(self) -> ClusterSpec:
        env_ports = [e.port for e in self.envs or []]  # the default sidecar's is checked with the pod (thicket.k8s.rules)
        ports = [self.vllm_port, self.metrics_port, *env_ports]
        if len(set(ports)) != len(ports):
            raise ValueError(f"ports must differ: vllm_port {self.vllm_port}, metrics_port {self.metrics_port}, "
                             f"env ports {env_ports}")
        if self.envs:
            families = [e.family for e in self.envs]
            if len(set(families)) != len(families):
                raise ValueError(f"one sidecar per env family, got {families}")
        if self.model_cache.claim and self.model_cache.access_mode == "ReadWriteOnce" and self.parallelism > 1:
            raise ValueError(f"model_cache.access_mode ReadWriteOnce attaches the claim to one node, but "
                             f"parallelism {self.parallelism} pods may run on several (they would wait on a "
                             "Multi-Attach error): use ReadWriteMany (EFS on EKS, Filestore on GKE), or claim null")
        return self

    def sidecars(self, tasks: Any) -> list[EnvSidecar]:
        """The env sidecars of a pod. By default one for tasks.env, unless the spec's
        tasks.env_server runs envs in process or at a remote server. A JVM family's sidecar holds
        JVM_INSTANCES live instances unless tasks.env_server.max_instances says otherwise: its
        memory is sized from that number (env_memory)."""
        if self.envs is not None:
            return list(self.envs)
        server = tasks.env_server
        if server.mode != "sidecar":
            return []
        instances = server.max_instances
        if tasks.env in JAVA_FAMILIES and "max_instances" not in server.model_fields_set:
            instances = JVM_INSTANCES
        args = ["--max-instances", str(instances), "--idle-timeout", f"{server.idle_timeout_s:g}"]
        return [EnvSidecar(family=tasks.env, args=args)]

    def serve_env_args(self, sidecar: EnvSidecar) -> list[str]:
        """`thicket serve-env`'s arguments after the family, host and port."""
        if sidecar.family in JAVA_FAMILIES and not any(a.startswith("--max-instances") for a in sidecar.args):
            return [*sidecar.args, "--max-instances", str(sidecar.max_instances())]
        return list(sidecar.args)

    def env_resources(self, sidecar: EnvSidecar) -> Resources:
        """The sidecar's own resources, else resources.env, with memory raised to what its
        instances need (a JVM family: JVM_INSTANCE_MIB for each)."""
        if sidecar.resources is not None:
            return sidecar.resources
        base = self.resources.env
        if sidecar.family not in JAVA_FAMILIES:
            return base
        mib = JVM_BASE_MIB + JVM_INSTANCE_MIB * sidecar.max_instances()
        if mib > JVM_MAX_MIB:
            raise ValueError(f"{sidecar.max_instances()} live {sidecar.family} instances need about {mib // 1024}Gi "
                             f"(~{JVM_INSTANCE_MIB}Mi of JVM each): lower tasks.env_server.max_instances")
        memory = f"{mib}Mi"
        return Resources(requests={**base.requests, "memory": memory}, limits={**base.limits, "memory": memory})

    def sidecar_image(self, sidecar: EnvSidecar) -> str:
        if sidecar.image:
            return sidecar.image
        return self.images.env_java if sidecar.family in JAVA_FAMILIES else self.images.env
