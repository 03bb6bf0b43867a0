"""What the policy asks an OpenAI-compatible server (vLLM first) for: the sampling fields of
propose()'s and act()'s samples, and the requests that carry them.

A server that renders chat prompts to token ids (vLLM's /tokenize) gets each prompt
rendered once, and each sample of it as a /completions request on those ids (one
chat-template render per expansion, not per sample, and lighter logprobs); any other
server, or `render_once` off, gets each sample as a /chat/completions request. Both give
the same samples: the same ids in, the same sampling.

vLLM-specific request fields are used (`return_token_ids`, `structured_outputs`,
`continue_final_message`); other servers ignore or refuse them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thicket.policy import prompts
from thicket.policy.base import Messages
from thicket.policy.openai_config import OpenAIConfig

# extra_body fields that shape how messages render: with render_once they go to /tokenize
_RENDER_FIELDS = frozenset({"chat_template", "chat_template_kwargs", "add_special_tokens"})


@dataclass(frozen=True)
class Prompt:
    """Messages as the server gets them: rendered to token ids once (/tokenize), or not
    (ids None) and sent as chat messages with each request."""

    messages: Messages
    ids: list[int] | None
    continues: bool = False  # the last message is a prefilled assistant turn to continue


class RequestBodies:
    """The bodies of a policy's requests, from its config."""

    def __init__(self, config: OpenAIConfig) -> None:
        self.config = config
        extra = config.extra_body  # with prompts rendered once, its rendering fields go to /tokenize, the rest to /completions
        self._render_extra = {k: v for k, v in extra.items() if k in _RENDER_FIELDS}
        self._completion_extra = {k: v for k, v in extra.items() if k not in _RENDER_FIELDS}

    # -- sampling -----------------------------------------------------------------------

    def constrained(self, valid_actions: tuple[str, ...] | None) -> bool:
        return bool(self.config.constrain_actions and valid_actions)

    def proposal(self, seed: int, temperature: float | None,
                 constrained_to: tuple[str, ...] | None) -> dict[str, Any]:
        """The sampling fields of propose()'s samples (each then gets its own seed); a
        constrained reply follows the action grammar."""
        max_tokens = self._reply_budget(constrained_to) if constrained_to else self.config.max_tokens
        body = self._sampling(seed, temperature, max_tokens)
        if constrained_to:
            grammar = prompts.action_grammar(constrained_to, self.config.max_thought_chars)
            body["structured_outputs"] = {"grammar": grammar}
        return body

    def action(self, seed: int, temperature: float | None, valid_actions: tuple[str, ...] | None,
               constrained: bool) -> dict[str, Any]:
        """The sampling fields of act()'s action: one of the valid actions when constrained,
        else one line."""
        body = self._sampling(seed, temperature, self.config.action_max_tokens)
        if constrained and valid_actions:
            body["structured_outputs"] = {"choice": list(valid_actions)}
            body["max_tokens"] = max(len(a.encode()) for a in valid_actions) + 8
        else:
            body["stop"] = ["\n"]
        return body

    def _sampling(self, seed: int, temperature: float | None, max_tokens: int) -> dict[str, Any]:
        """The request fields both endpoints share (each adds its logprobs field)."""
        return {
            "seed": seed,
            "temperature": self.config.temperature if temperature is None else temperature,
            "top_p": self.config.top_p,
            "max_tokens": max_tokens,
            "return_token_ids": True,
        }

    def _reply_budget(self, valid_actions: tuple[str, ...]) -> int:
        """Tokens that always fit a constrained reply whose thought is bounded (a char can take
        up to 4 byte tokens), so the grammar is never cut before the action."""
        longest = max(len(a.encode()) for a in valid_actions)
        if self.config.max_thought_chars <= 0:
            return max(self.config.max_tokens, longest + 32)
        return max(self.config.max_tokens, 4 * self.config.max_thought_chars + longest + 32)

    # -- requests -----------------------------------------------------------------------

    def tokenize_probe(self) -> dict[str, Any]:
        """A /tokenize request that a server rendering chat messages answers with token ids."""
        return {"model": self.config.model, "messages": [{"role": "user", "content": "hi"}]}

    def tokenize(self, messages: Messages, continues: bool) -> dict[str, Any]:
        """The /tokenize request that renders the messages with the server's chat template."""
        return {"model": self.config.model, "messages": messages, "add_generation_prompt": not continues,
                "continue_final_message": continues, **self._render_extra}

    def tokenize_text(self, text: str) -> dict[str, Any]:
        """The /tokenize request for plain text, as it would continue a prompt (no special tokens)."""
        return {"model": self.config.model, "prompt": text, "add_special_tokens": False}

    def generation(self, prompt: Prompt, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(path from the API root, payload) of one sample of the prompt with these sampling
        fields: /completions on its ids, or /chat/completions on its messages."""
        if prompt.ids is None:
            payload = {"model": self.config.model, "messages": prompt.messages, **body, "logprobs": True,
                       **self.config.extra_body}
            if prompt.continues:
                payload |= {"continue_final_message": True, "add_generation_prompt": False}
            return "/chat/completions", payload
        return "/completions", {"model": self.config.model, "prompt": prompt.ids, **body, "logprobs": 0,
                                **self._completion_extra}
