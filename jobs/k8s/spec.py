"""The spec's `cluster` section: how a sweep runs as Kubernetes Indexed Jobs.

Every name that becomes a Kubernetes object name or label is checked here, so a bad
value fails `thicket validate` with one line naming the field, not the API server later.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from thicket import __version__
from thicket.k8s.container_env import ContainerEnv
from thicket.k8s.model_cache import ModelCache
from thicket.k8s.values import (
    DNS_SUBDOMAIN,
    dns_label,
    dns_subdomain,
    image_reference,
    label_value,
    parse_quantity,
    qualified_name,
)
from thicket.vllm_server import logprobs_mode_problem

REGISTRY = "ghcr.io/thicket"
VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"  # pinned: the GPU build the worker is tested against

# Flags thicket sets on the vLLM command line itself (they must agree with the pod's wiring).
MANAGED_VLLM_FLAGS = ("--model", "--served-model-name", "--host", "--port")


class ClusterModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Images(ClusterModel):
    worker: str = Field(f"{REGISTRY}/thicket:{__version__}", description="thicket worker (and aggregation) image")
    env: str = Field(f"{REGISTRY}/thicket-env:{__version__}", description="env sidecar image")
    env_java: str = Field(f"{REGISTRY}/thicket-env-java:{__version__}", description="env sidecar with Java 17 (ScienceWorld)")
    vllm: str = Field(VLLM_IMAGE, description="vLLM OpenAI server, pinned by tag or digest")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"

    @field_validator("worker", "env", "env_java", "vllm")
    @classmethod
    def pinned(cls, value: str, info) -> str:  # noqa: ANN001
        return image_reference(value, info.field_name)


class Resources(ClusterModel):
    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)

    @field_validator("requests", "limits", mode="before")
    @classmethod
    def quantities(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        out = {}
        for name, amount in value.items():
            if isinstance(amount, bool) or not isinstance(amount, (str, int, float)):
                raise ValueError(f"{name}: expected a quantity like 500m, 2 or 16Gi, got {amount!r}")
            if "gpu" in str(name):
                raise ValueError(f"{name}: set GPUs with cluster.gpus, not in resources")
            if not qualified_name(str(name)):
                raise ValueError(f"{name!r} is not a resource name")
            parse_quantity(amount)
            out[str(name)] = str(amount)
        return out

    @model_validator(mode="after")
    def requests_within_limits(self) -> Resources:
        for name, amount in self.requests.items():
            if name in self.limits and parse_quantity(amount) > parse_quantity(self.limits[name]):
                raise ValueError(f"requests.{name} ({amount}) is above limits.{name} ({self.limits[name]})")
        return self


def _res(cpu: str, memory: str, memory_limit: str | None = None) -> Resources:
    return Resources(requests={"cpu": cpu, "memory": memory}, limits={"memory": memory_limit or memory})


class ContainerResources(ClusterModel):
    vllm: Resources = Field(default_factory=lambda: _res("4", "32Gi"),
                            description="default: 4 CPUs and memory from the model's size (thicket.k8s.vllm_memory)")
    worker: Resources = Field(default_factory=lambda: _res("1", "2Gi", "4Gi"))
    env: Resources = Field(default_factory=lambda: _res("500m", "1Gi", "2Gi"))
    aggregate: Resources = Field(default_factory=lambda: _res("2", "8Gi"))


class Toleration(ClusterModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, alias="tolerationSeconds")

    @model_validator(mode="after")
    def consistent(self) -> Toleration:
        if self.key is not None and not qualified_name(self.key):
            raise ValueError(f"key {self.key!r} is not a valid label key")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator Exists")
        if self.value and not label_value(self.value):
            raise ValueError(f"value {self.value!r} is not a valid label value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self

    def manifest(self) -> dict:
        out: dict = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


class Probes(ClusterModel):
    vllm_startup_s: int = Field(1800, ge=10, description="how long vLLM may take to load its model")
    env_startup_s: int = Field(300, ge=2, description="how long an env sidecar may take to start")
    period_s: int = Field(10, ge=1, le=300, description="readiness probe period")
    timeout_s: int = Field(5, ge=1, le=120, description="per probe request")
    readiness_failures: int = Field(3, ge=1, le=100, description="failed probes before a container is unready")
    liveness_failures: int = Field(6, ge=1, le=100, description="failed probes, after the start-up window, "
                                   "before the kubelet restarts a server")


class EnvSidecar(ClusterModel):
    family: str = Field(description="env family the sidecar serves (`thicket serve-env FAMILY`)")
    port: int = Field(8100, ge=1024, le=65535)
    image: str | None = Field(None, description="default: images.env (images.env_java for ScienceWorld)")
    args: list[str] = Field(default_factory=list, description="extra `thicket serve-env` arguments")
    resources: Resources | None = Field(None, description="default: resources.env")

    @field_validator("family")
    @classmethod
    def known_family(cls, value: str) -> str:
        from thicket.envs import env_names

        if value not in env_names():
            raise ValueError(f"unknown env {value!r}; expected one of {', '.join(env_names())}")
        return value

    @field_validator("image")
    @classmethod
    def pinned(cls, value: str | None) -> str | None:
        return value if value is None else image_reference(value, "env sidecar")

    @field_validator("args")
    @classmethod
    def not_managed(cls, value: list[str]) -> list[str]:
        for arg in value:
            if arg.split("=", 1)[0] in ("--host", "--port"):
                raise ValueError(f"{arg.split('=', 1)[0]} is set by thicket (the server listens on 127.0.0.1; use port)")
        return value

    def max_instances(self) -> int:
        """`--max-instances` in args, else JVM_INSTANCES for a JVM family (rendered into its
        args), else `thicket serve-env`'s default."""
        for flag, value in zip(self.args, self.args[1:]):
            if flag == "--max-instances" and value.isdigit():
                return int(value)
        for arg in self.args:
            if arg.startswith("--max-instances=") and arg.split("=", 1)[1].isdigit():
                return int(arg.split("=", 1)[1])
        if self.family in JAVA_FAMILIES:
            return JVM_INSTANCES
        from thicket.envs.service import ServerConfig

        return ServerConfig.max_instances


def _node_selector(value: dict[str, str]) -> dict[str, str]:
    for key, item in value.items():
        if not qualified_name(key):
            raise ValueError(f"{key!r} is not a valid label key")
        if not label_value(item):
            raise ValueError(f"{key}: {item!r} is not a valid label value")
    return value


def _queue(value: str | None) -> str | None:
    if value is not None and not (label_value(value) and DNS_SUBDOMAIN.match(value)):
        raise ValueError(f"{value!r} is not a valid Kueue queue name (a DNS-1123 name of at most 63 characters)")
    return value


NodeSelector = Annotated[dict[str, str], AfterValidator(_node_selector)]
QueueName = Annotated[str | None, AfterValidator(_queue)]


# Labels that GPU nodes carry (the GPU Operator's node feature discovery, GKE's accelerator pools,
# EKS's accelerated node groups): the aggregation pods stay off nodes that carry any of them.
GPU_NODE_LABELS = ("nvidia.com/gpu.present", "cloud.google.com/gke-accelerator", "k8s.amazonaws.com/accelerator")


def _label_keys(value: list[str]) -> list[str]:
    for key in value:
        if not qualified_name(key):
            raise ValueError(f"{key!r} is not a valid label key")
    return value


class AggregateSpec(ClusterModel):
    enabled: bool = Field(True, description="render the aggregation Jobs")
    node_selector: NodeSelector = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    avoid_node_labels: Annotated[list[str], AfterValidator(_label_keys)] = Field(
        default_factory=lambda: list(GPU_NODE_LABELS),
        description="the aggregation pods avoid nodes carrying any of these labels (a required nodeAffinity, "
        "DoesNotExist): GPU nodes by default; [] to turn it off",
    )
    queue: QueueName = Field(None, description="Kueue LocalQueue for the aggregation Jobs")
    backoff_limit: int = Field(2, ge=0, le=100)
    active_deadline_s: int = Field(
        6 * 3600, ge=60, description="each aggregation pod's deadline (activeDeadlineSeconds): it starts once "
        "the rollout has finished, so this bounds the aggregation's own work only"
    )


class EphemeralStorage(ClusterModel):
    """Local disk of each container: its /tmp emptyDir's sizeLimit, and (with LOG_ALLOWANCE for its
    logs) its ephemeral-storage request and limit. A container past its limit is evicted by the kubelet
    as a limit violation (which the Job counts), before it can fill the node's disk."""

    worker: str = Field("2Gi", description="the worker's /tmp")
    env: str = Field("2Gi", description="each env sidecar's /tmp")
    vllm: str = Field("10Gi", description="vLLM's /tmp: torch.compile, Triton and CUDA-graph caches")
    aggregate: str = Field("20Gi", description="the aggregation's /tmp")
    model_cache: str | None = Field(
        None, description="the per-pod model emptyDir when model_cache.claim is null (default: from the "
        "model's size, 3 bytes a parameter + 4Gi, else 100Gi)"
    )

    @field_validator("worker", "env", "vllm", "aggregate", "model_cache")
    @classmethod
    def quantity(cls, value: str | None) -> str | None:
        if value is not None:
            parse_quantity(value)
        return value


JAVA_FAMILIES = frozenset({"scienceworld", "sciworld"})
JVM_INSTANCES = 32  # a JVM family's sidecar: live instances by default (each holds its own JVM state)
JVM_INSTANCE_MIB = 200  # memory of one ScienceWorld instance (its JVM heap and threads)
JVM_BASE_MIB = 1024  # the sidecar's Python and the JVM itself
JVM_MAX_MIB = 64 * 1024


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
    backoff_limit_per_index: int = Field(3, ge=0, le=1000, description="retries of one index before it fails")
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
        return _node_selector(value)

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
