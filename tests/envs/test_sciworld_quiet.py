"""`thicket validate` of a ScienceWorld spec prints its own lines only: py4j's INFO lines and the
tracebacks it logs when a JVM's callback server shuts down stay out (as scienceworld's own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")

pytest.importorskip("scienceworld")


def test_validate_of_a_sciworld_spec_prints_no_py4j_lines_nor_tracebacks(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "sweeps/cluster/sciworld-dense.yaml").read_text())
    data["tasks"]["env_args"] = {"valid_actions": True}  # --policy uniform asks the env (a JVM) for its actions
    data["output"] = str(tmp_path / "out")
    spec = tmp_path / "sciworld.yaml"
    spec.write_text(yaml.safe_dump(data))
    result = subprocess.run([THICKET, "validate", str(spec), "--policy", "uniform"], cwd=ROOT, capture_output=True,
                            text=True, timeout=180, env={**os.environ, "THICKET_LOG_FORMAT": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{spec}: ok")
    for noise in ("py4j", "Traceback", "Callback Server", "scienceworld.scienceworld"):
        assert noise not in result.stderr, result.stderr


def test_the_java_bridge_loggers_are_quiet_once_a_simulator_is_made() -> None:
    import logging

    from thicket.envs.sciworld import QUIET_LOGGERS, quiet_java_bridge

    quiet_java_bridge()
    assert all(logging.getLogger(name).getEffectiveLevel() >= logging.WARNING for name in QUIET_LOGGERS)
