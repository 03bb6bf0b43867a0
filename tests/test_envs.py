"""Env semantics: determinism per task index, exact snapshot/restore, action handling."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from thicket.envs import SyncEnv, env_names, make_env
from thicket.envs.textcraft import (
    TextCraftEnv,
    TextCraftSnapshot,
    goals,
    gold_path,
    make_task,
)
from thicket.envs.toytext import ToyTextEnv, ToyTextSnapshot

from env_steps import rollout

CASES: list[tuple[str, dict[str, Any]]] = [
    ("textcraft", {}),
    ("frozenlake", {}),
    ("frozenlake", {"is_slippery": True}),
    ("frozenlake", {"size": 8, "is_slippery": True}),
    ("cliffwalking", {}),
    ("cliffwalking", {"is_slippery": True}),
    ("taxi", {}),
    ("taxi", {"is_rainy": True, "fickle_passenger": True}),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in args.items()) for name, args in CASES]
STOCHASTIC = [c for c in CASES if c[1].get("is_slippery") or c[1].get("is_rainy")]
STOCHASTIC_IDS = [IDS[CASES.index(c)] for c in STOCHASTIC]



def make(name: str, args: dict[str, Any]) -> SyncEnv:
    env = make_env(name, **args)
    assert isinstance(env, SyncEnv) and env.can_snapshot
    return env


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


def _taxi_path(env: ToyTextEnv, goal: Any) -> list[str]:
    """Shortest action list to a state passing `goal` (breadth-first over dry transitions)."""
    game = env.game
    start = int(game.s)
    paths: dict[int, list[str]] = {start: []}
    frontier = [start]
    while frontier:
        state = frontier.pop(0)
        if goal(state):
            return paths[state]
        for action, name in enumerate(env.action_names):
            (_, nxt, _, _), = game.P[state][action]
            if nxt not in paths:
                paths[nxt] = paths[state] + [name]
                frontier.append(nxt)
    raise AssertionError("unreachable goal")


def test_taxi_fickle_passenger_state_is_snapshotted() -> None:
    env = make("taxi", {"fickle_passenger": True})
    assert isinstance(env, ToyTextEnv)
    for task in range(100):
        env.reset_sync(task)
        if env.game.fickle_step:
            break
    pickup = _taxi_path(env, lambda s: env.game.decode(s)[2] == 4)
    rollout(env, pickup)
    snapshot = env.snapshot_sync()
    moves = ["north", "south", "east", "west"] * 3
    first = rollout(env, moves)
    env.restore_sync(snapshot)
    assert rollout(env, moves) == first
    env.restore_sync(dataclasses.replace(snapshot, extra=(False, 0)))
    assert rollout(env, moves) != first  # the destination no longer changes


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


# --- actions --------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "args"), CASES[1:], ids=IDS[1:])
def test_toytext_valid_actions_are_accepted(name: str, args: dict[str, Any]) -> None:
    env = make(name, args)
    obs = env.reset_sync(2)
    assert isinstance(env, ToyTextEnv)
    assert obs.valid_actions == env.action_names
    for action in env.action_names:
        env.reset_sync(2)
        step = env.step_sync(action)
        assert "Invalid" not in step.observation.text
        assert "raw_reward" in step.info and step.info["steps"] == 1


@pytest.mark.parametrize(("name", "args"), CASES[1:], ids=IDS[1:])
def test_toytext_invalid_action_changes_nothing(name: str, args: dict[str, Any]) -> None:
    env = make(name, args)
    env.reset_sync(2)
    env.step_sync(env.reset_sync(2).valid_actions[1])  # type: ignore[index]
    before = env.snapshot_sync()
    step = env.step_sync("teleport")
    assert "Invalid action" in step.observation.text
    assert (step.reward, step.done, step.success) == (0.0, False, False)
    assert env.snapshot_sync() == before


def test_toytext_action_numbering_matches_gymnasium() -> None:
    frozen = make("frozenlake", {})
    assert frozen.reset_sync(0).text.splitlines()[1:3] == ["XFFF", "HHFF"]
    moves = {"right": (0, 1), "down": (1, 1), "up": (0, 1), "left": (0, 0)}
    frozen.step_sync("right")
    for action, (row, col) in moves.items():
        text = frozen.step_sync(action).observation.text
        assert f"at row {row}, column {col + 1};" in text, (action, text)
    cliff = make("cliffwalking", {})
    cliff.reset_sync(0)
    moves = {"up": "row 2, column 0", "right": "row 2, column 1", "left": "row 2, column 0"}
    for action, where in moves.items():
        assert f"You are at {where};" in cliff.step_sync(action).observation.text
    assert "You are at row 3, column 0;" in cliff.step_sync("down").observation.text
    taxi = make("taxi", {})
    assert isinstance(taxi, ToyTextEnv)
    taxi.reset_sync(0)
    row, col, _, _ = taxi.game.decode(int(taxi.game.s))
    vertical = "north" if row == 4 else "south"
    step = taxi.step_sync(vertical)
    new_row = row + (1 if vertical == "south" else -1)
    assert f"T is at row {new_row}, column {col}." in step.observation.text
    assert "was not possible" in taxi.step_sync("dropoff").observation.text


def test_toytext_success_and_rewards() -> None:
    cliff = make("cliffwalking", {})
    cliff.reset_sync(0)
    steps = rollout(cliff, ["up"] + ["right"] * 11 + ["down"])
    assert steps[-1][2:] == (1.0, True, True)
    assert all(s[2] == 0.0 for s in steps[:-1])
    cliff.reset_sync(0)
    fall = cliff.step_sync("right")
    assert (fall.reward, fall.done, fall.info["raw_reward"]) == (0.0, False, -100.0)

    taxi = make("taxi", {})
    assert isinstance(taxi, ToyTextEnv)
    taxi.reset_sync(11)
    path = _taxi_path(taxi, lambda s: taxi.game.decode(s)[2] == 4)
    rollout(taxi, path)
    dest = taxi.game.locs[taxi.game.decode(int(taxi.game.s))[3]]
    path = _taxi_path(taxi, lambda s: taxi.game.decode(s)[:2] == dest)
    *_, last = rollout(taxi, path + ["dropoff"])
    assert last[2:] == (1.0, True, True)
    assert "episode is over" in taxi.step_sync("north").observation.text


def test_frozenlake_truncates_at_time_limit() -> None:
    env = make("frozenlake", {})
    env.reset_sync(0)
    for _ in range(99):
        assert not env.step_sync("up").done  # bumping into the top wall
    last = env.step_sync("up")
    assert last.done and not last.success and last.info["truncated"]

    env.reset_sync(0)
    rollout(env, ["up"] * 95)
    fresh = make("frozenlake", {})
    fresh.restore_sync(env.snapshot_sync())
    assert [done for *_, done, _ in rollout(fresh, ["up"] * 5)] == [False] * 4 + [True]


def test_textcraft_observation_format() -> None:
    obs = make("textcraft", {}).reset_sync(0)
    head, goal = obs.text.split("\n\nGoal: craft ")
    assert head.startswith("Crafting commands:\n") and goal.endswith(".")
    assert all(line.startswith("craft ") for line in head.splitlines()[1:])
    assert obs.valid_actions == tuple(sorted(set(obs.valid_actions or ())))
    assert "inventory" in (obs.valid_actions or ())


def test_textcraft_valid_actions_succeed_when_possible() -> None:
    env = make("textcraft", {})
    assert isinstance(env, TextCraftEnv)
    for index in range(0, len(goals()), 23):
        task = make_task(index)
        for craft in task.crafts:
            env.restore_sync(TextCraftSnapshot(task, craft.inputs, False, 0))
            text = env.step_sync(craft.command).observation.text
            assert text.startswith(f"Crafted {craft.count} "), (craft.command, text)
        for item, n in task.gets:
            env.restore_sync(TextCraftSnapshot(task, (), False, 0))
            action = f"get {n} {item.removeprefix('minecraft:').replace('_', ' ')}"
            assert action in task.valid_actions
            assert env.step_sync(action).observation.text == f"Got {n} {action[len(f'get {n} '):]}"


def test_textcraft_gold_paths_reach_the_goal() -> None:
    tasks = [make_task(i) for i in range(len(goals()))]
    plans = [gold_path(task) for task in tasks]
    assert all(plan is not None for plan in plans)  # every goal of this data set is craftable
    env = make("textcraft", {})
    for task, plan in zip(tasks[::7], plans[::7], strict=True):
        env.reset_sync(task.index)
        assert plan and set(plan) <= set(task.valid_actions)
        steps = rollout(env, plan)
        assert not any(done for *_, done, _ in steps[:-1])
        assert steps[-1][2:] == (1.0, True, True), (task.goal, steps[-1])


def test_textcraft_invalid_and_malformed_actions() -> None:
    env = make("textcraft", {})
    env.reset_sync(0)
    env.step_sync("get 1 oak logs")
    env.step_sync("craft 4 oak planks using 1 oak logs")
    before = env.snapshot_sync()
    for action in ("dance", "get 1 stick", "craft 1 cyan banner using 6 cyan wool, 1 stick",
                   "craft 4 stick using 2 oak planks, 2 oak planks", "craft 4 stick using oak"):
        step = env.step_sync(action)
        assert (step.reward, step.done, step.success) == (0.0, False, False), action
        assert dataclasses.replace(env.snapshot_sync(), steps=before.steps) == before, action
    inventory = env.step_sync("inventory").observation.text
    assert inventory.startswith("Inventory: [oak planks] (4)")


def test_textcraft_leaves_the_package_tree_untouched() -> None:
    tree = TextCraftEnv()._game.crafting_tree
    sizes = {k: len(v) for k, v in tree.itemid_recipes.items()}
    for index in range(0, 400, 40):
        make_task.__wrapped__(index)
    assert sizes == {k: len(v) for k, v in tree.itemid_recipes.items()}


def test_textcraft_instances_share_the_tree() -> None:
    assert TextCraftEnv()._game.crafting_tree is TextCraftEnv()._game.crafting_tree
    task = make_task(len(goals()) + 3)
    assert task.goal == make_task(3).goal and task.index == len(goals()) + 3


# --- protocol -------------------------------------------------------------------------


def test_registry_lists_every_env() -> None:
    assert {"textcraft", "frozenlake", "cliffwalking", "taxi"} <= set(env_names())
    for name, args in CASES:
        assert make_env(name, **args).instructions.strip()


async def test_async_protocol_matches_sync() -> None:
    env = make_env("taxi", is_rainy=True)
    obs = await env.reset(4)
    state = await env.snapshot()
    first = [await env.step(a) for a in ("north", "west", "pickup")]
    await env.restore(state)
    assert [await env.step(a) for a in ("north", "west", "pickup")] == first
    assert obs == await env.reset(4)
