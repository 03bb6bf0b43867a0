"""How the API client (thicket.k8s.client) retries: a 429 (honouring Retry-After), a 5xx and a
dropped connection are tried again, at most RETRY_TRIES tries within RETRY_BUDGET_S seconds
(tenacity), waiting the server's Retry-After (capped) or an exponential backoff between them.
urllib3's own retries are one more connect try and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import urllib3
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_TRIES = 5
RETRY_BUDGET_S = 60.0
RETRY_AFTER_CAP_S = 30.0


class Transient(Exception):
    """A try worth repeating: an answer in RETRY_STATUSES (response set) or a dropped connection."""

    def __init__(self, response: Any = None, error: str | None = None) -> None:
        super().__init__(error or f"HTTP {getattr(response, 'status', '?')}")
        self.response = response
        self.error = error

    def retry_after(self) -> float | None:
        headers = getattr(self.response, "headers", None) or {}
        value = headers.get("Retry-After") if hasattr(headers, "get") else None
        try:
            return max(0.0, float(value)) if value is not None else None
        except ValueError:
            return None  # an HTTP date: the backoff decides


def pool_retries() -> urllib3.util.Retry:
    """urllib3's own retries: one more connect try, nothing else: answers (a 429's Retry-After, which
    urllib3 would sleep uncapped) and dropped connections are Kube.request's (tenacity, bounded)."""
    return urllib3.util.Retry(total=1, connect=1, read=0, status=0, other=0, redirect=0,
                              respect_retry_after_header=False, raise_on_status=False, raise_on_redirect=False)


def dropped(err: BaseException) -> bool:
    """A connection the server (or a proxy) dropped mid-request, worth a second try; not a refused
    or unresolvable one (no API server there: fail at once)."""
    reason = getattr(err, "reason", None)  # MaxRetryError wraps the last error
    if isinstance(reason, BaseException) and reason is not err:
        return dropped(reason)
    if isinstance(err, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError):
        return False
    return (isinstance(err, urllib3.exceptions.ProtocolError | ConnectionResetError | ConnectionAbortedError)
            or type(err).__name__ == "RemoteDisconnected")


def retry_wait(state: RetryCallState) -> float:
    """The server's Retry-After (capped), else 1, 2, 4, ... seconds."""
    outcome = state.outcome
    err = outcome.exception() if outcome is not None else None
    after = err.retry_after() if isinstance(err, Transient) else None
    if after is not None:
        return min(after, RETRY_AFTER_CAP_S)
    return min(2.0 ** (state.attempt_number - 1), RETRY_AFTER_CAP_S)


def retrying(tries: int, budget_s: float, sleep: Callable[[float], None]) -> Retrying:
    """Calls through this are tried again on Transient: at most `tries` tries within `budget_s`
    seconds; the last Transient is raised again when they run out."""
    return Retrying(
        stop=stop_after_attempt(tries) | stop_after_delay(budget_s),
        wait=retry_wait, retry=retry_if_exception_type(Transient), sleep=sleep, reraise=True,
    )
