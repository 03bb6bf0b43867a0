"""Replies a tree has paid for, kept so that a tree interrupted mid-growth resumes without
asking the LLM again (thicket.rollout.checkpoint keeps them in the sweep's storage).

The searches are deterministic given the replies they get: their random choices are seeded
from the tree's seed, and each propose's sampling seed from the node it is made at. Resuming
is therefore growing the tree again from its root, with every propose that was answered
before served from the journal: the env states are rebuilt by stepping the same actions, and
the search's own state (visits, values, open nodes, the budget spent, its rng) comes out as
the interrupted run left it. A propose is matched by everything its replies were sampled
from: the whole prompt, the valid actions, n, the seed and the temperature, so a reply is
never served to a prompt it was not sampled for.
"""

from __future__ import annotations

import hashlib
import json
from typing import Protocol

from thicket.policy.base import Messages, Reply


class ReplyJournal(Protocol):
    def take(self, key: str) -> list[Reply] | None:
        """The replies recorded for this propose (once each), or None: ask the policy."""

    async def record(self, key: str, replies: list[Reply]) -> None:
        """Keep the replies the policy gave for this propose."""


def propose_key(messages: Messages, n: int, *, valid_actions: tuple[str, ...] | None, seed: int,
                temperature: float | None) -> str:
    """What a propose's replies were sampled from, as a digest."""
    what = [messages, list(valid_actions) if valid_actions is not None else None, n, seed, temperature]
    return hashlib.blake2b(json.dumps(what, ensure_ascii=False).encode(), digest_size=16).hexdigest()
