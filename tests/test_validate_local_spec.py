"""`thicket validate` of a local spec (no cluster section, output on this machine) says nothing
about a cluster: no `cluster ...` line, no `note: as a cluster sweep` (issue 51). A spec with a
cluster section, or an S3 output, still gets them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THICKET = str(Path(sys.executable).parent / "thicket")


def validate(spec: str | Path) -> subprocess.CompletedProcess:
    result = subprocess.run([THICKET, "validate", str(spec)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env=os.environ)
    assert result.returncode == 0, result.stderr
    return result


def local_spec(tmp_path: Path, policy: str, extra: str = "") -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: local-only\ntasks: {{env: textcraft, start: 0, stop: 1}}\n"
                    f"search: {{algorithm: sample, samples: 2, max_depth: 3}}\npolicy: {policy}\n"
                    f"output: {tmp_path}/out\n{extra}")
    return path


def test_a_local_spec_serving_a_model_folder_gets_no_cluster_note_or_line(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = validate(local_spec(tmp_path, f"{{kind: vllm, model: {model}}}"))
    assert "cluster" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == f"policy  vllm {model}"


def test_a_local_uniform_spec_gets_no_cluster_line(tmp_path):
    result = validate(local_spec(tmp_path, "{kind: uniform}"))
    assert "cluster" not in result.stdout + result.stderr


def test_a_spec_with_a_cluster_section_still_gets_its_cluster_line(tmp_path):
    result = validate(local_spec(tmp_path, "{kind: uniform}", "cluster: {namespace: rollouts}\n"))
    assert "cluster rollouts: 1 index, 1 at a time, no vLLM in the pod" in result.stdout.splitlines()
    assert "cluster thicket: 2 indexes" in validate(ROOT / "sweeps/demo.yaml").stdout  # make pod-demo's
