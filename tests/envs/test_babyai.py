"""BabyAI: task indexing and text, determinism per task, the bot's success, invalid actions,
exact snapshot/restore with the generator."""

from __future__ import annotations

import random

import pytest

from tests.support.env_steps import assert_snapshot_exact, rollout
from thicket.envs.babyai import ACTIONS, BabyAIEnv


def test_babyai_task_indexing_and_text() -> None:
    env = BabyAIEnv()
    levels = env.levels
    assert list(levels) == sorted(levels) and not any("Debug" in lvl for lvl in levels)
    assert env.level_of(0) == (levels[0], 0)
    assert env.level_of(len(levels) + 3) == (levels[3], 1)
    obs = env.reset_sync(5)
    assert obs.valid_actions == ACTIONS
    assert obs.text.startswith(f"Mission: {env.game.mission}.")
    assert "You are carrying nothing." in obs.text and "In front of you:" in obs.text


def test_babyai_reset_is_deterministic_per_task() -> None:
    a, b = BabyAIEnv(), BabyAIEnv()
    texts = set()
    for task in (0, 7, 91, 200):
        obs = a.reset_sync(task)
        assert b.reset_sync(task) == obs
        texts.add(obs.text)
        actions = [random.Random(task).choice(ACTIONS) for _ in range(25)]
        first = rollout(a, actions)
        assert rollout(b, actions) == first
        assert a.reset_sync(task) == obs
    assert len(texts) == 4


def test_babyai_bot_reaches_the_goal() -> None:
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = BabyAIEnv(["BabyAI-GoToRedBall-v0", "BabyAI-UnlockLocal-v0", "BabyAI-PutNextLocal-v0"])
    for task in range(6):
        env.reset_sync(task)
        bot = BabyAIBot(env.game)
        for _ in range(env.game.max_steps):
            t = env.step_sync(ACTIONS[int(bot.replan())])
            assert "Invalid" not in t.observation.text
            if t.done:
                break
        assert (t.reward, t.done, t.success) == (1.0, True, True), env.level_of(task)
        assert t.info["raw_reward"] > 0
        assert env.step_sync("go forward").observation.text == "The episode is over."


def test_babyai_invalid_action_changes_nothing() -> None:
    env = BabyAIEnv()
    env.reset_sync(3)
    env.step_sync("turn left")
    before = env.snapshot_sync()
    t = env.step_sync("fly away")
    assert "Invalid action" in t.observation.text and (t.reward, t.done) == (0.0, False)
    after = env.snapshot_sync()
    assert after == before
    first_line = env.step_sync("Go Forward.").observation.text.split("\n")[0]  # case, spaces, "."
    assert first_line == "You move forward." or first_line.startswith("You cannot move forward")


@pytest.mark.parametrize("task", [2, 40, 95])
def test_babyai_snapshot_restore_is_exact(task: int) -> None:
    assert_snapshot_exact(BabyAIEnv, task, prefix_steps=8, seed=task)


def test_babyai_snapshot_keeps_the_rng() -> None:
    env = BabyAIEnv(["BabyAI-GoToLocal-v0"])
    env.reset_sync(1)
    state = env.snapshot_sync()
    draws = env.game.np_random.integers(0, 10**9, size=4).tolist()
    env.restore_sync(state)
    assert env.game.np_random.integers(0, 10**9, size=4).tolist() == draws
