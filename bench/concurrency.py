"""Concurrency: the same MCTS tasks with a policy that takes 100 ms per request,
run with 64 requests/trees in flight versus 1. Goal: >= 30x faster at 64.
    .venv/bin/python bench/concurrency.py [--tasks 64] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile

from thicket.rollout.sweep import run_tasks
from thicket.spec import parse_spec


def spec(tasks: int, latency: float, concurrency: int, output: str):
    return parse_spec(
        {
            "name": f"bench-concurrency-{concurrency}",
            "tasks": {"env": "textcraft", "start": 0, "stop": tasks},
            "search": {"algorithm": "mcts", "iterations": 3, "expansions": 2, "max_depth": 4},
            "policy": {"kind": "uniform", "latency_s": latency, "concurrency": concurrency},
            "run": {"trees_in_flight": concurrency, "progress": False},
            "output": output,
        }
    )


def timed(tasks: int, latency: float, concurrency: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as out:
        s = spec(tasks, latency, concurrency, out)
        summary = asyncio.run(run_tasks(s, list(range(tasks)), progress=False))
        requests = sum(o.llm_requests for o in summary.report.outcomes)
        return summary.report.seconds, requests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    wide, requests = timed(args.tasks, args.latency, 64)
    narrow, requests_1 = timed(args.tasks, args.latency, 1)
    assert requests == requests_1, "both runs must do the same work"
    print(f"tasks {args.tasks}, {requests} policy requests of {args.latency * 1000:.0f} ms")
    print(f"concurrency  1: {narrow:7.2f} s")
    print(f"concurrency 64: {wide:7.2f} s")
    print(f"speed-up      : {narrow / wide:7.1f}x (goal >= 30x)")


if __name__ == "__main__":
    main()
