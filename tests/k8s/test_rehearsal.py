"""thicket.k8s.rehearsal's changes to the rendered pod, each one of MACHINE_CHANGES (no podman needed
here; tests/containers runs the pods)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from thicket.k8s.rehearsal import MACHINE_CHANGES, Images, LocalS3, job_pod, local_spec
from thicket.k8s.render import render
from thicket.spec import load_spec
from thicket.vllm_server import LOGPROBS_MODE

ROOT = Path(__file__).resolve().parents[2]
S3 = LocalS3("s3", "http://127.0.0.1:1", "http://10.0.0.2:5000", "thicket")


def rollout_pod(tmp_path: Path, model: Path) -> tuple[dict, dict]:
    spec = load_spec(ROOT / "sweeps" / "demo.yaml")
    spec = spec.model_copy(update={"policy": spec.policy.model_copy(update={"model": str(model)})})
    cache = tmp_path / "cache"
    cache.mkdir()
    local = local_spec(spec, Images.local("1.2.3"), S3, cache)
    job = next(o for o in render(local) if o["kind"] == "Job" and o["spec"].get("completionMode") == "Indexed")
    return job, job_pod(job, "demo-1", 1, tmp_path / "volumes", os.getuid(), cache)


def test_the_pod_runs_the_job_s_containers_with_sidecars_first(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    job, pod = rollout_pod(tmp_path, model)
    template = job["spec"]["template"]["spec"]
    containers = pod["spec"]["containers"]
    assert [c["name"] for c in containers] == [c["name"] for c in template["initContainers"]] + ["worker"]
    assert "initContainers" not in pod["spec"] and all("restartPolicy" not in c for c in containers)
    for rendered, played in zip(template["initContainers"] + template["containers"], containers):
        assert played["args"] == rendered["args"] and played["securityContext"] == rendered["securityContext"]
        assert played["env"][:-1] == rendered.get("env", [])
        assert played["env"][-1] == {"name": "JOB_COMPLETION_INDEX", "value": "1"}
    assert all(len(v) <= 63 for v in pod["metadata"]["annotations"].values())
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["spec"] == next(v for v in template["volumes"] if v["name"] == "spec")  # the ConfigMap
    assert Path(volumes["tmp"]["hostPath"]["path"]).is_dir()
    assert (Path(volumes["model-cache"]["hostPath"]["path"]) / "tiny" / "config.json").is_file()  # copied in
    vllm = next(c for c in containers if c["name"] == "vllm")
    assert vllm["image"] == "ghcr.io/thicket/thicket-vllm-cpu:1.2.3" and "nvidia.com/gpu" not in str(vllm["resources"])
    assert vllm["args"][vllm["args"].index("--model") + 1] == "/models/tiny"
    assert vllm["args"][vllm["args"].index("--logprobs-mode") + 1] == LOGPROBS_MODE  # as every vLLM thicket starts


def test_every_machine_change_is_in_the_readme():
    readme = " ".join((ROOT / "docs" / "kubernetes.md").read_text().split())
    assert len(MACHINE_CHANGES) == 9
    for phrase in ("JOB_COMPLETION_INDEX", "over 63 characters", "podman secret", "wait-job", "ignores probes",
                   "nvidia.com/gpu",
                   "root-owned", "native sidecars become ordinary containers"):
        assert phrase in readme, phrase


def test_without_podman_rehearse_says_so_in_one_line(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run([str(Path(sys.executable).parent / "thicket"), "rehearse", "sweeps/demo.yaml"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: thicket rehearse needs podman (apt-get install podman), not found on PATH"), done.stderr
