"""A policy endpoint asked to judge agent steps (Agent-R's transition-point verifier)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

import httpx

from thicket.errors import Unavailable

Message = dict[str, str]

_JUDGEMENT = re.compile(r"Judgement\s*:\s*\**\s*(good|bad|uncertain)", re.IGNORECASE)

QUESTION = (
    "Look at your last action and what it led to. Was it a good step towards completing the task? "
    "Answer in exactly one line: 'Judgement: Good', 'Judgement: Bad' or 'Judgement: Uncertain'."
)


class Judgement(StrEnum):
    GOOD = "good"
    BAD = "bad"
    UNCERTAIN = "uncertain"


def parse_judgement(text: str) -> Judgement:
    match = _JUDGEMENT.search(text)
    return Judgement(match.group(1).lower()) if match else Judgement.UNCERTAIN


@dataclass(frozen=True)
class VerifierConfig:
    url: str  # OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1
    model: str
    timeout_s: float = 60.0
    max_tokens: int = 32
    retries: int = 3


class Verifier:
    """Judges a step from the chat up to and including its observation (greedy, one answer)."""

    def __init__(self, config: VerifierConfig, client: httpx.Client | None = None) -> None:
        self.config = config
        self.client = client or httpx.Client(timeout=config.timeout_s)
        self.calls = 0

    def judge(self, chat: list[Message]) -> Judgement:
        body = {
            "model": self.config.model,
            "messages": [*chat, {"role": "user", "content": QUESTION}],
            "temperature": 0.0,
            "max_tokens": self.config.max_tokens,
            "seed": 0,
        }
        self.calls += 1
        return parse_judgement(self._post(body)["choices"][0]["message"]["content"] or "")

    def _post(self, body: dict) -> dict:
        url = self.config.url.rstrip("/") + "/chat/completions"
        last = ""
        for _ in range(self.config.retries + 1):
            try:
                response = self.client.post(url, json=body)
            except httpx.TransportError as err:
                last = f"{type(err).__name__}: {err}"
                continue
            if response.status_code < 500:
                response.raise_for_status()
                return response.json()
            last = f"HTTP {response.status_code}"
        raise Unavailable(f"verifier {url} did not answer ({last})")

    def close(self) -> None:
        self.client.close()
