"""ScienceWorld step throughput in process versus through one `thicket serve-env sciworld`.

    .venv/bin/python bench/env_server_sciworld.py [--envs 4] [--scale 1] [--rounds 5]

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

JVM starts, the first load of each task (the split lists are cached per process) and a
quarter as many steps again (other seeds: the JIT's warm-up) are paid before timing. Per
round and workload, the server's overhead = 1 - server steps/s / in-process steps/s (goal: < 10%), and in CPU a
step summed over every process involved (this bench, the server, the JVMs), and the Python
CPU a step the server path adds (its HTTP, both sides) against the in-process CPU a step.
The JVMs' own CPU a step for the same work varies by 10-20% between runs (JIT, GC, 4 JVMs
on 2 cores), both ways alike, so single rounds swing widely; the Python figure leaves that
noise out. Medians over the rounds end it.
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
from thicket.envs.process import EnvServerProcess
from thicket.envs.protocol import Env
from thicket.envs.sciworld import ScienceWorldEnv

WARM_SEED = 1000  # seeds of the untimed steps (the timed ones use 0..envs-1)
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


def cpu_seconds(root: int) -> dict[str, float]:
    """CPU time of a process and all its descendants (the JVMs, the server and its JVMs),
    by kind: the JVMs ("java"), and the Python processes (everything else)."""
    total: dict[str, float] = {"java": 0.0, "python": 0.0}
    todo = [root]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            name, fields = stat.split("(", 1)[1].rsplit(")", 1)
            ticks = fields.split()
            total["java" if name == "java" else "python"] += (int(ticks[11]) + int(ticks[12])) / TICKS
        for children in glob.glob(f"/proc/{pid}/task/*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in Path(children).read_text().split()]
    return total


@dataclass(frozen=True)
class Rate:
    steps_per_s: float
    steps: int
    resets: int
    python_ms_per_step: float  # the bench, and the server when there is one
    jvm_ms_per_step: float

    @property
    def cpu_ms_per_step(self) -> float:
        return self.python_ms_per_step + self.jvm_ms_per_step


async def measure(envs: list[Env], steps: int) -> Rate:
    await asyncio.gather(*(warm(e, i) for i, e in enumerate(envs)))
    # Untimed steps first (other seeds), so the JVMs' JIT compiles before the clock runs.
    await asyncio.gather(*(drive(e, WARM_SEED + i, steps // 4, [0, 0]) for i, e in enumerate(envs)))
    counts = [0, 0]  # steps, resets
    cpu0, started = cpu_seconds(os.getpid()), time.perf_counter()
    await asyncio.gather(*(drive(e, i, steps, counts) for i, e in enumerate(envs)))
    elapsed = time.perf_counter() - started
    cpu1, n = cpu_seconds(os.getpid()), max(counts[0], 1)
    per_step = {kind: 1000 * (cpu1[kind] - cpu0[kind]) / n for kind in cpu1}
    return Rate(counts[0] / elapsed, counts[0], counts[1], per_step["python"], per_step["java"])


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
    return (f"  {kind:<10} {rate.steps_per_s:7.2f} steps/s  ({rate.steps} steps, {rate.resets} resets; CPU a step: "
            f"{rate.cpu_ms_per_step:.2f} ms = Python {rate.python_ms_per_step:.2f} + JVMs {rate.jvm_ms_per_step:.2f})")


@dataclass(frozen=True)
class Overhead:
    """What the server adds, three ways (percent of the in-process figure)."""

    wall: float  # steps/s lost
    cpu: float  # CPU a step added, every process
    python: float  # Python CPU a step added (HTTP both sides), against the in-process CPU a step

    @staticmethod
    def of(local: Rate, remote: Rate) -> Overhead:
        return Overhead(
            100 * (1 - remote.steps_per_s / local.steps_per_s),
            100 * (remote.cpu_ms_per_step / local.cpu_ms_per_step - 1),
            100 * (remote.python_ms_per_step - local.python_ms_per_step) / local.cpu_ms_per_step,
        )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0, help="steps per env = STEPS x this")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; {args.envs} envs (JVMs) each way, "
          f"{args.scale:g} x {STEPS} steps per env each; valid = valid_actions=True, max_valid_actions={CAP}; "
          f"free = valid_actions=False, actions from {len(FIXED)} fixed ones", flush=True)
    async with EnvServerProcess(["sciworld"], args=["--max-instances", str(4 * args.envs)],
                                startup_timeout_s=120.0) as server:
        overheads: dict[str, list[Overhead]] = {name: [] for name in args.workloads}
        for r in range(args.rounds):
            for name in args.workloads:
                env_args, steps = WORKLOADS[name], max(1, round(STEPS[name] * args.scale))
                if r % 2 == 0:  # alternate which way goes first, so drift falls on both
                    local = await in_process(env_args, args.envs, steps)
                    remote = await via_server(server, env_args, args.envs, steps)
                else:
                    remote = await via_server(server, env_args, args.envs, steps)
                    local = await in_process(env_args, args.envs, steps)
                o = Overhead.of(local, remote)
                overheads[name].append(o)
                print(f"round {r + 1} {name}: load average {os.getloadavg()[0]:.1f}\n"
                      f"{line('in process', local)}\n{line('via server', remote)}\n"
                      f"  server overhead {o.wall:+.1f}% in steps/s, {o.cpu:+.1f}% in CPU a step, "
                      f"{o.python:+.1f}% in Python CPU a step", flush=True)
        for name, rounds in overheads.items():
            print(f"{name}: median server overhead over {len(rounds)} round(s): "
                  f"{statistics.median(o.wall for o in rounds):+.1f}% in steps/s, "
                  f"{statistics.median(o.cpu for o in rounds):+.1f}% in CPU a step, "
                  f"{statistics.median(o.python for o in rounds):+.1f}% in Python CPU a step (goal < 10%)")


if __name__ == "__main__":
    asyncio.run(main())
