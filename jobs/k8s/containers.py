"""The containers of a sweep's pods, as plain dicts: the vLLM and env-server sidecars, the worker,
and what they share (resources, security context, probes, env, S3 credentials from the Secret)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from thicket.cluster_spec.resources import Resources
from thicket.cluster_spec.sidecars import EnvSidecar
from thicket.cluster_spec.values import parse_quantity
from thicket.errors import BadInput
from thicket.k8s.names import (
    LOCALHOST,
    METRICS_PORT_NAME,
    SPEC_DIR,
    SPEC_KEY,
    VLLM,
    VLLM_COMMAND,
    WORKER,
    k8s_name,
    served_model_name,
    serves_vllm,
)
from thicket.k8s.vllm_memory import parameters_b, vllm_memory
from thicket.logs import FORMAT_VARIABLE as LOG_FORMAT_VARIABLE
from thicket.spec import SweepSpec
from thicket.vllm_server import COMMON_ARGS, LOGPROBS_ARGS, without_logprobs_mode

Obj = dict[str, Any]


LOG_ALLOWANCE = "1Gi"  # a container's logs, which count against its ephemeral-storage limit


def _mib(quantity: str) -> str:
    """A quantity as whole Mi (for sums of emptyDir sizes and the log allowance)."""
    return f"{math.ceil(parse_quantity(quantity) / 2**20)}Mi"


def ephemeral(*sizes: str) -> str:
    """A container's ephemeral-storage: the emptyDirs it writes (their sizeLimits) and its logs."""
    return _mib(str(sum(parse_quantity(size) for size in (*sizes, LOG_ALLOWANCE))))


def _resources(res: Resources, gpus: int = 0, storage: str | None = None) -> Obj:
    """The container's resources; `storage`: its ephemeral-storage request and limit (unless
    cluster.resources sets them)."""
    out: Obj = {}
    limits = dict(res.limits)
    requests = dict(res.requests)
    if storage is not None and "ephemeral-storage" not in limits and "ephemeral-storage" not in requests:
        requests["ephemeral-storage"] = limits["ephemeral-storage"] = storage
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
        requests["nvidia.com/gpu"] = str(gpus)
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _security(read_only: bool) -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only,
        "runAsNonRoot": True,
    }


def _pod_security(spec: SweepSpec) -> Obj:
    uid = spec.cluster.run_as_user
    return {
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of a large model cache
        "runAsGroup": uid,
        "runAsNonRoot": True,
        "runAsUser": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# The servers listen on 127.0.0.1 only, which the kubelet's httpGet probes (sent to the pod IP)
# cannot reach: their probes run this in the container instead (exit 0 on a 2xx answer).
PROBE_SCRIPT = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))"

# The liveness probe with a startup probe's window built in: alive while this container (its
# process 1, whose start /proc gives) is younger than WINDOW and has not answered yet; once it has
# answered (a mark in DIR, named by that start, so a restarted container starts over), alive only
# while it answers. Tight after the start, and after every restart, with no initialDelaySeconds.
LIVENESS_SCRIPT = (
    "import os, sys, urllib.request\n"
    "url, timeout, window, folder = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]\n"
    "ticks = os.sysconf('SC_CLK_TCK')\n"
    "start = int(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])\n"
    "age = float(open('/proc/uptime').read().split()[0]) - start / ticks\n"
    "mark = os.path.join(folder, '.thicket-answered-%d' % start)\n"
    "try:\n"
    "    urllib.request.urlopen(url, timeout=timeout)\n"
    "except Exception:\n"
    "    sys.exit(0 if age < window and not os.path.exists(mark) else 1)\n"
    "open(mark, 'a').close()\n"
)


def _exec_probe(command: list[str], period: int, timeout: int, failures: int) -> Obj:
    return {
        "exec": {"command": command},
        "periodSeconds": period,
        "timeoutSeconds": timeout + 1,
        "failureThreshold": failures,
    }


def _probes(spec: SweepSpec, url: str, startup_s: int) -> Obj:
    """Readiness, and a liveness probe that waits out the start-up window only until the server
    first answers (LIVENESS_SCRIPT). No startupProbe: a native sidecar's startup probe holds the
    next containers, the worker included, back until it succeeds, and with them the worker's
    deadline for the servers' start (--wait-ready-timeout): a server that never starts would be
    restarted at each window's end until the pod's activeDeadlineSeconds, instead of failing the
    pod after one window with the worker's reason (exit 3)."""
    p = spec.cluster.probes
    ready = ["python3", "-c", PROBE_SCRIPT, url, str(p.timeout_s)]
    alive = ["python3", "-c", LIVENESS_SCRIPT, url, str(p.timeout_s), str(startup_s), "/tmp"]
    return {
        "readinessProbe": _exec_probe(ready, p.period_s, p.timeout_s, p.readiness_failures),
        "livenessProbe": _exec_probe(alive, p.period_s, p.timeout_s, p.liveness_failures),
    }


def _env(name: str, value: str) -> Obj:
    return {"name": name, "value": value}


def _user_env(spec: SweepSpec, container: str) -> list[Obj]:
    """cluster.env's variables for this container (names thicket sets are refused by the spec)."""
    return [_env(name, value) for name, value in sorted(spec.cluster.env.for_container(container).items())]


def _secret_env(name: str, secret: str, key: str, optional: bool = False) -> Obj:
    ref: Obj = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def s3_env(spec: SweepSpec) -> list[Obj]:
    """S3 credentials from the cluster.s3_secret Secret, under the names the storage spec reads."""
    secret = spec.cluster.s3_secret
    if secret is None:
        return []
    storage = spec.storage

    return [
        _secret_env(storage.access_key_id_env or "AWS_ACCESS_KEY_ID", secret, "AWS_ACCESS_KEY_ID"),
        _secret_env(storage.secret_access_key_env or "AWS_SECRET_ACCESS_KEY", secret, "AWS_SECRET_ACCESS_KEY"),
        _secret_env(storage.session_token_env or "AWS_SESSION_TOKEN", secret, "AWS_SESSION_TOKEN", optional=True),
        _secret_env("AWS_ENDPOINT_URL", secret, "AWS_ENDPOINT_URL", optional=True),
        _secret_env("AWS_DEFAULT_REGION", secret, "AWS_DEFAULT_REGION", optional=True),
    ]


def _env_var_suffix(family: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in family).upper()


def _sidecar_container_name(family: str) -> str:
    return k8s_name("env-" + "".join(c if c.isalnum() else "-" for c in family.lower()).strip("-"))


def _env_resources(spec: SweepSpec, sidecar: EnvSidecar) -> Resources:
    try:
        return spec.cluster.env_resources(sidecar)
    except ValueError as err:
        raise BadInput(f"cluster.resources.env: {err}") from None


def _env_sidecar(spec: SweepSpec, sidecar: EnvSidecar) -> Obj:
    c = spec.cluster
    name = _sidecar_container_name(sidecar.family)
    return {
        "name": name,
        "image": c.sidecar_image(sidecar),
        "imagePullPolicy": c.images.policy_for(c.sidecar_image(sidecar)),
        "restartPolicy": "Always",  # a native sidecar: started before the worker, stopped after it
        "command": ["thicket"],
        # Reachable from inside the pod only: the env server runs untrusted actions (CodeAct code).
        "args": ["serve-env", sidecar.family, "--host", LOCALHOST, "--port", str(sidecar.port),
                 *c.serve_env_args(sidecar)],
        "env": [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1"), *_user_env(spec, "env")],
        **_probes(spec, f"http://{LOCALHOST}:{sidecar.port}/ready", c.probes.env_startup_s),
        "resources": _resources(_env_resources(spec, sidecar), storage=ephemeral(c.ephemeral_storage.env)),
        "securityContext": _security(read_only=True),
        "volumeMounts": [{"name": f"tmp-{name}", "mountPath": "/tmp"}],
    }


def pod_model(spec: SweepSpec) -> str:
    """What the pod's vLLM loads: a hub id, or an absolute path inside the model cache mount. A path
    on this machine (relative, or absolute elsewhere) would be taken for a hub id in the pod."""
    c = spec.cluster
    model = c.model or spec.policy.model or ""
    field = "cluster.model" if c.model else "policy.model (cluster.model unset)"
    cache = c.model_cache.path.rstrip("/") + "/"
    if model.startswith("/"):
        if not model.startswith(cache):
            raise BadInput(f"{field}: {model!r} is outside the model cache ({c.model_cache.path}), which is all "
                           "the pod's vLLM can see; use a hub id or a path under cluster.model_cache.path")
    elif model.startswith(("./", "../", "~")) or Path(model).is_dir():
        raise BadInput(f"{field}: {model!r} is a folder on this machine, which a pod cannot see; set cluster.model "
                       f"to a hub id, or copy the folder into the model cache and name it there "
                       f"(e.g. {cache}{Path(model).name})")
    return model


def vllm_args(spec: SweepSpec) -> list[str]:
    c = spec.cluster
    args = [
        "--model", pod_model(spec),
        "--served-model-name", served_model_name(spec),
        "--host", LOCALHOST,  # the worker only: nothing outside the pod may use the GPU server
        "--port", str(c.vllm_port),
        *COMMON_ARGS,  # as `thicket run` starts vLLM: prefix caching, cached_tokens in usage
        *LOGPROBS_ARGS,  # the logprobs the rows store: of the distribution each token was sampled from
    ]
    extra = [a for a in without_logprobs_mode(c.vllm_args) if a not in COMMON_ARGS]
    flags = {a.split("=", 1)[0] for a in extra}
    if revision := model_revision(spec):
        args += ["--revision", revision]  # what the prefetch downloaded (thicket.k8s.prefetch)
    if c.gpus > 1 and not flags & {"--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp"}:
        args += ["--tensor-parallel-size", str(c.gpus)]
    return args + extra


# vLLM's image has no user for the pod's uid (torch and vLLM call getpwuid unless USER is set)
# and writes caches under $HOME: every cache goes to the /tmp emptyDir, so the root filesystem
# stays read-only.
VLLM_WRITABLE_ENV = {
    "HOME": "/tmp",
    "USER": "thicket",
    "LOGNAME": "thicket",
    "XDG_CACHE_HOME": "/tmp/.cache",
    "XDG_CONFIG_HOME": "/tmp/.config",
    "VLLM_CACHE_ROOT": "/tmp/.cache/vllm",
    "VLLM_CONFIG_ROOT": "/tmp/.config/vllm",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/.cache/torchinductor",
    "TRITON_CACHE_DIR": "/tmp/.cache/triton",
    "NUMBA_CACHE_DIR": "/tmp/.cache/numba",
}


VLLM_BASE_CPU = 4  # the API server and engine core processes, and a GPU worker's
VLLM_CPU_PER_EXTRA_GPU = 2  # one physical core (2 vCPUs) more for each further GPU worker process


def vllm_default_cpu(gpus: int) -> int:
    """vLLM's CPU request by default: 4, and 2 more per GPU past the first. vLLM runs one API server,
    one engine core and one worker process per GPU, each busy on its own core
    (https://docs.vllm.ai/en/latest/design/arch_overview/); Kubernetes counts vCPUs (hyperthreads)."""
    return VLLM_BASE_CPU + VLLM_CPU_PER_EXTRA_GPU * max(0, gpus - 1)


def vllm_resources(spec: SweepSpec) -> Resources:
    """resources.vllm (default: vllm_default_cpu CPUs), with the memory the model needs
    (thicket.k8s.vllm_memory) as request and limit wherever it sets none."""
    c = spec.cluster
    if "vllm" not in c.resources.model_fields_set:
        requests, limits = {"cpu": str(vllm_default_cpu(c.gpus))}, {}
    else:
        requests, limits = dict(c.resources.vllm.requests), dict(c.resources.vllm.limits)
    if "memory" not in requests and "memory" not in limits:
        memory = vllm_memory(pod_model(spec), c.gpus).quantity
        requests["memory"] = limits["memory"] = memory
    return Resources(requests=requests, limits=limits)


def _vllm_container(spec: SweepSpec) -> Obj:
    c = spec.cluster
    env = [
        _env("HF_HOME", c.model_cache.hf_home),
        *(_env(name, value) for name, value in VLLM_WRITABLE_ENV.items()),
        _env("VLLM_NO_USAGE_STATS", "1"),
        _env("DO_NOT_TRACK", "1"),
    ]
    if c.model_cache.prefetches(pod_model(spec)) and "HF_HUB_OFFLINE" not in c.env.vllm:
        env.append(_env("HF_HUB_OFFLINE", "1"))  # the prefetch Job filled the cache: no pod asks the hub
    if c.hf_token_secret and downloads_model(spec):
        env.append(_secret_env("HF_TOKEN", c.hf_token_secret, "HF_TOKEN"))  # only where vLLM asks the hub
    storage = [c.ephemeral_storage.vllm] + ([] if c.model_cache.claim else [model_cache_size(spec)])
    return {
        "name": VLLM,
        "image": c.images.vllm,
        "imagePullPolicy": c.images.policy_for(c.images.vllm),
        "restartPolicy": "Always",
        "command": VLLM_COMMAND,
        "args": vllm_args(spec),
        "env": env + _user_env(spec, "vllm"),
        # /health answers 200 once the model is loaded, with or without --api-key.
        **_probes(spec, f"http://{LOCALHOST}:{c.vllm_port}/health", c.probes.vllm_startup_s),
        "resources": _resources(vllm_resources(spec), c.gpus, storage=ephemeral(*storage)),
        "securityContext": _security(read_only=True),
        "volumeMounts": [
            {"name": "model-cache", "mountPath": c.model_cache.path},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp-vllm", "mountPath": "/tmp"},
        ],
    }


def model_revision(spec: SweepSpec) -> str | None:
    """policy.revision, for a hub model (a path in the cache has no revision)."""
    return None if pod_model(spec).startswith("/") else spec.policy.revision


def downloads_model(spec: SweepSpec) -> bool:
    """Whether the pod's vLLM fetches its model from the hub itself: a hub id that no prefetch Job
    put into the cache (with a prefetch, vLLM runs with HF_HUB_OFFLINE=1; a path in the cache needs
    no hub). Only then does it get HF_TOKEN."""
    model = pod_model(spec)
    return not model.startswith("/") and not spec.cluster.model_cache.prefetches(model)


def model_cache_size(spec: SweepSpec) -> str:
    """The per-pod model emptyDir's sizeLimit (model_cache.claim null): ephemeral_storage.model_cache,
    else 3 bytes a parameter (bf16 weights and the hub's download copies) + 4Gi, else 100Gi."""
    c = spec.cluster
    if c.ephemeral_storage.model_cache:
        return c.ephemeral_storage.model_cache
    billions = parameters_b(pod_model(spec))
    return "100Gi" if billions is None else f"{math.ceil(billions * 3 * 1e9 / 2**30) + 4}Gi"


def wait_ready_timeout(spec: SweepSpec, sidecars: list[EnvSidecar]) -> int:
    """How long the worker waits for its servers before the pod fails (exit 3): the start-up
    window of the slowest server it waits for."""
    c = spec.cluster
    if c.wait_ready_timeout_s is not None:
        return c.wait_ready_timeout_s
    windows = [c.probes.vllm_startup_s] if serves_vllm(spec) else []
    windows += [c.probes.env_startup_s] if sidecars else []
    return max(windows, default=c.probes.env_startup_s)


def _worker_container(spec: SweepSpec, sidecars: list[EnvSidecar]) -> Obj:
    c = spec.cluster
    waits: list[str] = []
    env = [_env("HOME", "/tmp"), _env("PYTHONUNBUFFERED", "1"), _env(LOG_FORMAT_VARIABLE, "json")]
    if serves_vllm(spec):
        waits += ["--wait-for", f"http://{LOCALHOST}:{c.vllm_port}/health"]
    if sidecars:
        # The worker's envs come from the sidecar serving tasks.env (thicket.rollout.envs).
        main = next((s for s in sidecars if s.family == spec.tasks.env), sidecars[0])
        env.append(_env("THICKET_ENV_URL", f"http://{LOCALHOST}:{main.port}"))
    for sidecar in sidecars:
        url = f"http://{LOCALHOST}:{sidecar.port}"
        waits += ["--wait-for", f"{url}/ready"]
        env.append(_env(f"THICKET_ENV_URL_{_env_var_suffix(sidecar.family)}", url))
    return {
        "name": WORKER,
        "image": c.images.worker,
        "imagePullPolicy": c.images.policy_for(c.images.worker),
        "command": ["thicket"],
        # The index comes from $JOB_COMPLETION_INDEX, which the Job controller sets in every pod
        # (a resumed Job adds THICKET_INDEX_MAP: thicket.rollout.completion_index).
        "args": ["worker", f"{SPEC_DIR}/{SPEC_KEY}", "--wait-ready-timeout", str(wait_ready_timeout(spec, sidecars)),
                 "--metrics-port", str(c.metrics_port), *waits],
        "env": env + s3_env(spec) + _user_env(spec, "worker"),
        # The last lines of a failed worker's log become the pod's termination message (thicket status).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": c.metrics_port, "protocol": "TCP"}],
        "resources": _resources(c.resources.worker, storage=ephemeral(c.ephemeral_storage.worker)),
        "securityContext": _security(read_only=True),
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _common_pod(spec: SweepSpec, node_selector: dict, tolerations: list) -> Obj:
    c = spec.cluster
    pod: Obj = {"restartPolicy": "Never", "enableServiceLinks": False}
    if c.priority_class_name:
        pod["priorityClassName"] = c.priority_class_name
    if node_selector:
        pod["nodeSelector"] = dict(sorted(node_selector.items()))
    if tolerations:
        pod["tolerations"] = [t.manifest() for t in tolerations]
    if c.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in c.image_pull_secrets]
    pod["securityContext"] = _pod_security(spec)
    return pod
