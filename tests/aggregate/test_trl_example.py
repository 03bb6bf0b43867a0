"""docs/examples/trl_train.py, the worked TRL script of docs/training.md, run as a user runs it on
a tiny sweep: SFT on `sft`, then DPO on `dpo_first_turn`, both loaded with `thicket.load`, starting
from the demo policy. It runs in .venv-trl (`make trl-venv`: TRL, CPU torch, thicket's core)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import thicket
from tests.support.random_trees import synthetic_sweep
from thicket.aggregate.driver import aggregate

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "examples" / "trl_train.py"
TRL_PYTHON = os.environ.get("THICKET_TRL_PYTHON", str(ROOT / ".venv-trl" / "bin" / "python"))
THICKET = str(Path(sys.executable).parent / "thicket")


def test_the_trl_script_trains_sft_then_dpo_on_a_sweeps_rows(tmp_path):
    if not Path(TRL_PYTHON).is_file():
        pytest.fail(f"no TRL interpreter at {TRL_PYTHON}: run `make trl-venv`", pytrace=False)
    sweep = synthetic_sweep(tmp_path)
    aggregate(str(sweep), workers=0)
    base = tmp_path / "demo"
    subprocess.run([THICKET, "make-model", str(base), "--demo"], check=True, capture_output=True, timeout=120)
    done = subprocess.run([TRL_PYTHON, str(SCRIPT), str(sweep), str(base), str(tmp_path / "trained"), "--steps", "2"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    stages = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"stage"')]
    assert [s["stage"] for s in stages] == ["sft", "dpo"]
    assert stages[0]["rows"] == len(thicket.load(str(sweep), "sft")) > 0
    assert stages[1]["rows"] == len(thicket.load(str(sweep), "dpo_first_turn")) > 0
    for stage in stages:
        assert stage["loss"] == stage["loss"] and stage["loss"] > 0  # finite, trained
        assert (tmp_path / "trained" / stage["stage"] / "model.safetensors").stat().st_size > 0
