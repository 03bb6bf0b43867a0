"""The env protocol on TextCraft and the toy-text games: exact snapshot/restore, determinism per
task index (also across processes), the async protocol matching the sync one."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.support.env_cases import CASES, IDS, STOCHASTIC, STOCHASTIC_IDS, make
from tests.support.env_steps import rollout
from thicket.envs import SyncEnv, make_env
from thicket.envs.textcraft import TextCraftEnv, gold_path
from thicket.envs.toytext import ToyTextEnv, ToyTextSnapshot


def mid_episode(env: SyncEnv, rng: random.Random) -> tuple[int, list[str]]:
    """Reset to some task and take a few steps without ending the episode."""
    for task in range(100):
        obs = env.reset_sync(task)
        assert obs.valid_actions
        if isinstance(env, TextCraftEnv):
            plan = gold_path(env.task)
            assert plan is not None
            prefix = plan[: len(plan) // 2]
        else:
            prefix = [rng.choice(obs.valid_actions) for _ in range(4)]
        if not any(step[3] for step in rollout(env, prefix)):
            return task, prefix
    raise AssertionError("no task stays alive for four random steps")


def continuation(env: SyncEnv, rng: random.Random) -> list[str]:
    """A sequence mixing valid, invalid and (for TextCraft) goal-reaching actions."""
    if isinstance(env, TextCraftEnv):
        valid = env.task.valid_actions
    else:
        assert isinstance(env, ToyTextEnv)
        valid = env.action_names
    actions = [rng.choice(valid) for _ in range(30)]
    actions[5:5] = ["dance", "craft 4 stick using 1 oak planks, 1 oak planks"]
    if isinstance(env, TextCraftEnv):
        actions = actions[:10] + (gold_path(env.task) or [])
    return actions


# --- snapshot / restore ---------------------------------------------------------------


@pytest.mark.parametrize(("name", "args"), CASES, ids=IDS)
def test_restore_replays_exactly(name: str, args: dict[str, Any]) -> None:
    rng = random.Random(7)
    env = make(name, args)
    task, _ = mid_episode(env, rng)
    snapshot = env.snapshot_sync()
    actions = continuation(env, rng)
    first = rollout(env, actions)

    env.restore_sync(snapshot)
    assert rollout(env, actions) == first
    env.restore_sync(snapshot)  # a snapshot can be restored any number of times
    assert rollout(env, actions) == first

    fresh = make(name, args)
    fresh.restore_sync(snapshot)
    assert rollout(fresh, actions) == first

    elsewhere = make(name, args)
    elsewhere.reset_sync(task + 1)  # another task (another FrozenLake map) was loaded
    elsewhere.restore_sync(snapshot)
    assert rollout(elsewhere, actions) == first


@pytest.mark.parametrize(("name", "args"), CASES, ids=IDS)
def test_restore_carries_the_done_flag(name: str, args: dict[str, Any]) -> None:
    env = make(name, args)
    mid_episode(env, random.Random(3))
    finished = dataclasses.replace(env.snapshot_sync(), done=True)
    fresh = make(name, args)
    fresh.restore_sync(finished)
    step = fresh.step_sync("inventory" if name == "textcraft" else "up")
    assert step.done and step.observation.text == "The episode is over."
    fresh.restore_sync(dataclasses.replace(finished, done=False))
    assert not fresh.step_sync("inventory" if name == "textcraft" else "up").done


@pytest.mark.parametrize(("name", "args"), STOCHASTIC, ids=STOCHASTIC_IDS)
def test_snapshot_holds_the_random_generator(name: str, args: dict[str, Any]) -> None:
    """Restoring the same position with another generator state must change the outcome."""
    env = make(name, args)
    env.reset_sync(3)
    snapshot = env.snapshot_sync()
    assert isinstance(snapshot, ToyTextSnapshot)
    assert isinstance(env, ToyTextEnv)
    rng = random.Random(1)
    actions = [rng.choice(env.action_names) for _ in range(60)]
    original = rollout(env, actions)
    outcomes = set()
    for seed in range(5):
        other = np.random.Generator(np.random.PCG64(seed)).bit_generator.state
        env.restore_sync(dataclasses.replace(snapshot, rng_state=other))
        outcomes.add(repr(rollout(env, actions)))
    assert outcomes - {repr(original)}


# --- determinism ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "args"), CASES, ids=IDS)
def test_reset_is_deterministic_per_task(name: str, args: dict[str, Any]) -> None:
    a, b = make(name, args), make(name, args)
    texts = set()
    for task in (0, 1, 5, 42):
        obs = a.reset_sync(task)
        assert b.reset_sync(task) == obs
        texts.add(obs.text)
        actions = [random.Random(task).choice(obs.valid_actions or ()) for _ in range(20)]
        first = rollout(a, actions)
        assert rollout(b, actions) == first
        assert a.reset_sync(task) == obs  # a reset clears everything the episode did
        assert rollout(a, actions) == first
    if name != "cliffwalking":  # one fixed board; every task looks the same at the start
        assert len(texts) > 1


_DIGEST_SCRIPT = """
import hashlib, json
from thicket.envs import make_env
from thicket.envs.textcraft import gold_path, make_task
h = hashlib.sha256()
for task in (0, 1, 57, 200, 418, 1000):
    t = make_task(task)
    h.update(json.dumps([t.text, t.valid_actions, gold_path(t)]).encode())
for name, args in [("frozenlake", {"is_slippery": True, "size": 6}),
                   ("taxi", {"is_rainy": True, "fickle_passenger": True})]:
    env = make_env(name, **args)
    for task in (0, 9):
        obs = env.reset_sync(task)
        h.update(obs.text.encode())
        for i in range(40):
            step = env.step_sync(obs.valid_actions[i % len(obs.valid_actions)])
            h.update(repr((step.observation.text, step.reward, step.done)).encode())
print(h.hexdigest())
"""


def _digest_in_subprocess(hash_seed: str) -> str:
    env = os.environ | {"PYTHONHASHSEED": hash_seed}
    result = subprocess.run(
        [sys.executable, "-c", _DIGEST_SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def test_tasks_identical_across_processes() -> None:
    digests = {_digest_in_subprocess(seed) for seed in ("0", "4242")}
    assert len(digests) == 1


async def test_async_protocol_matches_sync() -> None:
    env = make_env("taxi", is_rainy=True)
    obs = await env.reset(4)
    state = await env.snapshot()
    first = [await env.step(a) for a in ("north", "west", "pickup")]
    await env.restore(state)
    assert [await env.step(a) for a in ("north", "west", "pickup")] == first
    assert obs == await env.reset(4)
