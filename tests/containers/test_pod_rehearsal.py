"""The rendered pods, run for real in containers (podman), as `make pod-demo` runs them.

`make test-containers` runs these (marked `containers`, left out of `make test`); .ci/run does, after
installing podman. They build the images (`make images`, cached by the engine), then `thicket
rehearse` runs the rollout pod of one index (vllm-cpu image serving the tiny model, the env
sidecar, the worker) and the aggregation pod against a local S3 container, and check what landed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from thicket.k8s.rehearsal import S3_ACCESS, Images
from thicket.shards.storage import committed_tasks, read_shard
from thicket.storage import open_store
from thicket.tiny_model import build_tiny_model, vllm_python

pytestmark = pytest.mark.containers

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")
POD_IMAGES = "worker env vllm-cpu s3-local"


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", python=vllm_python())


def spec_file(folder: Path, name: str, model: str, **cluster: object) -> Path:
    """Like sweeps/demo.yaml, smaller: MCTS on two TextCraft tasks in one index."""
    spec = {
        "name": name,
        "tasks": {"env": "textcraft", "start": 0, "stop": 2, "per_index": 2},
        "search": {"algorithm": "mcts", "iterations": 3, "expansions": 2, "max_depth": 4},
        "policy": {"kind": "vllm", "model": model, "temperature": 1.0, "max_tokens": 32,
                   "max_thought_chars": 16, "constrain_actions": True, "concurrency": 16},
        "output": "out", "seed": 0,
        "cluster": cluster,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def rehearse(spec: Path, workdir: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run([THICKET, "rehearse", str(spec), "--workdir", str(workdir), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    print(f"thicket rehearse: exit {done.returncode} after {time.monotonic() - started:.0f} s\n{done.stdout}{done.stderr}")
    return done


def test_the_rendered_pods_commit_trees_and_write_datasets(images, tiny_model, tmp_path):
    spec = spec_file(tmp_path, "pod-rehearsal", str(tiny_model))
    done = rehearse(spec, tmp_path / "work", "--pull", str(tmp_path / "pulled"))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "pod pod-rehearsal-0 succeeded" in done.stdout and "pod pod-rehearsal-aggregate succeeded" in done.stdout

    # The containers ran as rendered: non-root, read-only root filesystem, the vLLM flags of the Job.
    played = yaml.safe_load_all((tmp_path / "work" / "logs" / "pod-rehearsal-0.yaml").read_text())
    pod = next(o for o in played if o and o["kind"] == "Pod")
    by_name = {c["name"]: c for c in pod["spec"]["containers"]}
    assert list(by_name) == ["env-textcraft", "vllm", "worker"]
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert by_name["worker"]["securityContext"]["readOnlyRootFilesystem"] is True
    assert "--enable-prompt-tokens-details" in by_name["vllm"]["args"]

    # Both tasks committed once, on the local S3, with the model's token accounting.
    endpoint = next(line.split()[2] for line in done.stdout.splitlines() if line.startswith("local S3 "))
    os.environ.update({**S3_ACCESS, "AWS_ENDPOINT_URL": endpoint})
    try:
        store = open_store("s3://thicket/sweeps/pod-rehearsal")
        markers = committed_tasks(store)
        assert sorted(markers) == [0, 1]
        rows = [read_shard(store, m) for m in markers.values()]
        assert all(t.num_rows > 1 for t in rows)  # root and the expanded nodes
        cached = [v for t in rows for v in t.column("cached_tokens").to_pylist() if v is not None]
        assert cached, "cached_tokens is null in every row: vLLM ran without --enable-prompt-tokens-details"
        success = json.loads(store.get("datasets/_SUCCESS.json"))
    finally:
        for key in (*S3_ACCESS, "AWS_ENDPOINT_URL"):
            os.environ.pop(key, None)
    assert success and (tmp_path / "pulled" / "datasets" / "_SUCCESS.json").is_file()


def test_a_vllm_that_never_becomes_ready_ends_the_pod_with_its_reason(images, tmp_path):
    spec = spec_file(tmp_path, "pod-no-model", "no-such-org/no-such-model", wait_ready_timeout_s=60)
    started = time.monotonic()
    done = rehearse(spec, tmp_path / "work", timeout=600)
    elapsed = time.monotonic() - started
    assert done.returncode == 3, f"{done.stdout}\n{done.stderr}"  # a server not reachable
    line = next(line for line in done.stdout.splitlines() if line.startswith("pod pod-no-model-0"))
    assert "failed" in line and "; vllm exited 1: " in line, line  # the sidecar's own exit, with its last words
    assert "Error: " in line, line  # the exception that ended vLLM, not the traceback's last line
    assert elapsed < 300, elapsed
