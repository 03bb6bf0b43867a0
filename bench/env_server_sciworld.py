"""ScienceWorld step throughput in process versus through one `thicket serve-env sciworld`.

    .venv/bin/python bench/env_server_sciworld.py [--envs 4] [--scale 1] [--rounds 3]

The same work both ways: `--envs` concurrent env instances (each its own JVM), driven
concurrently through the env's async methods as a worker drives them (in process: the
ScienceWorldEnv's to_thread steps; via the server: thicket's RemoteEnv, one shared
EnvClient). Every env takes a fixed number of seeded random steps, resetting (to a random
one of TASKS tasks) when an episode is done, so both ways step the same actions in the same
tasks; steps/s counts steps only, the resets' time is inside. Rounds alternate which way
goes first.

Workloads:
  valid  valid_actions=True, max_valid_actions=CAP: random actions from the listed ones
         (the listing is the JVM's most expensive call and runs at every step)
  free   valid_actions=False: random actions from a few fixed ones ("look around", ...)

JVM starts and the first load of each task (the split lists are cached per process) are
paid before timing. Per round and workload: in process first, then via the server; the
server's overhead = 1 - server steps/s / in-process steps/s (goal: < 10%), and in CPU a
step summed over every process involved (this bench, the server, the JVMs): on a machine
whose cores the JVMs fill, the CPU figure is the steadier one. Medians over the rounds end it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thicket.envs.client import ClientConfig, EnvClient
from thicket.envs.protocol import Env
from thicket.envs.sciworld import ScienceWorldEnv
from thicket.envs.sidecar import EnvServerProcess

TASKS = 8  # task indices cycled through (each env warms them all before timing)
CAP = 50  # max_valid_actions in the "valid" workload
TICKS = os.sysconf("SC_CLK_TCK")
FIXED = ("look around", "inventory", "task", "look at door", "open door", "go to hallway", "go to kitchen")
WORKLOADS: dict[str, dict[str, Any]] = {
    "valid": {"valid_actions": True, "max_valid_actions": CAP},
    "free": {"valid_actions": False},
}
STEPS = {"valid": 40, "free": 800}  # per env and way: ~10-20 s on 2 cores


def pick(rng: random.Random, valid: Sequence[str] | None) -> str:
    return rng.choice(valid) if valid else rng.choice(FIXED)


async def warm(env: Env, i: int) -> None:
    """Start the JVM and load every task once (pays the split-list caching)."""
    for k in range(TASKS):
        await env.reset((i + k) % TASKS)


async def drive(env: Env, i: int, steps: int, counts: list[int]) -> None:
    """`steps` seeded steps: the same actions and resets both ways, so the JVMs do the same work."""
    rng = random.Random(i)
    valid = (await env.reset(i % TASKS)).valid_actions
    for _ in range(steps):
        t = await env.step(pick(rng, valid))
        counts[0] += 1
        if t.done:
            valid = (await env.reset(rng.randrange(TASKS))).valid_actions
            counts[1] += 1
        else:
            valid = t.observation.valid_actions


def cpu_seconds(root: int) -> float:
    """CPU time of a process and all its descendants (the JVMs, the server and its JVMs)."""
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICKS
        for children in glob.glob(f"/proc/{pid}/task/*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in Path(children).read_text().split()]
    return total


@dataclass(frozen=True)
class Rate:
    steps_per_s: float
    steps: int
    resets: int
    cpu_ms_per_step: float  # every process involved: bench, server, JVMs


async def measure(envs: list[Env], steps: int) -> Rate:
    await asyncio.gather(*(warm(e, i) for i, e in enumerate(envs)))
    counts = [0, 0]  # steps, resets
    cpu0, started = cpu_seconds(os.getpid()), time.perf_counter()
    await asyncio.gather(*(drive(e, i, steps, counts) for i, e in enumerate(envs)))
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(os.getpid()) - cpu0
    return Rate(counts[0] / elapsed, counts[0], counts[1], 1000 * cpu / max(counts[0], 1))


async def in_process(env_args: dict[str, Any], n: int, steps: int) -> Rate:
    envs: list[Env] = [ScienceWorldEnv(**env_args) for _ in range(n)]
    try:
        return await measure(envs, steps)
    finally:
        await asyncio.gather(*(e.close() for e in envs))


async def via_server(server: EnvServerProcess, env_args: dict[str, Any], n: int, steps: int) -> Rate:
    async with EnvClient(ClientConfig(server.url, timeout_s=120.0, max_connections=n)) as client:
        envs: list[Env] = [await client.env("sciworld", env_args) for _ in range(n)]
        try:
            return await measure(envs, steps)
        finally:
            await asyncio.gather(*(e.close() for e in envs))


def line(kind: str, rate: Rate) -> str:
    return (f"  {kind:<10} {rate.steps_per_s:7.2f} steps/s  ({rate.steps} steps, {rate.resets} resets; "
            f"{rate.cpu_ms_per_step:.2f} ms of CPU a step, all processes)")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0, help="steps per env = STEPS x this")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; {args.envs} envs (JVMs) each way, "
          f"{args.scale:g} x {STEPS} steps per env each; valid = valid_actions=True, max_valid_actions={CAP}; "
          f"free = valid_actions=False, actions from {len(FIXED)} fixed ones", flush=True)
    async with EnvServerProcess(["sciworld"], args=["--max-instances", str(4 * args.envs)],
                                startup_timeout_s=120.0) as server:
        overheads: dict[str, list[tuple[float, float]]] = {name: [] for name in args.workloads}
        for r in range(args.rounds):
            for name in args.workloads:
                env_args, steps = WORKLOADS[name], max(1, round(STEPS[name] * args.scale))
                if r % 2 == 0:  # alternate which way goes first, so drift falls on both
                    local = await in_process(env_args, args.envs, steps)
                    remote = await via_server(server, env_args, args.envs, steps)
                else:
                    remote = await via_server(server, env_args, args.envs, steps)
                    local = await in_process(env_args, args.envs, steps)
                wall = 100 * (1 - remote.steps_per_s / local.steps_per_s)
                cpu = 100 * (remote.cpu_ms_per_step / local.cpu_ms_per_step - 1)
                overheads[name].append((wall, cpu))
                print(f"round {r + 1} {name}: load average {os.getloadavg()[0]:.1f}\n"
                      f"{line('in process', local)}\n{line('via server', remote)}\n"
                      f"  server overhead {wall:+.1f}% in steps/s, {cpu:+.1f}% in CPU a step", flush=True)
        for name, pairs in overheads.items():
            print(f"{name}: median server overhead over {len(pairs)} round(s): "
                  f"{statistics.median(w for w, _ in pairs):+.1f}% in steps/s, "
                  f"{statistics.median(c for _, c in pairs):+.1f}% in CPU a step (goal < 10%)")


if __name__ == "__main__":
    asyncio.run(main())
