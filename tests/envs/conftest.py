"""The env servers the env tests share: one per test module (module scope); ALFWorld's generated
games, played once a session."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.env_server import FAMILIES, started
from thicket.envs.process import EnvServerProcess


@pytest.fixture(scope="module")
def server() -> Iterator[EnvServerProcess]:
    s = started(FAMILIES)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def small_server() -> Iterator[EnvServerProcess]:
    """Three instances at most, idle ones reaped after 1 s, frozenlake refusing steps once done."""
    s = started(["textcraft", "frozenlake"], "--max-instances", "3", "--idle-timeout", "1",
                "--refuse-after-done", "frozenlake")
    yield s
    s.stop()


ALFWORLD_TASKS = range(12)  # two of each task type


@pytest.fixture(scope="session")
def alf_cache(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated games are deterministic: kept across test runs (when pytest's cache is on)."""
    cache = getattr(pytestconfig, "cache", None)
    return Path(cache.mkdir("thicket-alfworld")) if cache else tmp_path_factory.mktemp("alfworld")


def _play(cache_dir: str, task: int) -> dict[str, Any]:
    """Task `task` through the env: its gold path, then (from the opening snapshot) its wrong path."""
    from thicket.envs import make_env
    from thicket.envs.alfworld import tasks
    from thicket.envs.alfworld.env import AlfWorldEnv
    from thicket.envs.alfworld.wording import Wording

    env = make_env("alfworld", cache_dir=cache_dir)
    assert isinstance(env, AlfWorldEnv)
    obs = env.reset_sync(task)
    opening = env.snapshot_sync()
    game = tasks.make_game(task, env.traj_data["thicket"]["attempt"])
    gold, wrong = tasks.gold_path(game, Wording.V211), tasks.wrong_path(game, Wording.V211)
    out: dict[str, Any] = {"type": env.traj_data["task_type"], "intro": obs.text, "walkthrough": env.walkthrough,
                           "gold": gold, "admissible": [], "gold_steps": [], "wrong_steps": []}
    for action in gold:
        out["admissible"].append(action in (obs.valid_actions or ()))
        t = env.step_sync(action)
        obs = t.observation
        out["gold_steps"].append((t.reward, t.done, t.success))
    env.restore_sync(opening)
    for action in wrong:
        t = env.step_sync(action)
        out["wrong_steps"].append((t.reward, t.done, t.success))
    env.close_sync()
    return out


@pytest.fixture(scope="session")
def played(alf_cache: Path) -> dict[int, dict[str, Any]]:
    """Every task of ALFWORLD_TASKS generated (if not cached) and played, two processes at a time."""
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        results = pool.map(_play, [str(alf_cache)] * len(ALFWORLD_TASKS), ALFWORLD_TASKS)
        return dict(zip(ALFWORLD_TASKS, results, strict=True))
