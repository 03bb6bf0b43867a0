"""ALFWorld, generated games: every game of a seed range is won by its gold path through the
env and never by its wrong path; exact snapshots; the same games in every process; the
rules of docs/envs/alfworld.md, row by row; bad inputs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.env_steps import assert_snapshot_exact
from thicket.envs import make_env
from thicket.envs.alfworld import tasks
from thicket.envs.alfworld.env import AlfWorldEnv
from thicket.envs.alfworld.wording import Wording
from thicket.envs.protocol import RewardSemantics
from thicket.errors import BadInput

from tests.envs.conftest import ALFWORLD_TASKS as TASKS

INTRO = "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see "


def test_every_task_type_is_covered_twice(played: dict[int, dict[str, Any]]) -> None:
    assert Counter(p["type"] for p in played.values()) == Counter({t: 2 for t in tasks.TASK_TYPES})


@pytest.mark.parametrize("task", TASKS)
def test_the_gold_path_wins_at_its_last_step_and_the_wrong_path_never(played: dict[int, dict[str, Any]],
                                                                        task: int) -> None:
    p = played[task]
    assert tuple(p["walkthrough"]) == tuple(p["gold"])  # the game file's walkthrough is the gold path
    assert all(p["admissible"])
    assert p["gold_steps"][-1] == (1.0, True, True)
    assert all(step == (0.0, False, False) for step in p["gold_steps"][:-1])
    assert all(step == (0.0, False, False) for step in p["wrong_steps"])


def test_the_opening_reads_as_alfworld_shows_it(played: dict[int, dict[str, Any]]) -> None:
    for p in played.values():
        assert p["intro"].startswith(INTRO)
        head, task_line = p["intro"].rsplit("\n\n", 1)
        assert task_line.startswith("Your task is to: ") and task_line.endswith(".")


def _env(alf_cache: Path, **args: Any) -> AlfWorldEnv:
    env = make_env("alfworld", cache_dir=str(alf_cache), **args)
    assert isinstance(env, AlfWorldEnv)
    return env


@pytest.fixture(scope="module")
def env0(alf_cache: Path, played: dict[int, dict[str, Any]]) -> AlfWorldEnv:
    """One env for the rule tests: task 0's game stays loaded, each reset restores its opening."""
    return _env(alf_cache)


def test_snapshot_restore_is_exact_also_into_a_fresh_env(alf_cache: Path, played: dict[int, dict[str, Any]]) -> None:
    assert_snapshot_exact(lambda: _env(alf_cache), task=3, prefix_steps=4, seed=1, extra=("jump", "look"))


# --- the rules table (docs/envs/alfworld.md), one test per row ---


def test_rule_success_gives_reward_1_and_ends_and_nothing_follows(env0: AlfWorldEnv) -> None:
    env = env0
    assert env.reward_semantics is RewardSemantics.INCREMENT
    env.reset_sync(0)
    *_, last = [env.step_sync(a) for a in env.walkthrough]
    assert (last.reward, last.done, last.success, last.observation.valid_actions) == (1.0, True, True, ())
    after = env.step_sync("look")
    assert (after.observation.text, after.reward, after.done) == ("The episode is over.", 0.0, True)


def test_rule_an_invalid_command_answers_nothing_happens_and_takes_a_turn(alf_cache: Path, env0: AlfWorldEnv) -> None:
    env = env0
    obs = env.reset_sync(0)
    t = env.step_sync("dance with the fridge")
    assert (t.observation.text, t.reward, t.done, t.info["steps"]) == ("Nothing happens.", 0.0, False, 1)
    assert t.observation.valid_actions == obs.valid_actions


def test_rule_max_steps_ends_the_episode_unsolved(alf_cache: Path, env0: AlfWorldEnv) -> None:
    assert _env(alf_cache, max_steps=2).max_steps == 2
    env0.max_steps = 2
    try:
        env0.reset_sync(0)
        assert not env0.step_sync("dance").done
        t = env0.step_sync("look")  # the second turn of max_steps=2: ends unsolved
        assert (t.reward, t.done, t.success, t.info["truncated"]) == (0.0, True, False, True)
    finally:
        env0.max_steps = None


def test_rule_no_turn_limit_by_default(env0: AlfWorldEnv) -> None:
    env = env0
    env.reset_sync(0)
    assert not any(env.step_sync("inventory").done for _ in range(50))


def test_rule_wording_2_1_1_puts_in_on_and_arrives_at_a_location(env0: AlfWorldEnv) -> None:
    env = env0
    obs = env.reset_sync(0)
    assert "help" not in (obs.valid_actions or ())
    texts = [env.step_sync(a).observation.text for a in env.walkthrough]
    assert texts[0].startswith("You arrive at loc ")
    assert env.walkthrough[-1].startswith("put ") and " in/on " in env.walkthrough[-1]
    assert texts[-1].startswith("You put the ") and " in/on the " in texts[-1]


def test_rule_wording_2_1_2_moves_to_and_arrives_at_the_receptacle(alf_cache: Path) -> None:
    env = _env(alf_cache, wording="2.1.2")
    obs = env.reset_sync(0)
    assert "help" in (obs.valid_actions or ())
    texts = [env.step_sync(a).observation.text for a in env.walkthrough]
    first_place = env.walkthrough[0].removeprefix("go to ")
    assert texts[0].startswith(f"You arrive at {first_place}.")
    assert env.walkthrough[-1].startswith("move ") and " to " in env.walkthrough[-1]
    assert texts[-1].startswith("You move the ")


def test_rule_a_command_is_matched_as_alfworlds_engine_matches_it(env0: AlfWorldEnv) -> None:
    """ALFWorld's PddlEnv.step strips the command and looks it up as it is: inner spaces and
    capitals are not forgiven (tests/envs/test_alfworld_agentgym.py plays the same in ALFWorld's stack)."""
    env = env0
    obs = env.reset_sync(0)
    first = env.walkthrough[0]
    for near_miss in (first.replace(" ", "  ", 1), first.replace(" ", "\t", 1), first.upper()):
        t = env.step_sync(near_miss)
        assert (t.observation.text, t.observation.valid_actions) == ("Nothing happens.", obs.valid_actions)
    t = env.step_sync(f"  {first}\n")
    assert t.observation.text.startswith("You arrive at loc ") and t.info["steps"] == 4


def test_rule_presentation_agentgym_edits_the_text_and_lists_actions_at_the_end(alf_cache: Path, env0: AlfWorldEnv,
                                                                                 played: dict[int, dict[str, Any]]) -> None:
    raw_opening = env0.reset_sync(0).text
    raw = [env0.step_sync(a) for a in env0.walkthrough]
    env = _env(alf_cache, presentation="agentgym")
    opening = env.reset_sync(0).text
    shown = [env.step_sync(a) for a in env.walkthrough]
    header, room, task = raw_opening.split("\n\n")
    assert header == "-= Welcome to TextWorld, ALFRED! =-" and opening == f"{room}\n{task}"
    for before, after in zip(raw, shown, strict=True):
        text = before.observation.text
        if text.startswith("You arrive at loc "):
            assert after.observation.text == text.split(". ", 1)[1]
        else:
            assert after.observation.text == text
    assert raw[-1].observation.valid_actions == () and raw[-1].done  # default: none once over
    assert shown[-1].done and shown[-1].success and len(shown[-1].observation.valid_actions or ()) > 1
    assert env.step_sync("look").observation.text == "The episode is over."


def test_rule_six_task_types_in_rotation() -> None:
    assert [tasks.task_type_of(i) for i in range(7)] == [*tasks.TASK_TYPES, tasks.TASK_TYPES[0]]


# --- determinism ---

_DIGEST = """
import hashlib, json
from thicket.envs.alfworld import tasks
from thicket.envs.alfworld.wording import Wording
h = hashlib.sha256()
for task in range(12):
    for attempt in range(2):
        g = tasks.make_game(task, attempt)
        for w in Wording:
            h.update(json.dumps([tasks.problem(g), tasks.gold_path(g, w), tasks.wrong_path(g, w), g.traj_data()]).encode())
print(h.hexdigest())
"""


def test_games_are_the_same_in_every_process_and_hash_seed() -> None:
    digests = set()
    for seed in ("0", "12345"):
        done = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr[-2000:]
        digests.add(done.stdout.strip())
    assert len(digests) == 1


def test_cached_game_files_are_what_the_generator_writes(alf_cache: Path, played: dict[int, dict[str, Any]]) -> None:
    from thicket.envs.alfworld import cache

    folder = cache.game_dir(5, Wording.V211, alf_cache)
    traj = json.loads((folder / cache.TRAJ_FILE).read_text())
    data = json.loads((folder / cache.GAME_FILE).read_text())
    expected, _ = cache.game_files(tasks.make_game(5, traj["thicket"]["attempt"]), Wording.V211)
    assert hashlib.sha256(json.dumps(data).encode()).digest() == hashlib.sha256(json.dumps(expected).encode()).digest()
    assert not any(p.name.startswith(".") for p in folder.parent.iterdir())  # no leftover work folders


# --- bad inputs ---


@pytest.mark.parametrize(("args", "needle"), [
    ({"wording": "2.2"}, "env_args.wording"),
    ({"max_steps": 0}, "env_args.max_steps"),
    ({"presentation": "raw"}, "env_args.presentation"),
    ({"order": "random", "data_dir": "/nonexistent"}, "env_args.order"),
    ({"data_dir": "/nonexistent/alfworld", "split": "train"}, "env_args.data_dir"),
    ({"data_dir": "/tmp", "split": "test"}, "env_args.split"),
    ({"data_dir": "/tmp", "task_types": ["pick_and_drop"]}, "env_args.task_types"),
])
def test_bad_env_args_are_one_line_bad_input(args: dict[str, Any], needle: str) -> None:
    with pytest.raises(BadInput) as err:
        make_env("alfworld", **args)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_negative_task_is_bad_input(alf_cache: Path) -> None:
    with pytest.raises(BadInput, match="task -1"):
        _env(alf_cache).reset_sync(-1)


def test_envs_stepped_from_threads_at_once_each_play_their_own_game(alf_cache: Path,
                                                                    played: dict[int, dict[str, Any]]) -> None:
    """Resets and steps run in threads (TextWorld's parsers are shared): three trees at once."""
    import asyncio

    async def play(task: int) -> tuple[str, bool]:
        env = _env(alf_cache)
        obs = await env.reset(task)
        t = None
        for action in env.walkthrough:
            t = await env.step(action)
        await env.close()
        return obs.text, bool(t and t.success)

    async def all_at_once() -> list[tuple[str, bool]]:
        return await asyncio.gather(*(play(task) for task in (1, 2, 4)))

    results = asyncio.run(all_at_once())
    assert [won for _, won in results] == [True, True, True]
    assert [text for text, _ in results] == [played[task]["intro"] for task in (1, 2, 4)]
