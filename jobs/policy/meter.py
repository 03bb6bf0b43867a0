"""How busy the policy server is kept: requests in flight over time."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import thicket.metrics as metrics


@dataclass
class RequestMeter:
    requests: int = 0
    in_flight: int = 0
    peak: int = 0
    _area: float = 0.0  # integral of in_flight over time
    _since: float = field(default_factory=time.perf_counter)
    _last: float = field(default_factory=time.perf_counter)

    def _tick(self) -> None:
        now = time.perf_counter()
        self._area += self.in_flight * (now - self._last)
        self._last = now

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        self._tick()
        self.in_flight += 1
        self.requests += 1
        self.peak = max(self.peak, self.in_flight)
        metrics.LLM_IN_FLIGHT.inc()
        started = self._last
        try:
            yield
        finally:
            self._tick()
            self.in_flight -= 1
            metrics.LLM_IN_FLIGHT.dec()
            metrics.LLM_REQUEST_SECONDS.observe(self._last - started)

    def reset(self) -> None:
        self.requests = self.peak = 0
        self._area = 0.0
        self._since = self._last = time.perf_counter()

    @property
    def mean_in_flight(self) -> float:
        self._tick()
        elapsed = self._last - self._since
        return self._area / elapsed if elapsed > 0 else 0.0
