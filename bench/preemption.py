"""LLM calls redone after a sweep is killed halfway, with and without checkpoints of growing trees.

A sweep (TextCraft, Agent-R's MCTS; the uniform policy with a simulated latency, so no model is
needed) is run once uninterrupted to count its calls (T). Then, for each setting, a fresh sweep
is started, killed (SIGKILL, or SIGTERM as Kubernetes preempts) once it has made T/2 calls, and
run again to the end. Calls redone = calls of the killed run + calls of the rerun - T: what the
kill cost. Calls are counted in the child process, one byte appended to a file per sampled
reply. Goal (issue 40): at most 5% of the sweep's calls redone with the default cadence.

    .venv/bin/python bench/preemption.py [--tasks 16] [--latency 0.02]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve()


def child(counter: str, argv: list[str]) -> None:
    """Run the thicket CLI with every sampled reply counted in `counter`."""
    from thicket.cli import main
    from thicket.policy.uniform import UniformPolicy

    fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    propose = UniformPolicy.propose

    async def counted(self, messages, n, **kwargs):  # type: ignore[no-untyped-def]
        replies = await propose(self, messages, n, **kwargs)
        os.write(fd, b"." * len(replies))
        return replies

    UniformPolicy.propose = counted  # type: ignore[method-assign]
    sys.argv = ["thicket", *argv]
    main()


def spec(work: Path, tasks: int, latency: float, checkpoint: dict[str, object]) -> Path:
    path = work / f"spec-{len(list(work.glob('spec-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({
        "name": "preempt",
        "tasks": {"env": "textcraft", "start": 0, "stop": tasks, "per_index": tasks},
        "search": {"algorithm": "mcts", "iterations": 30, "expansions": 4, "max_depth": 20},
        "policy": {"kind": "uniform", "latency_s": latency, "concurrency": 64},
        "output": str(work / "out"),
        "run": {"progress": False, "checkpoint": checkpoint},
    }))
    return path


def counted_run(spec_path: Path, output: Path, counter: Path, kill_at: int | None = None,
                sig: signal.Signals = signal.SIGKILL) -> int:
    """Calls made by one `thicket run` (killed with `sig` once it made `kill_at` calls)."""
    counter.write_bytes(b"")
    cmd = [sys.executable, str(HERE), "--child", str(counter), "--", "run", str(spec_path), "--no-aggregate",
           "--output", str(output)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while kill_at is not None and proc.poll() is None and counter.stat().st_size < kill_at:
        time.sleep(0.005)
    if kill_at is not None and proc.poll() is None:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    if kill_at is None and proc.returncode != 0:
        raise SystemExit(f"the run failed: {err.decode()[-2000:]}")
    return counter.stat().st_size


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[4:])
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--latency", type=float, default=0.02, help="simulated seconds per LLM request")
    args = parser.parse_args()
    settings = [("no checkpoints", {"enabled": False}, signal.SIGKILL),
                ("default cadence", {}, signal.SIGKILL),
                ("default cadence", {}, signal.SIGTERM)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        counter = work / "calls"
        total = counted_run(spec(work, args.tasks, args.latency, {}), work / "reference", counter)
        print(f"TextCraft x {args.tasks} tasks, MCTS (30 iterations x 4), uniform policy at {args.latency * 1000:g} ms "
              f"a request: {total:,} LLM calls uninterrupted")
        print(f"{'checkpoints':16} {'signal':8} {'killed at':>10} {'rerun':>7} {'redone':>7} {'share':>7}")
        for name, checkpoint, sig in settings:
            path, output = spec(work, args.tasks, args.latency, checkpoint), work / f"out-{name[:2]}-{sig.name}"
            killed = counted_run(path, output, counter, kill_at=total // 2, sig=sig)
            rerun = counted_run(path, output, counter)
            redone = killed + rerun - total
            print(f"{name:16} {sig.name:8} {killed:10,} {rerun:7,} {redone:7,} {redone / total:7.1%}")


if __name__ == "__main__":
    main()
