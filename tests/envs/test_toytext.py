"""The toy-text games (FrozenLake, CliffWalking, Taxi): actions as gymnasium numbers them,
invalid actions, rewards and success, the time limit, Taxi's fickle passenger in a snapshot."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.support.env_cases import CASES, IDS, make
from tests.support.env_steps import rollout
from thicket.envs.toytext import ToyTextEnv


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
