"""A sweep's rendered pods, run on this machine with podman: the rehearsal before a cluster.

`thicket rehearse SPEC --index N` renders the sweep as `thicket render` does, runs the rollout
Job's pod for index N with `podman kube play`, waits for its worker, then runs the aggregation
Job's pod the same way, against a local S3 (moto_server in a container). The containers run as
rendered: images, commands, args, env, securityContext (non-root uid, read-only root filesystem,
dropped capabilities), resources, volumes and mounts. What one machine forces is changed by code,
and only that (`MACHINE_CHANGES`, also in docs/kubernetes.md):
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from thicket.errors import BadInput, ExitCode, ThicketError, Unavailable
from thicket.k8s.names import WORKER, names
from thicket.k8s.render import render, to_yaml
from thicket.spec import SweepSpec, parse_spec

Obj = dict[str, Any]

MACHINE_CHANGES = (
    "the spec: output on the local S3 (s3://BUCKET/sweeps), cluster.images.vllm the local vllm-cpu "
    "image, cluster.gpus 0 and vLLM's CPU flags (no GPU here), cluster.model a folder copied into "
    "the model cache when policy.model is a local folder",
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
    "podman ignores probes and restarts nothing: the pod ends when its main container exits (its "
    "sidecars are stopped then, as the kubelet does), or when a sidecar exits first (the kubelet would "
    "restart it), with that sidecar's last log lines as the reason",
)
__doc__ += "".join(f"\n- {change}" for change in MACHINE_CHANGES)

REGISTRY = "ghcr.io/thicket"
S3_PORT = 5000
S3_ACCESS = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal", "AWS_DEFAULT_REGION": "us-east-1"}
CPU_VLLM_ARGS = ["--dtype", "float32", "--enforce-eager", "--distributed-executor-backend", "uni",
                 "--no-enable-chunked-prefill"]
POLL_S = 1.0
NO_PODMAN = "thicket rehearse needs podman (apt-get install podman), not found on PATH"
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


@dataclass(frozen=True)
class LocalS3:
    """moto_server in a container on the pods' network."""

    container: str
    host_url: str  # from this machine (thicket pull)
    pod_url: str  # from the pods
    bucket: str


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
        """The main container's exit code; 3 (a server not reachable) when a sidecar died first."""
        code = self.exit_of(self.main).exit_code
        if code is None:
            return int(ExitCode.UNAVAILABLE) if self.died() else int(ExitCode.DEADLINE)
        return code


# -- podman --------------------------------------------------------------------------------------
def podman(*args: str, timeout: float = 600, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, input=stdin)
    except FileNotFoundError:
        raise BadInput(NO_PODMAN) from None
    except subprocess.TimeoutExpired:
        raise Unavailable(f"podman {args[0]} did not answer in {timeout:.0f} s") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
        raise ThicketError(f"podman {' '.join(args[:2])} failed: {lines[-1]}")
    return done.stdout


def require_images(images: list[str]) -> None:
    if shutil.which("podman") is None:
        raise BadInput(NO_PODMAN)
    missing = [image for image in images if subprocess.run(
        ["podman", "image", "exists", image], capture_output=True).returncode != 0]
    if missing:
        raise BadInput(f"image {missing[0]} is not built here: run `make images` first")


def ensure_network(name: str) -> None:
    """The pods' and the local S3's bridge network (a fresh podman has none until asked)."""
    if subprocess.run(["podman", "network", "exists", name], capture_output=True).returncode != 0:
        podman("network", "create", name)


# -- the local S3 ----------------------------------------------------------------------------------
def start_s3(image: str, network: str, bucket: str, name: str = "thicket-rehearsal-s3") -> LocalS3:
    """moto_server in a container (reused when running), its port published on 127.0.0.1 only."""
    running = podman("ps", "--filter", f"name=^{name}$", "--format", "{{.Names}}").split()
    if name not in running:
        podman("rm", "--force", "--ignore", name)
        podman("run", "--detach", "--name", name, "--network", network, "--publish", f"127.0.0.1::{S3_PORT}", image)
    host_port = podman("port", name, str(S3_PORT)).strip().rsplit(":", 1)[-1]
    address = podman("inspect", name, "--format", f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}')
    s3 = LocalS3(name, f"http://127.0.0.1:{host_port}", f"http://{address.strip()}:{S3_PORT}", bucket)
    _make_bucket(s3)
    return s3


def _make_bucket(s3: LocalS3, deadline_s: float = 60) -> None:
    import boto3
    import botocore.exceptions

    client = boto3.client("s3", endpoint_url=s3.host_url, aws_access_key_id=S3_ACCESS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=S3_ACCESS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    until = time.monotonic() + deadline_s
    while True:
        try:
            client.create_bucket(Bucket=s3.bucket)
            return
        except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            return
        except botocore.exceptions.EndpointConnectionError:
            if time.monotonic() > until:
                raise Unavailable(f"the local S3 at {s3.host_url} did not start in {deadline_s:.0f} s: "
                                  f"podman logs {s3.container}") from None
            time.sleep(0.5)


def s3_secret(name: str, s3: LocalS3) -> None:
    """The cluster.s3_secret Secret as a podman secret: JSON of base64 values, as podman 4.3 reads it."""
    data = {**S3_ACCESS, "AWS_ENDPOINT_URL": s3.pod_url}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    if name in podman("secret", "ls", "--format", "{{.Name}}").split():
        podman("secret", "rm", name)
    podman("secret", "create", name, "-", stdin=json.dumps(encoded))


# -- the spec as this machine runs it ----------------------------------------------------------------
def local_spec(spec: SweepSpec, images: Images, s3: LocalS3, cache: Path) -> SweepSpec:
    """The spec with what one machine forces changed (MACHINE_CHANGES, first item)."""
    data = spec.model_dump(mode="json", exclude_unset=True)
    data["output"] = f"s3://{s3.bucket}/sweeps"
    cluster = data.setdefault("cluster", {})
    cluster["images"] = {**cluster.get("images", {}), "worker": images.worker, "env": images.env,
                         "env_java": images.env_java, "vllm": images.vllm_cpu, "pull_policy": "IfNotPresent"}
    cluster["gpus"] = 0
    cluster["vllm_args"] = [*CPU_VLLM_ARGS, *cluster.get("vllm_args", [])]
    model = spec.policy.model
    if spec.policy.kind == "vllm" and spec.policy.url is None and model and Path(model).is_dir():
        target = cache / Path(model).name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(model, target)
        _chown_tree(target, spec.cluster.run_as_user)  # what fsGroup does to a PVC on a cluster
        cluster["model"] = f"{spec.cluster.model_cache_path}/{Path(model).name}"
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
def run_pod(objects: list[Obj], main: str, network: str, logs: Path, timeout_s: float) -> PodRun:
    """`podman kube play` the objects, wait for the main container, stop the rest, keep every log."""
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
        if any(code not in (None, 0) for code in codes.values()):
            end = End.FAILED  # a sidecar died: the kubelet would restart it, podman does not
            break
        time.sleep(POLL_S)
    seconds = time.monotonic() - start
    codes = _exit_codes(name, containers)
    exits = [ContainerExit(c, codes[c], _save_log(f"{name}-{c}", logs)) for c in containers]
    podman("pod", "rm", "--force", "--time", "10", name)
    return PodRun(name, main, end, seconds, exits)


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
        run = run_pod([config, pod], WORKER, self.network, self.workdir / "logs", self.timeout_s)
        yield run
        aggregation = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == job_names["aggregate"]]
        if run.end is End.SUCCEEDED and aggregation and self.aggregate:
            pod = job_pod(aggregation[0], job_names["aggregate"], None, folders, uid, cache)
            pod["spec"].pop("initContainers", None)  # wait-job: no API server here
            yield run_pod([pod], "aggregate", self.network, self.workdir / "logs", self.timeout_s)


def sweep_uri(spec: SweepSpec, s3: LocalS3) -> str:
    return f"s3://{s3.bucket}/sweeps/{spec.name}"

