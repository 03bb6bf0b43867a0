"""A stopped `thicket run` ends with what it saved and how to go on, nothing else (issue 51).

SIGTERM (a preemption, a drain) and Ctrl-C (SIGINT), while the trees grow and while the datasets are
built: exit 143 or 130, the last line says what stopped the run and that rerunning resumes, and no
traceback follows. The signal is sent on an event of the run's own output, never after a fixed sleep.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # the slow tier: `make test-slow` (and CI)

THICKET = str(Path(sys.executable).parent / "thicket")
TASKS = 6
STOPPED = {signal.SIGTERM: (143, "terminated (SIGTERM): run the same command again to resume"),
           signal.SIGINT: (130, "interrupted (Ctrl-C): run the same command again to resume")}


def spec(tmp_path: Path) -> Path:
    """Trees that take about a minute (a uniform policy with 50 ms a reply): long enough to stop."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "name": "stop", "tasks": {"env": "frozenlake", "start": 0, "stop": TASKS, "per_index": TASKS},
        "search": {"algorithm": "mcts", "iterations": 200, "expansions": 3, "max_depth": 12},
        "policy": {"kind": "uniform", "latency_s": 0.05}, "output": str(tmp_path / "out"), "seed": 0}))
    return path


def stop_when(process: subprocess.Popen[str], stream: str, seen: str, sig: signal.Signals) -> str:
    """Send `sig` once a line of `stream` holds `seen`; the rest of stderr."""
    source = process.stderr if stream == "stderr" else process.stdout
    assert source is not None
    for line in source:
        if seen in line:
            break
    else:
        raise AssertionError(f"the run ended before {seen!r}: exit {process.wait()}")
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    return err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_run_stopped_while_its_trees_grow_saves_them_and_says_how_to_resume(tmp_path, sig):
    process = subprocess.Popen([THICKET, "run", str(spec(tmp_path)), "--no-progress"], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = stop_when(process, "stderr", f"task {TASKS - 1} started", sig)
    code, last = STOPPED[sig]
    lines = err.strip().splitlines()
    assert process.returncode == code, err[-2000:]
    assert lines[-1] == last and "stopping: saved the checkpoints of" in lines[-2], lines[-3:]
    assert "Traceback" not in err and "never retrieved" not in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_run_stopped_while_its_datasets_are_built_says_how_to_resume(tmp_path, sig):
    path = spec(tmp_path)
    first = subprocess.run([THICKET, "run", str(path), "--no-progress", "--no-aggregate"], capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    process = subprocess.Popen([THICKET, "run", str(path), "--no-progress"], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = stop_when(process, "stdout", "already committed", sig)  # the run's summary: aggregation is next
    code, last = STOPPED[sig]
    assert process.returncode == code, err[-2000:]
    assert err.strip().splitlines()[-1] == last
    assert "Traceback" not in err and "never retrieved" not in err
