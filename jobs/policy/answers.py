"""What an OpenAI-compatible server's answer says about its one sample, read the same way
from /chat/completions and from /completions (vLLM's fields: token_ids, prompt_token_ids)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from thicket.errors import Unavailable
from thicket.policy import prompts


@dataclass(frozen=True)
class Sample:
    """One generated sample and the request that made it."""

    text: str
    tokens: list[str]  # each sampled token's text
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: int | str | None
    prompt_token_ids: list[int] | None
    prompt_tokens: int
    cached_tokens: int | None  # prompt tokens served from the prefix cache
    latency_s: float

    @property
    def action_token_start(self) -> int:
        return action_token_start(self.tokens)

    @property
    def text_token_count(self) -> int:
        """How many sampled tokens make the returned text and its eos: vLLM returns the
        tokens that hold a stop string although the text leaves them out."""
        stop = self.stop_reason
        if isinstance(stop, str) and stop and (pos := "".join(self.tokens).find(stop)) >= 0:
            starts = accumulate(map(len, self.tokens), initial=0)
            return sum(1 for start, _ in zip(starts, self.tokens) if start < pos)
        return len(self.tokens)


def chat_sample(data: dict[str, Any], latency_s: float) -> Sample:
    """A /chat/completions answer: logprobs as one object per token."""
    choice = _choice(data)
    content = (choice.get("logprobs") or {}).get("content") or []
    return _sample(data, choice, latency_s, text=choice["message"].get("content") or "",
                   tokens=[entry.get("token", "") for entry in content],
                   logprobs=[float(entry["logprob"]) for entry in content],
                   prompt_token_ids=data.get("prompt_token_ids"))


def completion_sample(data: dict[str, Any], prompt_token_ids: list[int], latency_s: float) -> Sample:
    """A /completions answer on prompt ids: logprobs as parallel lists."""
    choice = _choice(data)
    logprobs = choice.get("logprobs") or {}
    return _sample(data, choice, latency_s, text=choice.get("text") or "",
                   tokens=list(logprobs.get("tokens") or []),
                   logprobs=[float(lp) for lp in logprobs.get("token_logprobs") or []],
                   prompt_token_ids=prompt_token_ids)


def _sample(data: dict[str, Any], choice: dict[str, Any], latency_s: float, *, text: str, tokens: list[str],
            logprobs: list[float], prompt_token_ids: list[int] | None) -> Sample:
    usage = data.get("usage") or {}
    return Sample(
        text=text,
        tokens=tokens,
        token_ids=list(choice.get("token_ids") or []),
        logprobs=logprobs,
        finish_reason=choice.get("finish_reason") or "stop",
        stop_reason=choice.get("stop_reason"),
        prompt_token_ids=prompt_token_ids,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        latency_s=latency_s,
    )


def _choice(data: dict[str, Any]) -> dict[str, Any]:
    """The one choice of a one-sample answer."""
    choices = data.get("choices") or []
    if not choices:
        raise Unavailable(f"the policy server answered without a choice: {str(data)[:300]}")
    return choices[0]


def _token_at(tokens: list[str], char_pos: int) -> int:
    """Index of the token whose text covers char_pos in "".join(tokens)."""
    end = 0
    for i, token in enumerate(tokens):
        end += len(token)
        if end > char_pos:
            return i
    return -1


def action_token_start(tokens: list[str]) -> int:
    """The token that reaches the reply's action mark (prompts.action_mark); -1 if none does."""
    match = prompts.action_mark("".join(tokens))
    return _token_at(tokens, match.start()) if match else -1
