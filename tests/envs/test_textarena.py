"""TextArena games: deterministic and solvable, valid and free-text actions, exact
snapshot/restore whatever the global random state."""

from __future__ import annotations

import random

import pytest

from tests.support.env_steps import assert_snapshot_exact, rollout
from thicket.envs.textarena_games import TextArenaEnv


ARENA = ["TowerOfHanoi-v0", "GuessTheNumber-v0", "Minesweeper-v0-small", "Crosswords-v0"]


def _arena_solution(env: TextArenaEnv) -> list[str]:
    if env.base != "Minesweeper":
        return env.solution()
    first = "[2 2]"
    env.step_sync(first)  # mines are placed on the first move
    game = env.game
    return [f"[{r} {c}]" for r in range(game.rows) for c in range(game.cols)
            if game.grid[r][c] != -1 and not game.revealed[r][c]]


@pytest.mark.parametrize("game", ARENA)
def test_textarena_deterministic_and_solvable(game: str) -> None:
    a, b = TextArenaEnv(game), TextArenaEnv(game)
    for task in (0, 5):
        obs = a.reset_sync(task)
        random.random()  # the games draw from the global `random`: others using it must not matter
        assert b.reset_sync(task) == obs
        moves = _arena_solution(a)
        b_moves = _arena_solution(b)
        assert moves == b_moves
        steps = rollout(a, moves)
        assert steps[-1][2:] == (1.0, True, True), (game, steps[-1])
        assert not any(s[3] for s in steps[:-1])


@pytest.mark.parametrize("game", ARENA[:3])
def test_textarena_valid_actions_are_accepted(game: str) -> None:
    env = TextArenaEnv(game)
    obs = env.reset_sync(1)
    assert obs.valid_actions
    state = env.snapshot_sync()
    for action in obs.valid_actions:
        env.restore_sync(state)
        t = env.step_sync(action)
        assert "invalid move" not in t.observation.text.lower(), (action, t.observation.text)
    env.restore_sync(state)
    t = env.step_sync("hello")
    assert "invalid move" in t.observation.text.lower() and not t.done  # one warning first
    t = env.step_sync("hello again")
    assert t.done and not t.success and t.info["invalid_move"]


def test_textarena_crosswords_has_free_text_actions() -> None:
    env = TextArenaEnv("Crosswords-v0")
    assert env.reset_sync(0).valid_actions is None


@pytest.mark.parametrize("game", ARENA)
def test_textarena_snapshot_restore_is_exact(game: str) -> None:
    def make() -> TextArenaEnv:
        return TextArenaEnv(game)

    env = make()
    env.reset_sync(4)
    state = env.snapshot_sync()  # before Minesweeper's first move: its mines are not placed yet
    moves = _arena_solution(env)[:6] + ["[9 9 9]"]
    env.restore_sync(state)
    first = rollout(env, moves)
    for target in (env, make()):
        target.restore_sync(state)
        random.seed(12345)  # global RNG state must not leak into the game
        assert rollout(target, moves) == first
    if game != "Crosswords-v0":  # no valid-action list to walk on
        assert_snapshot_exact(make, 2, prefix_steps=2, seed=7)
