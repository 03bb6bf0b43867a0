"""ALFWorld's own games, when the user has them (they come from ALFWorld's GitHub release,
which thicket cannot fetch).

`data_dir` (or $ALFWORLD_DATA) is the folder `alfworld-download` fills (holding
`json_2.1.1/`), or `json_2.1.1/` itself. Split `train` / `valid_seen` / `valid_unseen` is
its subfolder. Task index i is the i-th game of the split in ALFWorld's order
(AlfredTWEnv.collect_game_files): walk the split bottom-up; keep each folder holding a
`traj_data.json` unless its path contains "movable" or "Sliced", its task type is not one
of the chosen ones, it has no `game.tw-pddl` beside it, or that file has no `solvable`
key or is marked unsolvable. ALFWorld walks in the order the filesystem lists folders
(os.walk), which differs between machines; thicket sorts each folder's entries by name
(order "sorted", the default, the same everywhere) unless order "filesystem" asks for
os.walk's own order, to match an ALFWorld run on the same machine.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from thicket.envs.alfworld.tasks import TASK_TYPES
from thicket.errors import BadInput

SPLITS = ("train", "valid_seen", "valid_unseen")
ORDERS = ("sorted", "filesystem")
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"


def split_dir(data_dir: Path | None, split: str) -> Path:
    if split not in SPLITS:
        raise BadInput(f"env_args.split: {split!r} is not one of {', '.join(SPLITS)}")
    root = data_dir or os.environ.get("ALFWORLD_DATA")
    if not root:
        raise BadInput("env_args.data_dir: not given and ALFWORLD_DATA is not set; expected ALFWorld's data folder")
    base = Path(root).expanduser()
    for candidate in (base / "json_2.1.1" / split, base / split):
        if candidate.is_dir():
            return candidate
    raise BadInput(f"env_args.data_dir: {base} has no json_2.1.1/{split} (nor {split}) folder; "
                   "expected the folder alfworld-download fills")


def _walk(top: Path, order: str) -> Iterator[tuple[str, list[str]]]:
    """(folder, file names), children before parents, as os.walk(topdown=False)."""
    if order == "filesystem":
        for root, _, files in os.walk(top, topdown=False):
            yield root, files
        return
    entries = sorted(os.scandir(top), key=lambda e: e.name)
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):  # as os.walk: a link to a folder is not walked into
            yield from _walk(Path(entry.path), order)
    yield str(top), [e.name for e in entries if not e.is_dir()]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadInput(f"{path}: not a readable JSON file ({type(err).__name__}); "
                       "expected an ALFWorld game file") from None


@functools.cache
def game_list(folder: Path, task_types: tuple[str, ...], order: str) -> tuple[Path, ...]:
    games = []
    for root, files in _walk(folder, order):
        if TRAJ_FILE not in files or "movable" in root or "Sliced" in root:
            continue
        traj = _read_json(Path(root) / TRAJ_FILE)
        if not isinstance(traj, dict) or "task_type" not in traj:
            raise BadInput(f"{Path(root) / TRAJ_FILE}: no task_type; expected ALFWorld's traj_data.json")
        game = Path(root) / GAME_FILE
        if traj["task_type"] not in task_types or not game.exists():
            continue
        data = _read_json(game)
        if isinstance(data, dict) and data.get("solvable"):
            games.append(Path(root))
    return tuple(games)


def task_types_arg(value: list[str] | list[int] | None) -> tuple[str, ...]:
    """env_args.task_types: names, or ALFWorld's ids 1-6 (its config's task_types)."""
    if value is None:
        return TASK_TYPES
    chosen = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and 1 <= item <= len(TASK_TYPES):
            chosen.append(TASK_TYPES[item - 1])
        elif item in TASK_TYPES:
            chosen.append(str(item))
        else:
            raise BadInput(f"env_args.task_types: {item!r} is not a task type; expected ids 1-6 or one of "
                           f"{', '.join(TASK_TYPES)}")
    return tuple(chosen)


def official_game_dir(folder: Path, task_types: tuple[str, ...], order: str, task: int) -> Path:
    games = game_list(folder, task_types, order)
    if not 0 <= task < len(games):
        raise BadInput(f"task {task}: {folder} holds {len(games)} playable games (tasks 0-{len(games) - 1})")
    return games[task]


def load_game_data(game: Path) -> dict[str, Any]:
    data = _read_json(game / GAME_FILE)
    missing = [k for k in ("pddl_domain", "grammar", "pddl_problem") if not isinstance(data, dict) or k not in data]
    if missing:
        raise BadInput(f"{game / GAME_FILE}: no {missing[0]}; expected an ALFWorld game file")
    return data
