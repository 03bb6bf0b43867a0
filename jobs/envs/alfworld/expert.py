"""The gold path of a generated game with a short thought before each command: what the
command is for (a scratchpad a small model can copy forward)."""

from __future__ import annotations

import json
from pathlib import Path

from thicket.envs.alfworld import cache
from thicket.envs.alfworld.wording import Wording

WASTED = ("look", "inventory")  # commands that never change what the gold path needs


def _purpose(command: str) -> str:
    """What going somewhere is for, read off the command done there."""
    verb, _, rest = command.partition(" ")
    if verb == "take":
        return f"to take the {rest.split(' from ')[0]}."
    if verb in ("clean", "heat", "cool"):
        return f"to {verb} the {rest.split(' with ')[0]}."
    if verb == "use":
        return f"to look under the {rest}."
    if verb in ("put", "move"):
        return f"to put the {rest.split(' in/on ')[0].split(' to ')[0]} there."
    return "to look there."


def thought(commands: tuple[str, ...], i: int) -> str:
    command = commands[i]
    verb, _, rest = command.partition(" ")
    if verb == "go":
        later = next((c for c in commands[i + 1:] if not c.startswith("open ")), "")
        return _purpose(later) if later else "to look there."
    if verb == "open":
        return f"the {rest} is closed."
    if verb == "take":
        return "now I hold it."
    if verb in ("clean", "heat", "cool"):
        return {"clean": "it must be clean.", "heat": "it must be hot.", "cool": "it must be cool."}[verb]
    if verb == "use":
        return "turning on the light to look at it."
    last = all(not c.startswith(("put ", "move ")) for c in commands[i + 1:])
    return "that finishes the task." if last else "one done, the next one now."


def gold_steps(task: int, cache_dir: Path | None = None,
               wording: Wording = Wording.V211) -> tuple[tuple[str, str], ...]:
    """(thought, command) along generated task `task`'s gold path (generating it if needed)."""
    game = cache.game_dir(task, wording, cache_dir or cache.default_cache_dir())
    commands = tuple(json.loads((game / cache.GAME_FILE).read_text())["walkthrough"])
    return tuple((thought(commands, i), c) for i, c in enumerate(commands))
