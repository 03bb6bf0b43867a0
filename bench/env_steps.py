"""In-process env throughput: steps/s (random valid actions, resets included), resets/s
and snapshot+restore pairs/s for each env.

    .venv/bin/python bench/env_steps.py [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from thicket.envs import SyncEnv, make_env

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("textcraft", {}),
    ("frozenlake", {}),
    ("frozenlake", {"size": 8, "is_slippery": True}),
    ("cliffwalking", {}),
    ("cliffwalking", {"is_slippery": True}),
    ("taxi", {}),
    ("taxi", {"is_rainy": True, "fickle_passenger": True}),
]


def steps_per_second(env: SyncEnv, seconds: float) -> float:
    rng = random.Random(0)
    task, steps = 0, 0
    actions = env.reset_sync(task).valid_actions or ()
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(100):
            if env.step_sync(rng.choice(actions)).done:
                task += 1
                actions = env.reset_sync(task).valid_actions or ()
        steps += 100
    return steps / elapsed


def resets_per_second(env: SyncEnv, seconds: float) -> float:
    resets = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(10):
            env.reset_sync(resets)
            resets += 1
    return resets / elapsed


def snapshot_restores_per_second(env: SyncEnv, seconds: float) -> float:
    env.reset_sync(1)
    pairs = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(100):
            env.restore_sync(env.snapshot_sync())
        pairs += 100
    return pairs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    seconds = parser.parse_args().seconds
    print(f"{'env':<42} {'steps/s':>10} {'resets/s':>10} {'snap+restore/s':>15}")
    for name, args in CONFIGS:
        env = make_env(name, **args)
        assert isinstance(env, SyncEnv)
        env.reset_sync(0)  # load shared data outside the timing
        label = name + "".join(f" {k}={v}" for k, v in args.items())
        rate = steps_per_second(env, seconds)
        resets = resets_per_second(env, seconds)
        pairs = snapshot_restores_per_second(env, seconds)
        print(f"{label:<42} {rate:>10,.0f} {resets:>10,.0f} {pairs:>15,.0f}")


if __name__ == "__main__":
    main()
