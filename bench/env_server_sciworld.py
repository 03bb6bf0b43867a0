"""ScienceWorld step throughput in process versus through one `thicket serve-env sciworld`.

    .venv/bin/python bench/env_server_sciworld.py [--envs 4] [--seconds 25] [--rounds 1]

The same workload both ways: `--envs` concurrent env instances (each its own JVM), driven
concurrently through the env's async methods as a worker drives them (in process: the
ScienceWorldEnv's to_thread steps; via the server: thicket's RemoteEnv, one shared
EnvClient). Every env steps a seeded random action and resets (to a random one of TASKS
tasks) when the episode is done; steps/s counts steps only, the resets' time is inside.

Workloads:
  valid  valid_actions=True, max_valid_actions=CAP: random actions from the listed ones
         (the listing is the JVM's most expensive call and runs at every step)
  free   valid_actions=False: random actions from a few fixed ones ("look around", ...)

JVM starts and the first load of each task (the split lists are cached per process) are
paid before timing. Per round and workload: in process first, then via the server; the
server's overhead = 1 - server steps/s / in-process steps/s (goal: < 10%).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from thicket.envs.client import ClientConfig, EnvClient
from thicket.envs.protocol import Env
from thicket.envs.sciworld import ScienceWorldEnv
from thicket.envs.sidecar import EnvServerProcess

TASKS = 8  # task indices cycled through (each env warms them all before timing)
CAP = 50  # max_valid_actions in the "valid" workload
FIXED = ("look around", "inventory", "task", "look at door", "open door", "go to hallway", "go to kitchen")
WORKLOADS: dict[str, dict[str, Any]] = {
    "valid": {"valid_actions": True, "max_valid_actions": CAP},
    "free": {"valid_actions": False},
}


def pick(rng: random.Random, valid: Sequence[str] | None) -> str:
    return rng.choice(valid) if valid else rng.choice(FIXED)


async def warm(env: Env, i: int) -> None:
    """Start the JVM and load every task once (pays the split-list caching)."""
    for k in range(TASKS):
        await env.reset((i + k) % TASKS)


async def drive(env: Env, i: int, stop: float, counts: list[int]) -> None:
    rng = random.Random(i)
    valid = (await env.reset(i % TASKS)).valid_actions
    while time.perf_counter() < stop:
        t = await env.step(pick(rng, valid))
        counts[0] += 1
        if t.done:
            valid = (await env.reset(rng.randrange(TASKS))).valid_actions
            counts[1] += 1
        else:
            valid = t.observation.valid_actions


async def measure(envs: list[Env], seconds: float) -> tuple[float, int, int]:
    await asyncio.gather(*(warm(e, i) for i, e in enumerate(envs)))
    counts = [0, 0]  # steps, resets
    started = time.perf_counter()
    await asyncio.gather(*(drive(e, i, started + seconds, counts) for i, e in enumerate(envs)))
    elapsed = time.perf_counter() - started
    return counts[0] / elapsed, counts[0], counts[1]


async def in_process(env_args: dict[str, Any], n: int, seconds: float) -> tuple[float, int, int]:
    envs: list[Env] = [ScienceWorldEnv(**env_args) for _ in range(n)]
    try:
        return await measure(envs, seconds)
    finally:
        await asyncio.gather(*(e.close() for e in envs))


async def via_server(server: EnvServerProcess, env_args: dict[str, Any], n: int, seconds: float) -> tuple[float, int, int]:
    async with EnvClient(ClientConfig(server.url, timeout_s=120.0, max_connections=n)) as client:
        envs: list[Env] = [await client.env("sciworld", env_args) for _ in range(n)]
        try:
            return await measure(envs, seconds)
        finally:
            await asyncio.gather(*(e.close() for e in envs))


def line(kind: str, rate: float, steps: int, resets: int) -> str:
    return f"  {kind:<10} {rate:7.2f} steps/s  ({steps} steps, {resets} resets)"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; {args.envs} envs (JVMs) each way, "
          f"{args.seconds:.0f} s each; valid = valid_actions=True, max_valid_actions={CAP}; "
          f"free = valid_actions=False, actions from {len(FIXED)} fixed ones", flush=True)
    async with EnvServerProcess(["sciworld"], args=["--max-instances", str(4 * args.envs)],
                                startup_timeout_s=120.0) as server:
        for r in range(args.rounds):
            for name in args.workloads:
                env_args = WORKLOADS[name]
                local = await in_process(env_args, args.envs, args.seconds)
                remote = await via_server(server, env_args, args.envs, args.seconds)
                overhead = 100 * (1 - remote[0] / local[0])
                print(f"round {r + 1} {name}: load average {os.getloadavg()[0]:.1f}\n"
                      f"{line('in process', *local)}\n{line('via server', *remote)}\n"
                      f"  server overhead {overhead:+.1f}%", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
