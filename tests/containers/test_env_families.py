"""WebShop and ALFWorld in the env image: the rendered pods of a uniform sweep on each (the env
sidecar from the `env` image, the worker, the aggregation pod, a local S3), run with podman.
Their games and catalogue are generated inside the sidecar, from a cold cache, as on a cluster."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from tests.containers.conftest import committed_trees, rehearsal_store, rehearse

pytestmark = pytest.mark.containers


def uniform_spec(folder: Path, name: str, env: str) -> Path:
    spec = {
        "name": name,
        "tasks": {"env": env, "start": 0, "stop": 2, "per_index": 2},
        "search": {"algorithm": "sample", "samples": 2, "max_depth": 6},
        "policy": {"kind": "uniform"},
        "output": "out", "seed": 0,
        "cluster": {"gpus": 0},
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("env", ["webshop", "alfworld"])
def test_a_uniform_sweep_runs_in_the_env_image(images, tmp_path, env):
    name = f"pod-{env}-{uuid.uuid4().hex[:6]}"
    done = rehearse(uniform_spec(tmp_path, name, env), tmp_path / "work", timeout=1200)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert f"pod {name}-0 succeeded" in done.stdout and f"pod {name}-aggregate succeeded" in done.stdout
    played = yaml.safe_load_all((tmp_path / "work" / "logs" / f"{name}-0.yaml").read_text())
    pod = next(o for o in played if o and o["kind"] == "Pod")
    assert [c["name"] for c in pod["spec"]["containers"]] == [f"env-{env}", "worker"]

    with rehearsal_store(done.stdout, name) as store:
        trees = committed_trees(store)
        assert sorted(trees) == [0, 1]
        stops = [s for t in trees.values() for s in t.column("stop_reason").to_pylist()]
        assert "error" not in stops, stops  # every step the sidecar answered
        assert all(t.num_rows >= 3 for t in trees.values())  # the root and two trajectories' first steps at least
        success = json.loads(store.get("datasets/_SUCCESS.json"))
    assert success
