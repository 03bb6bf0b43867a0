"""The images, built once a session, and `thicket rehearse` run from the repository root."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from thicket.k8s.podman import S3_ACCESS
from thicket.k8s.rehearsal import Images
from thicket.shards.storage import committed_tasks, read_shard
from thicket.storage import open_store

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")
POD_IMAGES = "worker env vllm-cpu s3-local"


@pytest.fixture(scope="session")
def images() -> Images:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: .ci/run installs it (../shared/podman/setup.sh)", pytrace=False)
    started = time.monotonic()
    done = subprocess.run(["make", "images", f"IMAGES={POD_IMAGES}", "DOCKER=podman"], cwd=ROOT,
                          capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"make images ({POD_IMAGES}): {time.monotonic() - started:.0f} s\n{done.stdout}")
    from thicket import __version__

    return Images.local(__version__)


def preempt(pod: str, grace_s: int) -> None:
    """Stop the pod as the kubelet preempts one: SIGTERM to every container, SIGKILL to any still
    running after the grace period, and the pod's network kept until they have all ended.
    `podman pod stop` (4.3) stops the infra container beside the others, which takes the network
    away from a worker saving its trees (the rehearsal removes the pod once its worker ended)."""
    infra = subprocess.run(["podman", "pod", "inspect", pod, "--format", "{{.InfraContainerID}}"],
                           capture_output=True, text=True, check=True).stdout.strip()
    running = subprocess.run(["podman", "ps", "--quiet", "--no-trunc", "--filter", f"pod={pod}"],
                             capture_output=True, text=True, check=True).stdout.split()
    containers = [c for c in running if c != infra]
    assert containers, f"pod {pod} has no running container to preempt"
    # One command: podman stops them in parallel. It may fail on a sidecar the rehearsal removed
    # with the pod once the worker ended, which is fine.
    subprocess.run(["podman", "stop", "--time", str(grace_s), *containers], capture_output=True,
                   timeout=grace_s + 120)


def rehearse(spec: Path, workdir: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run([THICKET, "rehearse", str(spec), "--workdir", str(workdir), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    print(f"thicket rehearse: exit {done.returncode} after {time.monotonic() - started:.0f} s\n{done.stdout}{done.stderr}")
    return done


@contextlib.contextmanager
def rehearsal_store(output: str, name: str) -> Iterator[object]:
    """Sweep `name`'s store on the local S3 that a rehearsal (its stdout: `output`) ran against."""
    endpoint = next(line.split()[2] for line in output.splitlines() if line.startswith("local S3 "))
    os.environ.update({**S3_ACCESS, "AWS_ENDPOINT_URL": endpoint})
    try:
        yield open_store(f"s3://thicket/sweeps/{name}")
    finally:
        for key in (*S3_ACCESS, "AWS_ENDPOINT_URL"):
            os.environ.pop(key, None)


def committed_trees(store) -> dict[int, pa.Table]:
    """Each committed task's tree, by task index."""
    return {task: read_shard(store, marker) for task, marker in sorted(committed_tasks(store).items())}
