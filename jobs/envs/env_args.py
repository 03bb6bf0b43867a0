"""Checks of a family's env_args that come from a spec (YAML): a wrong type or range is the
user's mistake, told in one line (BadInput), never a TypeError deep in a loader.

`FAMILY_ARGS` names each built-in family's env_args, what each takes and its default, without importing
the family (its game package may not be installed where the spec is checked): the spec is
checked against it when parsed, so `validate` and `run` refuse a bad argument before any task
runs. `distinct_tasks` tells how many different tasks a family's indices reach, where that is
known (task indices past it wrap around).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thicket.errors import BadInput


def int_arg(family: str, name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f">= {low}"
        raise BadInput(f"{family}: env_args.{name} must be an integer {span}, got {value!r}")
    return value


def path_arg(family: str, name: str, value: Any) -> Path | None:
    """A folder's path (~ expanded), or None when not given."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadInput(f"{family}: env_args.{name} must be a folder's path, got {value!r}")
    return Path(value).expanduser()


# -- what each family takes -----------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    expected: str  # "an integer from 2 to 64", for messages and `thicket envs`
    accepts: Callable[[Any], bool]
    default: Any = None  # the factory's default (tests/envs/test_env_args.py compares them); None: not set


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int, high: int | None = None, optional: bool = False, default: int | None = None) -> Arg:
    span = f"from {low} to {high}" if high is not None else f">= {low}"
    return Arg(f"an integer {span}" + (" (or null)" if optional else ""),
               lambda v: (optional and v is None) or (_is_int(v) and v >= low and (high is None or v <= high)), default)


def positive_number(default: float | None = None) -> Arg:
    return Arg("a number > 0", lambda v: (_is_int(v) or isinstance(v, float)) and v > 0, default)


def boolean(default: bool) -> Arg:
    return Arg("true or false", lambda v: isinstance(v, bool), default)


def choice(*values: str, default: str | None = None) -> Arg:
    return Arg(f"one of {', '.join(values)}", lambda v: isinstance(v, str) and v in values, default)


def text(default: str | None = None) -> Arg:
    return Arg("a string", lambda v: isinstance(v, str), default)


def folder() -> Arg:
    return Arg("a folder's path", lambda v: v is None or isinstance(v, str))


def strings(what: str) -> Arg:
    return Arg(f"a non-empty list of {what}", lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v))


def mapping() -> Arg:
    return Arg("a mapping (key: value)", lambda v: v is None or isinstance(v, dict))


def task_types() -> Arg:
    return Arg("a non-empty list of task types (ALFWorld's ids 1-6 or their names)",
               lambda v: v is None or (isinstance(v, list) and bool(v) and all(_is_int(x) or isinstance(x, str) for x in v)))


# Kept in step with the families' factories (tests/envs/test_env_args.py compares them).
FAMILY_ARGS: dict[str, dict[str, Arg]] = {
    "alfworld": {
        "wording": choice("2.1.1", "2.1.2", default="2.1.1"),
        "cache_dir": folder(),
        "data_dir": folder(),
        "split": choice("train", "valid_seen", "valid_unseen"),
        "task_types": task_types(),
        "order": choice("sorted", "filesystem", default="sorted"),
        "max_steps": integer(1, optional=True),
        "presentation": choice("alfworld", "agentgym", default="alfworld"),
    },
    "babyai": {"levels": strings("BabyAI level names, e.g. BabyAI-GoToRedBall-v0")},
    "cliffwalking": {"is_slippery": boolean(False)},
    "frozenlake": {"size": integer(2, 64, default=4), "is_slippery": boolean(False)},
    "math": {
        "cpu_s": positive_number(5.0),
        "memory_mb": integer(64, default=1024),
        "max_output_chars": integer(1, default=2000),
        "persistent": boolean(True),
        "problems_file": folder(),
    },
    "sciworld": {
        "split": choice("train", "dev", "test", "all", default="train"),
        "simplifications": text(""),
        "step_limit": integer(1, default=100),
        "max_valid_actions": integer(1, optional=True, default=200),
        "valid_actions": boolean(True),
    },
    "taxi": {"is_rainy": boolean(False), "fickle_passenger": boolean(False)},
    "textarena": {"game": text("TowerOfHanoi-v0"), "seed_offset": integer(0, default=0)},
    "textcraft": {},
    "textworld": {
        "challenge": choice("custom", "tw-simple", "tw-coin_collector", "tw-treasure_hunter", "tw-cooking", default="custom"),
        "world_size": integer(1, default=5),
        "nb_objects": integer(0, default=10),
        "quest_length": integer(1, default=5),
        "settings": mapping(),
        "seed_offset": integer(0, default=0),
        "cache_dir": folder(),
    },
    "webshop": {
        "data_dir": folder(),
        "goals": choice("auto", "human", "synthetic", default="auto"),
        "products": integer(100, 20000, default=1000),
        "seed": integer(0, 2**31, default=0),
        "cache_dir": folder(),
        "search_actions": integer(0, 20, default=3),
    },
}


def env_args_problems(family: str, env_args: dict[str, Any]) -> list[tuple[str, str]]:
    """(argument, what is wrong) for each bad argument of a built-in family; [] for a family
    this table does not know (registered elsewhere: its factory checks its own)."""
    known = FAMILY_ARGS.get(family)
    if known is None:
        return []
    problems = []
    for name, value in env_args.items():
        arg = known.get(str(name))
        if arg is None:
            problems.append((str(name), unknown_arg(family, str(name), known)))
        elif not arg.accepts(value):
            problems.append((str(name), f"expected {arg.expected} for {family}, got {value!r}"))
    return problems


def unknown_arg(family: str, name: str, known: dict[str, Arg]) -> str:
    if not known:
        return f"unknown argument; {family} takes no env_args"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    takes = f"{family} takes {', '.join(known)}"
    return f"unknown argument; did you mean '{close[0]}'? ({takes})" if close else f"unknown argument; {takes}"


# -- how many different tasks the indices reach ----------------------------------------------


def distinct_tasks(family: str, env_args: dict[str, Any]) -> int | None:
    """How many different tasks `family` has, where its task indices wrap around (task i is
    task i mod N) or are all the same (N = 1); None where that is unbounded or not known here
    (the family's package is not installed, its data is elsewhere)."""
    try:
        if family == "textcraft":
            from thicket.envs.textcraft import goals

            return len(goals())  # task i crafts goals()[i % N]
        if family == "math":
            from thicket.envs.math.env import load_problems

            return len(load_problems(env_args.get("problems_file")))  # task i is problem i % N
    except (ImportError, OSError, ValueError):
        return None
    if family == "cliffwalking" and not env_args.get("is_slippery"):
        return 1  # one map, one start, deterministic moves: the seed changes nothing
    if family == "textarena" and str(env_args.get("game", "TowerOfHanoi-v0")).startswith("TowerOfHanoi"):
        return 1  # no randomness: every index is the same puzzle
    return None
