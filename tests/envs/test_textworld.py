"""TextWorld: generated games (cached) whose walkthroughs win, deterministic resets, admissible
commands, exact snapshot/restore."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.env_steps import assert_snapshot_exact, rollout
from thicket.envs import make_env
from thicket.envs.textworld_games import TextWorldEnv


TW_ARGS = {"world_size": 3, "nb_objects": 6, "quest_length": 3}


@pytest.fixture(scope="module")
def tw_cache(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated games are deterministic, so they are kept across test runs (when pytest's
    cache is on)."""
    cache = getattr(pytestconfig, "cache", None)
    return Path(cache.mkdir("thicket-textworld")) if cache else tmp_path_factory.mktemp("textworld")


def test_textworld_walkthroughs_win(tw_cache: Path) -> None:
    env = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
    assert isinstance(env, TextWorldEnv)
    for task in (0, 1):
        obs = env.reset_sync(task)
        assert obs.valid_actions and "$$" not in obs.text and obs.text.strip()
        plan = list(env.walkthrough)
        assert plan
        steps = rollout(env, plan)
        assert not any(s[3] for s in steps[:-1])
        assert steps[-1][2:] == (1.0, True, True)
        assert env.step_sync("look").observation.text == "The episode is over."


def test_textworld_reset_is_deterministic(tw_cache: Path) -> None:
    a = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
    b = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
    obs = a.reset_sync(1)
    assert b.reset_sync(1) == obs
    assert a.reset_sync(0) != obs
    actions = ["look", "inventory", *obs.valid_actions[:5], "dance"]  # type: ignore[misc]
    a.reset_sync(1)
    first = rollout(a, actions)
    assert rollout(b, actions) == first
    assert "not a verb" in first[-1][0]


def test_textworld_admissible_commands_are_understood(tw_cache: Path) -> None:
    env = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
    obs = env.reset_sync(0)
    state = env.snapshot_sync()
    for action in obs.valid_actions or ():
        env.restore_sync(state)
        text = env.step_sync(action).observation.text
        assert "not a verb" not in text and "can't see any such thing" not in text, (action, text)


@pytest.mark.parametrize("task", [0, 1])
def test_textworld_snapshot_restore_is_exact(tw_cache: Path, task: int) -> None:
    def make() -> TextWorldEnv:
        env = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
        assert isinstance(env, TextWorldEnv)
        return env

    assert_snapshot_exact(make, task, prefix_steps=4, seed=task, extra=("look", "dance", "take all"))
    env = make()
    env.reset_sync(task)
    plan = list(env.walkthrough)
    rollout(env, plan[:-1])
    state = env.snapshot_sync()
    assert rollout(env, plan[-1:])[-1][4]  # wins from the snapshot ...
    fresh = make()
    fresh.restore_sync(state)
    assert rollout(fresh, plan[-1:])[-1][2:] == (1.0, True, True)  # ... and from its restore
