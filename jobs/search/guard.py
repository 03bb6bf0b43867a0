"""What comes back from envs and models is untrusted: observations are made safe to
store and prompt with, and every oddity is counted so the worker can name it.

An observation is cut to a maximum length, text that is not valid UTF-8 (lone
surrogates from a bytes decode) is replaced, and control characters other than
tab and newline are dropped. A reply is never changed (it is the sampled text a
trainer learns from); replies without an action, or with one the env did not list,
are only counted.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from enum import StrEnum

from thicket.envs.protocol import Observation, Transition
from thicket.policy.base import Reply

DEFAULT_MAX_OBSERVATION_CHARS = 16_384
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # keeps \t and \n; \r goes too
_CONTROL_BYTES = bytes([*range(0x09), *range(0x0B, 0x20), 0x7F])  # the same characters


class Fault(StrEnum):
    OBSERVATION_CUT = "observation over the length limit (cut)"
    INVALID_UTF8 = "observation not valid UTF-8 (replaced)"
    CONTROL_CHARS = "control characters in the observation (dropped)"
    EMPTY_REPLY = "empty model reply"
    NO_ACTION = "model reply without an 'Action:' line"
    INVALID_ACTION = "model action not in the env's valid actions"
    ACTION_FAILED = "env refused or failed an action (stored as an error leaf)"


def valid_utf8(text: str) -> str:
    if text.isascii():
        return text
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode(errors="replace").decode()


def clean_ascii(text: str) -> bool:
    """ASCII without control characters (other than tab and newline): a faster _CONTROL.search."""
    if not text.isascii():
        return False
    encoded = text.encode()
    return len(encoded.translate(None, _CONTROL_BYTES)) == len(encoded)


def _safe_actions(actions: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if actions is None:
        return None
    try:
        "".join(actions).encode()
        return actions
    except UnicodeEncodeError:
        return tuple(valid_utf8(a) for a in actions)


@dataclass
class ContentGuard:
    max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS
    faults: Counter[Fault] = field(default_factory=Counter)

    def text(self, text: str) -> str:
        if len(text) <= self.max_observation_chars and clean_ascii(text):
            return text  # the common case, made safe as it is
        safe = valid_utf8(text)
        if safe is not text:
            self.faults[Fault.INVALID_UTF8] += 1
        cleaned = safe
        if _CONTROL.search(safe):  # rare: only then build a new string
            cleaned = _CONTROL.sub("", safe)
            self.faults[Fault.CONTROL_CHARS] += 1
        if len(cleaned) > self.max_observation_chars:
            self.faults[Fault.OBSERVATION_CUT] += 1
            cleaned = cleaned[: self.max_observation_chars] + f"\n[cut: {len(cleaned):,} characters in all]"
        return cleaned

    def observation(self, observation: Observation) -> Observation:
        text = self.text(observation.text)
        actions = _safe_actions(observation.valid_actions)
        if text == observation.text and actions is observation.valid_actions:
            return observation
        return Observation(text, actions)

    def transition(self, transition: Transition) -> Transition:
        observation = self.observation(transition.observation)
        return transition if observation is transition.observation else replace(transition, observation=observation)

    def reply(self, reply: Reply, valid_actions: tuple[str, ...] | None) -> None:
        if not reply.text.strip():
            self.faults[Fault.EMPTY_REPLY] += 1
        elif not reply.action:
            self.faults[Fault.NO_ACTION] += 1
        elif valid_actions is not None and reply.action not in valid_actions:
            self.faults[Fault.INVALID_ACTION] += 1

    def summary(self) -> str:
        """One line naming each fault seen, most frequent first ('' when none)."""
        return "; ".join(f"{fault} x{count}" for fault, count in self.faults.most_common())
