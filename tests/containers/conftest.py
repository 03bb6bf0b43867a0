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
