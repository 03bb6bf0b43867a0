"""How many requests to keep in flight: a limit that can move, and a tuner that moves it
from what the vLLM server reports.

vLLM batches at most `max_num_seqs` sequences (fewer when its KV cache is full) and queues
the rest; its /metrics gauges say how many sequences run and how many wait. The tuner raises
the limit while the server has room and every slot is busy, and lowers it while sequences
queue beyond a small margin, so the batch stays full without a long queue. vLLM does not
publish max_num_seqs itself; this finds the same level from the outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

import thicket.metrics as metrics
from thicket.transport import Exchange, exchange_for, get

log = logging.getLogger("thicket.policy.inflight")

_GAUGE = re.compile(r"^vllm:num_requests_(running|waiting)(?:\{[^}]*\})?\s+(\S+)", re.MULTILINE)


class AdjustableLimit:
    """A semaphore whose limit can move while it is held: lowering it lets holders finish,
    and new acquirers wait until in_use is under the new limit. Limits that `follow` this
    one move with it, times their factor (trees in flight follow requests in flight)."""

    def __init__(self, limit: int, ceiling: int | None = None) -> None:
        self.ceiling = ceiling or limit  # the highest the limit may go
        self._limit = max(1, min(limit, self.ceiling))
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._followers: list[tuple[AdjustableLimit, int]] = []

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        self._limit = max(1, min(limit, self.ceiling))
        for follower, factor in self._followers:
            follower.set_limit(factor * self._limit)
        self._wake()

    def follow(self, leader: AdjustableLimit, factor: int) -> AdjustableLimit:
        leader._followers.append((self, factor))
        self.ceiling = max(self.ceiling, factor * leader.ceiling)
        self.set_limit(factor * leader.limit)
        return self

    async def __aenter__(self) -> None:
        while self.in_use >= self._limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: the wake-up goes to the next waiter
                waiter.cancel()
                raise
        self.in_use += 1

    async def __aexit__(self, *exc: object) -> None:
        self.in_use -= 1
        self._wake()

    def _wake(self) -> None:
        free = self._limit - self.in_use
        while free > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1


@dataclass(frozen=True)
class ServerLoad:
    running: float  # sequences in the batch
    waiting: float  # sequences queued


def parse_server_load(metrics_text: str) -> ServerLoad | None:
    totals = {"running": 0.0, "waiting": 0.0}
    seen = set()
    for kind, value in _GAUGE.findall(metrics_text):
        totals[kind] += float(value)
        seen.add(kind)
    return ServerLoad(totals["running"], totals["waiting"]) if seen == {"running", "waiting"} else None


@dataclass
class InFlightTuner:
    """Moves `limit` between `floor` and its ceiling from the server's load, every period_s."""

    metrics_url: str
    limit: AdjustableLimit
    floor: int = 4
    period_s: float = 1.0
    queue_margin: float = 0.1  # sequences waiting, as a share of those running, that is fine

    peak_running: float = 0.0  # the fullest batch seen: the server's capacity, as far as known

    def next_limit(self, load: ServerLoad) -> int:
        current, busy = self.limit.limit, self.limit.in_use
        self.peak_running = max(self.peak_running, load.running)
        # Requests also wait while their grammar compiles; only a queue behind a full batch counts.
        batch_full = load.running >= 0.8 * self.peak_running > 0
        if batch_full and load.waiting > max(2.0, self.queue_margin * load.running):
            return max(self.floor, math.floor(current * 0.9))
        if load.waiting == 0 and busy >= 0.9 * current:
            return min(self.limit.ceiling, math.ceil(current * 1.25) + 1)
        return current

    async def run(self) -> None:
        exchange = exchange_for(self.metrics_url, max(self.period_s, 1.0), max_connections=1)
        try:
            while True:
                await asyncio.sleep(self.period_s)
                load = await self._read(exchange)
                if load is None:
                    continue
                new = self.next_limit(load)
                if new != self.limit.limit:
                    log.debug("in flight %d -> %d (server: %d running, %d waiting)",
                              self.limit.limit, new, load.running, load.waiting)
                    self.limit.set_limit(new)
                    metrics.LLM_IN_FLIGHT_LIMIT.set(new)
        finally:
            await exchange.aclose()

    async def _read(self, exchange: Exchange) -> ServerLoad | None:
        try:
            response = await exchange("GET", "")
        except httpx.HTTPError:
            return None  # a restarting server: keep the limit, the requests retry on their own
        return parse_server_load(response.text) if response.status == 200 else None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[InFlightTuner]:
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def serves_load_metrics(metrics_url: str) -> bool:
    """Whether the server publishes vLLM's running/waiting gauges (an auto limit needs them)."""
    try:
        response = await get(metrics_url, 5.0)
    except httpx.HTTPError:
        return False
    return response.status == 200 and parse_server_load(response.text) is not None
