"""Wait until HTTP endpoints answer (the pod's vLLM and env sidecars), with a deadline."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import httpx

from thicket.errors import Unavailable

log = logging.getLogger(__name__)


def wait_ready(
    urls: Sequence[str],
    timeout_s: float,
    interval_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once every URL answers 2xx; raise Unavailable (exit 3) naming the first that
    did not within `timeout_s`."""
    deadline = clock() + timeout_s
    pending = list(dict.fromkeys(urls))
    log.info("waiting up to %g s for %s", timeout_s, ", ".join(pending), extra={"urls": pending, "seconds": timeout_s})
    last: dict[str, str] = {}
    with httpx.Client(timeout=min(10.0, max(timeout_s, 0.1))) as client:
        while pending:
            for url in list(pending):
                try:
                    response = client.get(url)
                    if response.is_success:
                        pending.remove(url)
                        log.info("ready: %s", url)
                        continue
                    last[url] = f"HTTP {response.status_code}"
                except httpx.HTTPError as err:
                    last[url] = type(err).__name__
            if not pending:
                return
            if clock() >= deadline:
                url = pending[0]
                raise Unavailable(f"{url} did not answer within {timeout_s:g} s (last: {last.get(url, 'no answer')})")
            sleep(min(interval_s, max(0.0, deadline - clock())))
