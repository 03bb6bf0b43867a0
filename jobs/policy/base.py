"""What a policy is: given a chat history, propose agent replies (Thought / Action)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from thicket.policy.inflight import AdjustableLimit
from thicket.policy.meter import RequestMeter

DEFAULT_CONCURRENCY = 64  # requests in flight where nothing better is known

Messages = list[dict[str, str]]


@dataclass
class Reply:
    """One sampled agent turn, with what was sampled kept exactly for training."""

    text: str  # the assistant message as it enters the history
    thought: str
    action: str
    token_ids: list[int] = field(default_factory=list)  # sampled ids, in order
    logprobs: list[float] = field(default_factory=list)  # aligned with token_ids
    action_token_start: int = -1  # index in token_ids where the action begins (-1: unknown)
    # token_ids[prefill_start:prefill_start + prefill_len] were prefilled, not sampled (the action
    # mark act() puts after a cut thought), with logprob 0.0; prefill_len -1: a prefill whose ids are
    # not known exactly (the reply's ids are then not what the model saw, and no token row uses them)
    prefill_start: int = -1
    prefill_len: int = 0
    prompt_token_ids: list[int] | None = None  # the prompt this reply was sampled from
    finish_reason: str = "stop"
    constrained: bool = False  # the action was forced into the env's valid actions
    temperature: float = 0.0
    seed: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache
    latency_s: float = 0.0


class Policy(ABC):
    """An async policy. Replies are returned in sample order (sample i used seed + i)."""

    name: str = "policy"

    @property
    def slots(self) -> AdjustableLimit:
        """Requests in flight at most (policies that talk to a server set their own)."""
        if "_slots" not in self.__dict__:
            self.__dict__["_slots"] = AdjustableLimit(DEFAULT_CONCURRENCY)
        return self.__dict__["_slots"]

    @property
    def meter(self) -> RequestMeter:
        """Requests in flight over time (for throughput figures)."""
        if "_meter" not in self.__dict__:
            self.__dict__["_meter"] = RequestMeter()
        return self.__dict__["_meter"]

    @abstractmethod
    async def propose(
        self,
        messages: Messages,
        n: int,
        *,
        valid_actions: tuple[str, ...] | None,
        seed: int,
        temperature: float | None = None,
    ) -> list[Reply]:
        """Sample n full replies ("Thought: ...\\nAction: ...")."""

    @abstractmethod
    async def act(
        self,
        messages: Messages,
        thought: Reply,
        *,
        valid_actions: tuple[str, ...] | None,
        seed: int,
        temperature: float | None = None,
    ) -> Reply:
        """Complete a thought with an action; returns the whole turn (thought + action).
        `thought.text` is the assistant text so far and `thought.token_ids` its sampled ids
        (propose uses it for a reply that its token budget cut before the action)."""

    async def start(self) -> None:
        """Check the policy can serve (server reachable, model served)."""

    async def close(self) -> None:
        return None
