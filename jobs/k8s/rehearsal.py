"""A sweep's rendered pods, run on this machine with podman: the rehearsal before a cluster.

`thicket rehearse SPEC --index N` renders the sweep as `thicket render` does, runs the rollout
Job's pod for index N with `podman kube play`, waits for its worker, then runs the aggregation
Job's pod the same way, against a local S3 (moto_server in a container). The containers run as
rendered: images, commands, args, env, securityContext (non-root uid, read-only root filesystem,
dropped capabilities), resources, volumes and mounts. What one machine forces is changed by code,
and only that (`MACHINE_CHANGES`, also in docs/kubernetes.md):
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from thicket.errors import BadInput, ExitCode
from thicket.k8s.names import WORKER, names, serves_vllm
from thicket.k8s.podman import LocalS3, ensure_network, podman, require_images, s3_secret, start_s3
from thicket.k8s.render import render, to_yaml
from thicket.spec import SweepSpec, parse_spec

Obj = dict[str, Any]

MACHINE_CHANGES = (
    "the spec: output on the local S3 (s3://BUCKET/sweeps), cluster.images.vllm the local vllm-cpu "
    "image, cluster.gpus 1 and vLLM's CPU flags, cluster.model a folder copied into the model cache "
    "when policy.model is a local folder",
    "no GPU here: the nvidia.com/gpu request and limit are dropped from the pod",
    "the Job's pod template becomes a Pod named <job>-<index>, with JOB_COMPLETION_INDEX set as the "
    "Job controller sets it",
    "native sidecars (init containers with restartPolicy Always) become ordinary containers before "
    "the worker: podman runs init containers to completion; the worker's --wait-for orders the start",
    "annotation values over 63 characters are dropped (podman's limit; Kubernetes allows 256 KiB)",
    "emptyDir volumes and the model-cache PVC become host folders owned by the pod's uid (podman makes "
    "emptyDirs root-owned 0755 and ignores fsGroup)",
    "the S3 Secret becomes a podman secret (podman 4.3 reads secretKeyRef from JSON of base64 values)",
    "the aggregation pod runs without its wait-job init container (no API server here: the rehearsal "
    "starts it once the rollout pod ended)",
    "podman ignores probes and restarts nothing: a sidecar that exits stays down (the kubelet would "
    "restart it), and the worker waits for it until its --wait-ready-timeout as it would on a cluster; "
    "the pod ends when the worker exits (its sidecars are stopped then, as the kubelet does), or at "
    "--timeout",
)
__doc__ += "".join(f"\n- {change}" for change in MACHINE_CHANGES)

REGISTRY = "ghcr.io/thicket"
CPU_VLLM_ARGS = ["--dtype", "float32", "--enforce-eager", "--distributed-executor-backend", "uni",
                 "--no-enable-chunked-prefill"]
POLL_S = 1.0
LOG_TAIL = 30
ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)\b:")


class End(StrEnum):
    """How a pod's run ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed out"


@dataclass(frozen=True)
class Images:
    worker: str
    env: str
    env_java: str
    vllm_cpu: str
    s3: str

    @classmethod
    def local(cls, version: str, registry: str = REGISTRY) -> Images:
        return cls(*(f"{registry}/{name}:{version}" for name in
                     ("thicket", "thicket-env", "thicket-env-java", "thicket-vllm-cpu", "thicket-s3-local")))


@dataclass
class ContainerExit:
    name: str
    exit_code: int | None  # None: still running when the pod was stopped
    log: Path

    def last_words(self) -> str:
        """The log's last exception line (`SomeError: ...`) near its end, else its last line."""
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        tail = lines[-LOG_TAIL:]
        errors = [line for line in tail if ERROR_LINE.match(line)]
        return (errors or tail or ["(no output)"])[-1][:300]


@dataclass
class PodRun:
    pod: str
    main: str
    end: End
    seconds: float
    exits: list[ContainerExit] = field(default_factory=list)
    # port -> whether it answered from outside the pod (tried once the servers answered inside)
    reachable_from_outside: dict[int, bool] = field(default_factory=dict)

    def exit_of(self, name: str) -> ContainerExit:
        return next(e for e in self.exits if e.name == name)

    def reason(self) -> str:
        """One line: how the main container ended and which sidecar, if any, died first."""
        main = self.exit_of(self.main)
        line = f"pod {self.pod} {self.end} after {self.seconds:.0f} s: "
        if main.exit_code is None:
            line += f"{self.main} stopped before it ended"
        else:
            line += f"{self.main} exit {main.exit_code}"
            if main.exit_code:
                line += f" ({main.last_words()})"
        for side in self.died():
            line += f"; {side.name} exited {side.exit_code}: {side.last_words()}"
        return line

    def died(self) -> list[ContainerExit]:
        """Sidecars that exited with an error before the main container ended."""
        return [e for e in self.exits if e.name != self.main and e.exit_code not in (None, 0)]

    def exit_code(self) -> int:
        """The main container's exit code; 4 (a deadline) when it was still running at --timeout."""
        code = self.exit_of(self.main).exit_code
        return int(ExitCode.DEADLINE) if code is None else code


# -- the spec as this machine runs it ----------------------------------------------------------------
def local_spec(spec: SweepSpec, images: Images, s3: LocalS3, cache: Path) -> SweepSpec:
    """The spec with what one machine forces changed (MACHINE_CHANGES, first item)."""
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["output"] = f"s3://{s3.bucket}/sweeps"
    cluster = data.setdefault("cluster", {})
    cluster["images"] = {**cluster.get("images", {}), "worker": images.worker, "env": images.env,
                         "env_java": images.env_java, "vllm": images.vllm_cpu, "pull_policy": "IfNotPresent"}
    cluster["gpus"] = 1
    cluster["vllm_args"] = [*CPU_VLLM_ARGS, *cluster.get("vllm_args", [])]
    model = spec.policy.model
    if spec.policy.kind == "vllm" and spec.policy.url is None and model and Path(model).is_dir():
        target = cache / Path(model).name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(model, target)
        _chown_tree(target, spec.cluster.run_as_user)  # what fsGroup does to a PVC on a cluster
        cluster["model"] = f"{spec.cluster.model_cache.path}/{Path(model).name}"
    return parse_spec(data, "rehearsal spec")


# -- Job -> Pod ------------------------------------------------------------------------------------
def job_pod(job: Obj, pod_name: str, index: int | None, folders: Path, uid: int, cache: Path) -> Obj:
    """The Job's pod template as the Pod podman runs (MACHINE_CHANGES, items 2 to 5)."""
    template = copy.deepcopy(job["spec"]["template"])
    spec = template["spec"]
    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    inits = [c for c in spec.pop("initContainers", []) if c.get("restartPolicy") != "Always"]
    for container in sidecars:
        del container["restartPolicy"]
    for container in [*sidecars, *spec["containers"]]:
        for amounts in (container.get("resources") or {}).values():
            amounts.pop("nvidia.com/gpu", None)
    if inits:
        spec["initContainers"] = inits
    spec["containers"] = [*sidecars, *spec["containers"]]
    if index is not None:
        for container in spec["containers"]:
            container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
    for volume in spec.get("volumes", []):
        if "emptyDir" in volume:
            volume.pop("emptyDir")
            volume["hostPath"] = {"path": str(_owned_folder(folders / pod_name / volume["name"], uid)),
                                  "type": "Directory"}
        elif "persistentVolumeClaim" in volume:
            volume.pop("persistentVolumeClaim")
            volume["hostPath"] = {"path": str(cache.resolve()), "type": "Directory"}
    meta = template.get("metadata", {})
    annotations = {k: v for k, v in meta.get("annotations", {}).items() if len(v) <= 63}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "labels": meta.get("labels", {}), "annotations": annotations},
            "spec": spec}


def _chown_tree(root: Path, uid: int) -> None:
    for folder, _, files in os.walk(root):
        for path in (folder, *(os.path.join(folder, f) for f in files)):
            os.chown(path, uid, uid)


def _owned_folder(path: Path, uid: int) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.chown(path, uid, uid)
    return path.resolve()


# -- running a pod ---------------------------------------------------------------------------------
def run_pod(objects: list[Obj], main: str, network: str, logs: Path, timeout_s: float,
            watch_ports: tuple[int, ...] = ()) -> PodRun:
    """`podman kube play` the objects, wait for the main container, stop the rest, keep every log.
    Once the pod's servers answer inside the pod on `watch_ports`, try each from outside it too."""
    exposure: dict[int, bool] | None = None
    pod = next(o for o in objects if o["kind"] == "Pod")
    name = pod["metadata"]["name"]
    containers = [c["name"] for c in pod["spec"]["containers"]]
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{name}.yaml"
    path.write_text(to_yaml(objects))
    podman("pod", "rm", "--force", "--ignore", name)
    start = time.monotonic()
    podman("kube", "play", "--network", network, str(path))
    end = End.TIMED_OUT
    while time.monotonic() - start < timeout_s:
        codes = _exit_codes(name, containers)
        if codes[main] is not None:
            end = End.SUCCEEDED if codes[main] == 0 else End.FAILED
            break
        if exposure is None and watch_ports and _answers_inside(name, main, watch_ports):
            exposure = _exposure(name, network, watch_ports)
        time.sleep(POLL_S)
    seconds = time.monotonic() - start
    codes = _exit_codes(name, containers)
    exits = [ContainerExit(c, codes[c], _save_log(f"{name}-{c}", logs)) for c in containers]
    podman("pod", "rm", "--force", "--time", "10", name)
    return PodRun(name, main, end, seconds, exits, exposure or {})


def _answers_inside(pod: str, main: str, ports: tuple[int, ...]) -> bool:
    """Every port accepts a connection from inside the pod (from the main container)."""
    script = ("import socket, sys\nfor port in sys.argv[1:]:\n"
              "    socket.create_connection(('127.0.0.1', int(port)), timeout=2).close()")
    done = subprocess.run(["podman", "exec", f"{pod}-{main}", "python3", "-c", script, *map(str, ports)],
                          capture_output=True)
    return done.returncode == 0


def _exposure(pod: str, network: str, ports: tuple[int, ...]) -> dict[int, bool]:
    """Whether each port answers at the pod's address from this machine, outside the pod."""
    address = podman("pod", "inspect", pod, "--format", "{{.InfraContainerID}}").strip()
    address = podman("inspect", address, "--format",
                     f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}').strip()
    reachable = {}
    for port in ports:
        try:
            socket.create_connection((address, port), timeout=2).close()
            reachable[port] = True
        except OSError:
            reachable[port] = False
    return reachable


def _exit_codes(pod: str, containers: list[str]) -> dict[str, int | None]:
    """Each container's exit code, None while it runs."""
    codes: dict[str, int | None] = {}
    for container in containers:
        state = podman("inspect", f"{pod}-{container}", "--format", "{{.State.Status}} {{.State.ExitCode}}").split()
        codes[container] = int(state[1]) if state[0] in ("exited", "stopped") else None
    return codes


def _save_log(container: str, logs: Path) -> Path:
    log = logs / f"{container}.log"
    done = subprocess.run(["podman", "logs", container], capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    return log


# -- the rehearsal -----------------------------------------------------------------------------------
@dataclass
class Rehearsal:
    spec: SweepSpec
    index: int
    images: Images
    workdir: Path
    network: str = "thicket-rehearsal"
    timeout_s: float = 1800
    aggregate: bool = True

    def run(self) -> Iterator[PodRun | LocalS3]:
        require_images([self.images.s3])
        ensure_network(self.network)
        s3 = start_s3(self.images.s3, self.network, bucket="thicket")
        yield s3
        cache = _owned_folder(self.workdir / "model-cache", self.spec.cluster.run_as_user)
        spec = local_spec(self.spec, self.images, s3, cache)
        if spec.cluster.s3_secret:
            s3_secret(spec.cluster.s3_secret, s3)
        objects = render(spec)
        config = next(o for o in objects if o["kind"] == "ConfigMap")
        job_names = names(spec.name)
        rollout = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == job_names["rollout"])
        if not 0 <= self.index < rollout["spec"]["completions"]:
            raise BadInput(f"--index: {self.index} is not an index of this sweep (0-{rollout['spec']['completions'] - 1})")
        uid = spec.cluster.run_as_user
        folders = self.workdir / "volumes"
        pod = job_pod(rollout, f"{job_names['rollout']}-{self.index}", self.index, folders, uid, cache)
        require_images(sorted({c["image"] for c in pod["spec"]["containers"]}))  # what the pod runs, no more
        run = run_pod([config, pod], WORKER, self.network, self.workdir / "logs", self.timeout_s,
                      watch_ports=server_ports(spec))
        yield run
        aggregation = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == job_names["aggregate"]]
        if run.end is End.SUCCEEDED and aggregation and self.aggregate:
            pod = job_pod(aggregation[0], job_names["aggregate"], None, folders, uid, cache)
            pod["spec"].pop("initContainers", None)  # wait-job: no API server here
            yield run_pod([pod], "aggregate", self.network, self.workdir / "logs", self.timeout_s)


def server_ports(spec: SweepSpec) -> tuple[int, ...]:
    """The ports the pod's servers listen on (vLLM's, the env sidecars'), and the worker's metrics."""
    ports = [spec.cluster.vllm_port] if serves_vllm(spec) else []
    ports += [sidecar.port for sidecar in spec.cluster.sidecars(spec.tasks)]
    return (*ports, spec.cluster.metrics_port)


def sweep_uri(spec: SweepSpec, s3: LocalS3) -> str:
    return f"s3://{s3.bucket}/sweeps/{spec.name}"

