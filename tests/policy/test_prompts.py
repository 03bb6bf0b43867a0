"""The text of a turn, with no server: the action grammar, parsing replies, where the action's
tokens start, and dropping the oldest exchange from a history too long for the context."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.openai_policy import ODD_ACTIONS, TASK, VALID
from thicket.policy import prompts
from thicket.policy.answers import action_token_start
from thicket.policy.openai import drop_oldest_exchange


def test_action_grammar_holds_each_action_literally() -> None:
    grammar = prompts.action_grammar(ODD_ACTIONS + VALID + ('say "hi"\n\tok',), 0)
    assert "\n" not in grammar  # one line: vLLM reads a grammar line by line to tell EBNF from Lark
    head, choices = grammar.split(' "\\nAction: " ')
    assert head == 'root ::= "Thought: " [^\\n]*'
    literals = re.findall(r'"(?:[^"\\]|\\.)*"', choices)
    assert [json.loads(literal) for literal in literals] == [*ODD_ACTIONS, *VALID, 'say "hi"\n\tok']
    assert choices == "(" + " | ".join(literals) + ")"
    assert "{0,24}" in prompts.action_grammar(VALID, 24)


def test_drop_oldest_exchange() -> None:
    a1, u1 = {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u1"}
    a2, u2 = {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u2"}
    prefill = {"role": "assistant", "content": "Thought: "}
    assert drop_oldest_exchange([*TASK, a1, u1, a2, u2]) == [*TASK, a2, u2]
    assert drop_oldest_exchange([*TASK, a2, u2]) == TASK
    assert drop_oldest_exchange(TASK) is None
    assert drop_oldest_exchange([*TASK, a1, u1, prefill], keep_last=1) == [*TASK, prefill]
    assert drop_oldest_exchange([*TASK, prefill], keep_last=1) is None


def test_action_token_start() -> None:
    assert action_token_start(["Thought", ":", " x", "\n", "Action", ":", " go"]) == 4
    assert action_token_start(["Thought: x", "\nAct", "ion: go"]) == 1
    assert action_token_start(["Thought", ": x"]) == -1
    # a thought that says "action:" itself: the action starts on the line that begins with it
    assert action_token_start(["Thought: blue", "Action", ":K&", "\n", "Action", ": go"]) == 4


# replies of the tiny model under the action grammar, seen in a saturation sweep: the
# one-line thought may say "action:" too, and the action is the line that begins with it
@pytest.mark.parametrize(("text", "expected"), [
    ("Thought: blueAction:K&\nAction: craft 4 stairs using 6 andesite", ("blueAction:K&", "craft 4 stairs using 6 andesite")),
    ("Thought: have wool action:swer45ee'lid\nAction: inventory", ("have wool action:swer45ee'lid", "inventory")),
    ("Thought: get wood\nAction: get 1 oak log\nObservation: Got 1 oak log", ("get wood", "get 1 oak log")),
    ("Thought: one line Action: go north", ("one line", "go north")),
    ("Thought: two\nlines", ("two\nlines", "")),
    ("Action: wait", ("", "wait")),
    ("no format at all", ("no format at all", "")),
])
def test_parse_reply(text: str, expected: tuple[str, str]) -> None:
    assert prompts.parse_reply(text) == expected
