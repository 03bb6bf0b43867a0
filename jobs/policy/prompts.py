"""ReAct prompts (Thought / Action), rendered append-only.

A node's messages are its parent's messages plus two turns (the reply that led
to it and the observation it got), so a child's prompt extends its parent's
byte for byte and vLLM's prefix cache serves the shared part.
"""

from __future__ import annotations

import json
import re

from thicket.policy.base import Messages

REACT_FORMAT = (
    "Answer every turn in exactly this format:\n"
    "Thought: <one short sentence of reasoning>\n"
    "Action: <one action>"
)

_ACTION = r"Action\s*:\s*(.*)"
_ACTION_LINE = re.compile(r"^[ \t]*" + _ACTION, re.IGNORECASE | re.MULTILINE)
_ACTION_ANYWHERE = re.compile(_ACTION, re.IGNORECASE)
_THOUGHT = re.compile(r"Thought\s*:\s*", re.IGNORECASE)


def system_message(instructions: str) -> dict[str, str]:
    return {"role": "system", "content": f"{instructions.strip()}\n\n{REACT_FORMAT}"}


def observation_message(text: str, valid_actions: tuple[str, ...] | None, show_valid: bool) -> dict[str, str]:
    content = f"Observation: {text}"
    if show_valid and valid_actions:
        content += "\nValid actions: " + " | ".join(valid_actions)
    return {"role": "user", "content": content}


def turn(thought: str, action: str) -> str:
    return f"Thought: {thought}\nAction: {action}"


def action_mark(text: str) -> re.Match[str] | None:
    """Where a reply's action starts: its first line that begins with "Action:", else (a
    one-line reply) its first "Action:". A thought may itself say "...action: x" (a random
    model does, and the grammar's one-line thought allows it); that is not the action."""
    return _ACTION_LINE.search(text) or _ACTION_ANYWHERE.search(text)


def parse_reply(text: str) -> tuple[str, str]:
    """(thought, action) from a reply. The action is the rest of the line after the action
    mark; the thought is what precedes the mark, after `Thought:` if the reply has one. A
    reply without an action mark yields the empty action, which envs reject as invalid."""
    mark = action_mark(text)
    rest = mark.group(1).strip() if mark else ""
    action = rest.splitlines()[0].strip() if rest else ""
    head = text[: mark.start()] if mark else text
    thought = _THOUGHT.search(head)
    return (head[thought.end():] if thought else head).strip(), action


def thought_rule(max_thought_chars: int) -> str:
    """One line of thought: at most max_thought_chars characters, or any number with 0.

    A bound costs the server: xgrammar unrolls [^\\n]{0,N} into N grammar states, so with a
    32k-token vocabulary N=200 took 1.5 s to compile (once per distinct valid-action set)
    and 230-390 us a token to match, against 8-18 ms and 4-7 us unbounded (bench/grammar.py).
    Keep bounds for tiny models that never end a line by themselves."""
    return f"[^\\n]{{0,{max_thought_chars}}}" if max_thought_chars > 0 else "[^\\n]*"


def action_grammar(valid_actions: tuple[str, ...], max_thought_chars: int) -> str:
    """An EBNF grammar for structured outputs (vLLM's `grammar`): a one-line thought, then
    one valid action, on one line (vLLM tells EBNF from Lark line by line).

    EBNF rather than a regex of the same language: vLLM's API server parses each request's grammar
    before it accepts the request, and xgrammar parses this EBNF 5-11x faster (0.04 against
    0.46 ms for 63-98 TextCraft actions), on the one process that serves every request. A
    regex built with re.escape was worse still: xgrammar logged a warning for each escaped
    space, ~330 lines (64 KB) of server log per TextCraft request."""
    choices = " | ".join(json.dumps(a, ensure_ascii=False) for a in valid_actions)  # EBNF's escapes are JSON's
    return f'root ::= "Thought: " {thought_rule(max_thought_chars)} "\\nAction: " ({choices})'


def extend(messages: Messages, reply_text: str, observation: dict[str, str]) -> Messages:
    return [*messages, {"role": "assistant", "content": reply_text}, observation]
