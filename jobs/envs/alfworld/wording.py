"""The PDDL domain and text grammar of ALFWorld games, in either wording.

Both come from the alfworld wheel (`alfworld/data/alfred.pddl`, `alfred.twl2`), which
carries the 2.1.2 wording: "move X to Y", "You arrive at cabinet 1.", a `help` command.
The 2.1.1 wording (ALFWorld's json_2.1.1 games, used by ReAct, ETO and AgentGym) differs
in exactly these places: "put X in/on Y" and "You put the X in/on the Y." for placing,
"You arrive at loc N." (the location, not the receptacle), and no `help` action in the
domain or the grammar.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from enum import StrEnum


class Wording(StrEnum):
    V211 = "2.1.1"
    V212 = "2.1.2"


# (2.1.2 text, 2.1.1 text) in the wheel's grammar.
_GRAMMAR_EDITS = (
    ('"You arrive at {r.name}. #examineReceptacle.feedback#"',
     '"You arrive at {lend.name}. #examineReceptacle.feedback#"'),
    ('"You move the {o.name} to the {r.name}."', '"You put the {o.name} in/on the {r.name}."'),
    ('template :: "move {o} to {r}";\n    feedback :: "#PutObject.feedback#";',
     'template :: "put {o} in/on {r}";\n    feedback :: "#PutObject.feedback#";'),
    ('template :: "move {o} to {r}";\n    feedback :: "#PutEmptyReceptacleObjectinReceptacle.feedback#";',
     'template :: "put {o} in/on {r}";\n    feedback :: "#PutEmptyReceptacleObjectinReceptacle.feedback#";'),
)
_HELP_ACTION = re.compile(r"\naction help \{.*\Z", re.S)
_HELP_OPERATOR = re.compile(r"\(:action help\b.*?\n\)\n", re.S)

TASK_PLACEHOLDER = "UNKNOWN GOAL"


def _read(name: str) -> str:
    return (importlib.resources.files("alfworld") / "data" / name).read_text()


@functools.cache
def domain(wording: Wording) -> str:
    text = _read("alfred.pddl")
    if wording is Wording.V212:
        return text
    text, found = _HELP_OPERATOR.subn("", text)
    _expect(found == 1, "the help action of alfred.pddl")
    return text


@functools.cache
def grammar(wording: Wording) -> str:
    text = _read("alfred.twl2")
    if wording is Wording.V212:
        return text
    for new, old in _GRAMMAR_EDITS:
        _expect(text.count(new) == 1, repr(new[:40]))
        text = text.replace(new, old)
    text, found = _HELP_ACTION.subn("\n", text)
    _expect(found == 1, "the help action of alfred.twl2")
    return text


def grammar_with_task(wording: Wording, task_text: str) -> str:
    return grammar(wording).replace(TASK_PLACEHOLDER, task_text)


def put_command(wording: Wording, obj: str, recep: str) -> str:
    return f"put {obj} in/on {recep}" if wording is Wording.V211 else f"move {obj} to {recep}"


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"alfworld's data files changed: {what} is not where the 2.1.1 rewrite expects it")
