"""Generated games on disk, each confirmed by play before it is kept.

A game is kept only if, played through the engine, its wrong path (`tasks.wrong_path`)
never wins and its gold path wins exactly at its last command; otherwise the next attempt
of the same task is drawn (the same sequence on every machine). Games are written in
ALFWorld's own layout (`game.tw-pddl`: domain, grammar with the task text, problem,
`solvable`, `walkthrough` = the gold path; `traj_data.json`: task type and `pddl_params`)
under `<cache_dir>/<key>/task_N/`, published by one atomic rename, so processes can share
the cache: the first complete game wins. The key names the generator version, the wording
and the alfworld version whose data files went in.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
from pathlib import Path
from typing import Any

from thicket.envs.alfworld import tasks, wording
from thicket.envs.alfworld.engine import Engine
from thicket.envs.alfworld.wording import Wording
from thicket.envs.cache_dir import cache_root, cached_folder

log = logging.getLogger("thicket.envs.alfworld")

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
MAX_ATTEMPTS = 10


def default_cache_dir() -> Path:
    return cache_root("alfworld", "THICKET_ALFWORLD_CACHE")


@functools.cache
def cache_key(w: Wording) -> str:
    return f"gen{tasks.GENERATOR_VERSION}-{w.value}-alfworld{importlib.metadata.version('alfworld')}"


def game_dir(task: int, w: Wording, cache_dir: Path) -> Path:
    """The folder of task `task`'s game, generating and checking it on first use. Safe from
    several threads and several processes at once."""
    target = cache_dir / cache_key(w) / f"task_{task}"
    return cached_folder(target, GAME_FILE, lambda work: _generate(task, w, work), log)


def game_files(game: tasks.Game, w: Wording) -> tuple[dict[str, Any], dict[str, Any]]:
    """(game.tw-pddl, traj_data.json) contents of a generated game."""
    data = {
        "pddl_domain": wording.domain(w),
        "grammar": wording.grammar_with_task(w, game.task_text),
        "pddl_problem": tasks.problem(game),
        "solvable": True,
        "walkthrough": list(tasks.gold_path(game, w)),
    }
    traj = game.traj_data() | {"thicket": {"generator_version": tasks.GENERATOR_VERSION, "task": game.task,
                                           "attempt": game.attempt, "wording": w.value}}
    return data, traj


def check(game: tasks.Game, w: Wording, data: dict[str, Any]) -> str | None:
    """None if the engine confirms the game (the wrong path never wins, the gold path wins
    at its last command), else what went wrong."""
    engine = Engine(data)
    try:
        wrong = tasks.wrong_path(game, w)
        for i, command in enumerate(wrong):
            if engine.step(command).won:
                return f"the wrong path wins at step {i + 1}"
        engine.reset()
        gold = tasks.gold_path(game, w)
        for i, command in enumerate(gold):
            if command not in engine.current.admissible:
                return f"the gold path's {command!r} (step {i + 1}) is not admissible"
            if engine.step(command).won:
                return None if i == len(gold) - 1 else f"the gold path wins early, at step {i + 1}"
        return "the gold path does not win"
    finally:
        engine.close()


def _generate(task: int, w: Wording, work: Path) -> str:
    problem = ""
    for attempt in range(MAX_ATTEMPTS):
        game = tasks.make_game(task, attempt)
        data, traj = game_files(game, w)
        problem = check(game, w, data) or ""
        if not problem:
            (work / GAME_FILE).write_text(json.dumps(data))
            (work / TRAJ_FILE).write_text(json.dumps(traj, indent=1))
            return f"attempt {attempt}"
        log.info("alfworld: task %d attempt %d rejected: %s", task, attempt, problem)
    raise RuntimeError(f"alfworld could not generate task {task}: {problem}")
