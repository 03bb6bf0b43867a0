"""Recording env steps, for snapshot/replay equivalence tests."""

from __future__ import annotations

import random
from typing import Any

from thicket.envs import SyncEnv, Transition

Step = tuple[str, tuple[str, ...] | None, float, bool, bool]


def as_step(t: Transition) -> Step:
    return (t.observation.text, t.observation.valid_actions, t.reward, t.done, t.success)


def rollout(env: SyncEnv, actions: list[str]) -> list[Step]:
    return [as_step(env.step_sync(action)) for action in actions]


def walk(env: SyncEnv, valid: tuple[str, ...] | None, rng: random.Random, steps: int,
         extra: tuple[str, ...] = (), record: list[Step] | None = None) -> tuple[list[str], tuple[str, ...] | None]:
    """Up to `steps` random actions from the env's valid lists (mixing in `extra`), stopping
    when the episode ends; returns the actions and the valid list after the last one."""
    taken: list[str] = []
    for _ in range(steps):
        if not valid:
            break
        action = rng.choice(extra) if extra and rng.random() < 0.2 else rng.choice(valid)
        t = env.step_sync(action)
        taken.append(action)
        if record is not None:
            record.append(as_step(t))
        valid = t.observation.valid_actions
        if t.done:
            break
    return taken, valid


def assert_snapshot_exact(make: Any, task: int, prefix_steps: int, seed: int,
                          extra: tuple[str, ...] = ()) -> None:
    """Snapshot mid-episode; what follows is the same after a restore, also into a fresh env."""
    rng = random.Random(seed)
    env = make()
    obs = env.reset_sync(task)
    _, valid = walk(env, obs.valid_actions, rng, prefix_steps, extra)
    assert valid, "the prefix ended the episode: pick another task or seed"
    state = env.snapshot_sync()
    first: list[Step] = []
    continuation, _ = walk(env, valid, rng, 12, extra, record=first)
    assert continuation
    env.restore_sync(state)
    assert rollout(env, continuation) == first
    fresh = make()
    fresh.restore_sync(state)
    assert rollout(fresh, continuation) == first
    fresh.restore_sync(state)  # restoring does not consume the snapshot
    assert rollout(fresh, continuation) == first
