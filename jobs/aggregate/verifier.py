"""A policy endpoint asked to judge agent steps (Agent-R's transition-point verifier).

A 429 (or 408), a 5xx or a connection error is retried with exponential backoff and jitter (at least as
long as a Retry-After header asks), until `retries` more tries or `retry_deadline_s` in all;
any other 4xx fails at once (BadInput: asking again will not help)."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from enum import StrEnum

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential, wait_random

from thicket.errors import BadInput, Unavailable

log = logging.getLogger("thicket.aggregate.verifier")

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
    retries: int = 8  # more tries after a 429, a 5xx or a connection error
    retry_deadline_s: float = 300.0  # and no retry once this long has passed since the first try
    backoff_s: float = 0.5  # the first wait; each next one doubles (up to max_backoff_s), plus up to half of it at random
    max_backoff_s: float = 30.0


class _Retryable(Exception):
    """A 408, 429 or 5xx answer (or a connection error, as its cause): worth asking again."""

    def __init__(self, what: str, retry_after_s: float | None = None) -> None:
        super().__init__(what)
        self.retry_after_s = retry_after_s


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header's wait in seconds (delta-seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(when - (time.time() if now is None else now), 0.0)


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
        error = body.get("error", body) if isinstance(body, dict) else body
        message = error.get("message", error) if isinstance(error, dict) else error
    except ValueError:
        message = response.text
    return " ".join(str(message).split())[:300] or response.reason_phrase


class Verifier:
    """Judges a step from the chat up to and including its observation (greedy, one answer)."""

    def __init__(self, config: VerifierConfig, client: httpx.Client | None = None) -> None:
        self.config = config
        self.client = client or httpx.Client(timeout=config.timeout_s)
        self.calls = 0
        self._backoff = wait_exponential(multiplier=config.backoff_s, max=config.max_backoff_s) + wait_random(
            0, config.backoff_s / 2
        )

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
        retrying = Retrying(
            retry=retry_if_exception_type(_Retryable),
            wait=self._wait,
            stop=self._stop,
            before_sleep=self._log_retry,
            reraise=True,
        )
        started = time.monotonic()
        try:
            for attempt in retrying:
                with attempt:
                    return self._once(url, body)
        except _Retryable as err:
            raise Unavailable(f"verifier {url} did not answer: {err} (gave up after "
                              f"{retrying.statistics.get('attempt_number', 1)} tries in "
                              f"{time.monotonic() - started:.1f} s; at most {self.config.retries} retries "
                              f"within {self.config.retry_deadline_s:g} s)") from None
        raise AssertionError("unreachable")

    def _once(self, url: str, body: dict) -> dict:
        try:
            response = self.client.post(url, json=body)
        except httpx.TransportError as err:
            raise _Retryable(f"{type(err).__name__}: {err}") from err
        status = response.status_code
        if status in (408, 429) or status >= 500:
            raise _Retryable(f"HTTP {status}: {_message(response)}", retry_after_s(response.headers.get("retry-after")))
        if status >= 400:
            raise BadInput(f"verifier {url} refused the request (HTTP {status}, not retried): {_message(response)}")
        return response.json()

    def _wait(self, state: RetryCallState) -> float:
        """Exponential backoff with jitter, or the answer's Retry-After where that is longer
        (drawn once per attempt: _stop looks at the same wait)."""
        planned = state.__dict__.get("_thicket_wait")
        if planned is not None and planned[0] == state.attempt_number:
            return planned[1]
        wait = self._backoff(state)
        err = state.outcome.exception() if state.outcome is not None else None
        asked = err.retry_after_s if isinstance(err, _Retryable) else None
        wait = wait if asked is None else max(wait, asked)
        state.__dict__["_thicket_wait"] = (state.attempt_number, wait)
        return wait

    def _stop(self, state: RetryCallState) -> bool:
        """After `retries` more tries, or where the next wait would end past the deadline."""
        if state.attempt_number > self.config.retries:
            return True
        return (state.seconds_since_start or 0.0) + self._wait(state) > self.config.retry_deadline_s

    def _log_retry(self, state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome is not None else None
        log.warning("verifier %s: %s; retrying in %.2f s (attempt %d)", self.config.url, err,
                    self._wait(state), state.attempt_number)

    def close(self) -> None:
        self.client.close()
