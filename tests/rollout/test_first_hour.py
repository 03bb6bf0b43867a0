"""What `thicket run` says, and skips, in a user's first hour: a rerun of a finished sweep
starts no server, an unreachable policy.url is named at once, a terminal shows the bar and
not three log lines a task."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")


def thicket(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([THICKET, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "THICKET_LOG_FORMAT": ""})


def on_a_terminal(*args: str, timeout: float = 180) -> tuple[int, str]:
    """Run thicket with stderr on a pseudo-terminal (as in a shell): (exit code, stderr)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([THICKET, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=slave,
                            stdin=subprocess.DEVNULL, env={**os.environ, "THICKET_LOG_FORMAT": "", "TERM": "xterm"})
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=max(1.0, deadline - time.monotonic())), b"".join(chunks).decode(errors="replace")


def spec(tmp_path: Path, policy: dict, stop: int = 202) -> Path:
    data = yaml.safe_load((ROOT / "sweeps/demo.yaml").read_text())
    data["policy"] = policy
    data["tasks"]["stop"] = stop
    data["output"] = str(tmp_path / "out")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_rerun_with_every_tree_committed_starts_no_server_and_still_aggregates(tmp_path):
    uniform = spec(tmp_path, {"kind": "uniform", "concurrency": 8})
    first = thicket("run", str(uniform), "--no-aggregate", "--no-progress")
    assert first.returncode == 0, first.stderr
    # The same sweep with a local model whose vLLM cannot start: a rerun must not try.
    vllm = spec(tmp_path, {"kind": "vllm", "model": "models/demo", "server": {"python": "/nonexistent/python"}})
    started = time.perf_counter()
    again = thicket("run", str(vllm), "--allow-spec-change", "--no-progress")
    assert again.returncode == 0, again.stderr
    assert time.perf_counter() - started < 60
    assert "all 2 trees already committed" in again.stdout
    assert "vLLM" not in again.stderr and "/nonexistent/python" not in again.stderr
    assert "report.html" in again.stdout  # aggregation ran


def test_an_unreachable_policy_url_is_named_at_once_then_one_error_line(tmp_path):
    url = "http://127.0.0.1:9/v1"
    path = spec(tmp_path, {"kind": "openai", "url": url, "model": "demo", "startup_connect_s": 3}, stop=201)
    result = thicket("run", str(path), "--no-aggregate", "--no-progress")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert f"waiting up to 3 s for the policy server at {url}" in lines[0]
    assert lines[-1].startswith(f"error: policy.url: nothing answers at {url}")


def test_on_a_terminal_the_bar_replaces_the_per_task_lines_unless_verbose_or_json(tmp_path):
    path = spec(tmp_path, {"kind": "uniform", "concurrency": 8}, stop=203)
    code, shown = on_a_terminal("run", str(path), "--no-aggregate", "--output", str(tmp_path / "a"))
    assert code == 0, shown
    assert "trees" in shown and "3/3" in shown  # the bar
    assert "thicket.worker" not in shown and "task 200 started" not in shown
    code, verbose = on_a_terminal("-v", "run", str(path), "--no-aggregate", "--output", str(tmp_path / "b"))
    assert code == 0 and "INFO thicket.worker: task 200 started" in verbose
    code, as_json = on_a_terminal("--log-format", "json", "run", str(path), "--no-aggregate",
                                  "--output", str(tmp_path / "c"))
    assert code == 0 and '"message": "task 200 started"' in as_json
    piped = thicket("run", str(path), "--no-aggregate", "--output", str(tmp_path / "d"))  # no terminal: a pod's log
    assert piped.returncode == 0 and "INFO thicket.worker: task 200 started" in piped.stderr
