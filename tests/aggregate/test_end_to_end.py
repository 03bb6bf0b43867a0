"""`thicket run` then `thicket aggregate` through the command line: progress on a terminal only,
datasets that load with HF datasets and rerun identically."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import thicket.shards.storage as shards
from tests.support.random_trees import files_under, load, synthetic_sweep
from thicket.storage.store import LocalStore

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")


# ---- end to end through the command line -----------------------------------------------------


def thicket(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([THICKET, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def on_a_terminal(*args: str, timeout: float = 120) -> str:
    """What `thicket ARGS` writes to stderr when stderr is a terminal (a pseudo-terminal)."""
    main, side = pty.openpty()
    try:
        done = subprocess.run([THICKET, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=side, timeout=timeout,
                              env={**os.environ, "COLUMNS": "160", "TERM": "xterm"})
        os.close(side)
        side = -1
        out = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other end closed: all read
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(main)
        if side >= 0:
            os.close(side)
    assert done.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_aggregate_shows_its_progress_on_a_terminal_only(tmp_path):
    sweep = synthetic_sweep(tmp_path)
    nodes = sum(m.rows for m in shards.committed_shards(LocalStore(sweep)))
    shown = on_a_terminal("aggregate", str(sweep), "--workers", "0")
    assert "trees" in shown and "12/12" in shown and f"{nodes} nodes" in shown, shown
    assert "12/12" not in on_a_terminal("aggregate", str(sweep), "--no-progress")
    piped = thicket("aggregate", str(sweep))
    assert piped.returncode == 0 and "12/12" not in piped.stderr + piped.stdout


def test_run_then_aggregate_end_to_end_loads_with_hf_datasets_and_reruns_identically(tmp_path):
    spec = tmp_path / "fl.yaml"
    spec.write_text(
        "name: fl\n"
        "tasks: {env: frozenlake, env_args: {size: 4, is_slippery: false}, start: 0, stop: 4, per_index: 4}\n"
        "search: {algorithm: dense, width: 3, max_depth: 8, run_budget: 12, target_pairs: 4}\n"
        "policy: {kind: uniform}\n"
        "output: out\n"
        "datasets: {dpo: {max_trajectory_pairs_per_task: 2}}\n"
    )
    ran = thicket("run", str(spec), "--output", str(tmp_path), "--no-progress")
    assert ran.returncode == 0, ran.stderr
    out = tmp_path / "fl" / "datasets"
    assert "datasets     file://" in ran.stdout and (out / "_SUCCESS.json").is_file()
    manifest = json.loads((out / "_SUCCESS.json").read_text())
    assert manifest["datasets"]["sft"] > 0 and manifest["datasets"]["dpo"] > 0 and manifest["datasets"]["revision"] > 0
    assert manifest["datasets"]["tokens"] == 0  # the uniform policy samples no token ids
    for name in ("sft", "sft_fastchat", "dpo", "revision"):
        ds = load(out, name, tmp_path / "hf")
        assert len(ds) == manifest["datasets"][name]
    assert set(load(out, "dpo", tmp_path / "hf").column_names) >= {"prompt", "chosen", "rejected"}
    first = files_under(out)
    again = thicket("aggregate", str(tmp_path / "fl"))
    assert again.returncode == 0, again.stderr
    assert "sft" in again.stdout and files_under(out) == first
    skipped = thicket("run", str(spec), "--output", str(tmp_path / "b"), "--no-progress", "--no-aggregate", "--indices", "0")
    assert skipped.returncode == 0 and not (tmp_path / "b" / "fl" / "datasets").exists()
