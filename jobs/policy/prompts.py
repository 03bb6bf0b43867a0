"""ReAct prompts (Thought / Action), rendered append-only.

A node's messages are its parent's messages plus two turns (the reply that led
to it and the observation it got), so a child's prompt extends its parent's
byte for byte and vLLM's prefix cache serves the shared part.
"""

from __future__ import annotations

import re

from thicket.policy.base import Messages

REACT_FORMAT = (
    "Answer every turn in exactly this format:\n"
    "Thought: <one short sentence of reasoning>\n"
    "Action: <one action>"
)

_ACTION = re.compile(r"Action\s*:\s*(.*)", re.IGNORECASE)
_THOUGHT = re.compile(r"Thought\s*:\s*(.*?)(?:\n\s*Action\s*:|$)", re.IGNORECASE | re.DOTALL)


def system_message(instructions: str) -> dict[str, str]:
    return {"role": "system", "content": f"{instructions.strip()}\n\n{REACT_FORMAT}"}


def observation_message(text: str, valid_actions: tuple[str, ...] | None, show_valid: bool) -> dict[str, str]:
    content = f"Observation: {text}"
    if show_valid and valid_actions:
        content += "\nValid actions: " + " | ".join(valid_actions)
    return {"role": "user", "content": content}


def turn(thought: str, action: str) -> str:
    return f"Thought: {thought}\nAction: {action}"


def thought_prefix(thought: str) -> str:
    """The assistant text an action is completed from (ToT's second stage)."""
    return f"Thought: {thought}\nAction: "


def parse_reply(text: str) -> tuple[str, str]:
    """(thought, action) from a reply. The action is the first line after `Action:`;
    a reply without one yields the empty action, which envs reject as invalid."""
    action_match = _ACTION.search(text)
    action = action_match.group(1).strip().splitlines()[0].strip() if action_match and action_match.group(1).strip() else ""
    thought_match = _THOUGHT.search(text)
    thought = thought_match.group(1).strip() if thought_match else text.strip()
    if not action_match and not thought_match:
        thought = text.strip()
    return thought, action


def thought_regex(max_thought_chars: int) -> str:
    """One line of thought: at most max_thought_chars characters, or any number with 0.

    A bound costs the server: xgrammar unrolls [^\\n]{0,N} into N grammar states, so with a
    32k-token vocabulary N=200 took 1.5 s to compile (once per distinct valid-action set)
    and 230-390 us a token to match, against 8-18 ms and 4-7 us unbounded (bench/grammar.py).
    Keep bounds for tiny models that never end a line by themselves."""
    return f"[^\\n]{{0,{max_thought_chars}}}" if max_thought_chars > 0 else "[^\\n]*"


def action_regex(valid_actions: tuple[str, ...], max_thought_chars: int) -> str:
    """A regex for structured outputs: a one-line thought, then one valid action."""
    choices = "|".join(re.escape(a) for a in valid_actions)
    return f"Thought: {thought_regex(max_thought_chars)}\\nAction: ({choices})"


def extend(messages: Messages, reply_text: str, observation: dict[str, str]) -> Messages:
    return [*messages, {"role": "assistant", "content": reply_text}, observation]
