"""In-process env throughput: steps/s (random valid actions, resets included), resets/s
and snapshot+restore pairs/s for each env ("-" where the env cannot snapshot). Free-text
envs step with the actions in FREE_TEXT; TextWorld and ALFWorld cycle over TASK_CAP games (each
new game is generated and cached on first use, ~1-5 s).

    .venv/bin/python bench/env_steps.py [--seconds 1.0] [--only NAME ...]
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
    ("babyai", {}),
    ("textarena", {"game": "TowerOfHanoi-v0"}),
    ("textarena", {"game": "GuessTheNumber-v0"}),
    ("textarena", {"game": "Minesweeper-v0"}),
    ("textarena", {"game": "Crosswords-v0"}),
    ("textworld", {}),
    ("webshop", {}),
    ("webshop", {"products": 5000}),
    ("alfworld", {}),
    ("math", {}),
    ("sciworld", {}),
    ("sciworld", {"valid_actions": False}),
]
# Actions for envs without a valid-action list.
FREE_TEXT: dict[str, tuple[str, ...]] = {
    "math": ("execute: x = 2 ** 64", "execute: print(sum(range(10**5)))", "answer: 7"),
    "textarena": ("[0 0 a]", "[1 2 e]", "[2 1 s]"),
    "sciworld": ("look around", "open door to kitchen", "go to kitchen", "inventory", "wait1"),
}
TASK_CAP = {"textworld": 3, "alfworld": 3, "webshop": 2000}
# Steps or snapshot pairs (resets: a tenth of it) between two looks at the clock: slow envs look often.
BATCH = {"sciworld": 1, "math": 1, "textworld": 10, "alfworld": 5}


def steps_per_second(env: SyncEnv, seconds: float) -> float:
    rng = random.Random(0)
    task, steps = 0, 0
    cap = TASK_CAP.get(env.family, 10**9)
    free = FREE_TEXT.get(env.family, ())
    actions = env.reset_sync(task).valid_actions or free
    batch = BATCH.get(env.family, 100)
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(batch):
            if env.step_sync(rng.choice(actions)).done:
                task += 1
                actions = env.reset_sync(task % cap).valid_actions or free
        steps += batch
    return steps / elapsed


def resets_per_second(env: SyncEnv, seconds: float) -> float:
    resets = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(max(BATCH.get(env.family, 100) // 10, 1)):
            env.reset_sync(resets % TASK_CAP.get(env.family, 10**9))
            resets += 1
    return resets / elapsed


def snapshot_restores_per_second(env: SyncEnv, seconds: float) -> float | None:
    if not env.can_snapshot:
        return None
    env.reset_sync(1)
    pairs = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        batch = BATCH.get(env.family, 100)
        for _ in range(batch):
            env.restore_sync(env.snapshot_sync())
        pairs += batch
    return pairs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    parser.add_argument("--only", nargs="*", help="env names to measure (default: all)")
    options = parser.parse_args()
    seconds = options.seconds
    print(f"{'env':<42} {'steps/s':>10} {'resets/s':>10} {'snap+restore/s':>15}")
    for name, args in CONFIGS:
        if options.only and name not in options.only:
            continue
        env = make_env(name, **args)
        assert isinstance(env, SyncEnv)
        env.reset_sync(0)  # load shared data outside the timing
        label = name + "".join(f" {k}={v}" for k, v in args.items())
        rate = steps_per_second(env, seconds)
        resets = resets_per_second(env, seconds)
        pairs = snapshot_restores_per_second(env, seconds)
        shown = "-" if pairs is None else f"{pairs:,.0f}"
        print(f"{label:<42} {rate:>10,.1f} {resets:>10,.1f} {shown:>15}")
        close = getattr(env, "close_sync", None)
        if close is not None:
            close()  # ScienceWorld's JVM


if __name__ == "__main__":
    main()
