"""The worker's Prometheus metrics, and the endpoint that serves them (`--metrics-port`).

The metric objects live in prometheus_client's default registry (with its process_* and
python_* metrics); call sites update them directly. Nothing is served unless
serve_metrics is called, so updating them costs a lock and an add.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from thicket.errors import BadInput

log = logging.getLogger("thicket.metrics")

RetryTarget = Literal["llm", "env", "storage"]
RETRY_TARGETS: tuple[RetryTarget, ...] = ("llm", "env", "storage")

TASKS_DONE = Counter("thicket_tasks", "Tasks finished by the worker, by outcome", ["status"])
NODES_GROWN = Counter("thicket_nodes", "Tree nodes grown (counted when a tree is finished)")
LLM_REQUEST_SECONDS = Histogram(
    "thicket_llm_request_seconds",
    "Policy (LLM) request latency, retries included",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300),
)
LLM_IN_FLIGHT = Gauge("thicket_llm_requests_in_flight", "Policy (LLM) requests in flight")
LLM_IN_FLIGHT_LIMIT = Gauge("thicket_llm_requests_in_flight_limit", "Policy requests allowed in flight (tuned with concurrency: auto)")
ENV_STEP_SECONDS = Histogram(
    "thicket_env_step_seconds",
    "Env step latency (replayed steps included)",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
CUT_REPLIES = Counter(
    "thicket_cut_constrained_replies", "Constrained replies cut by their token budget before the action (completed by act)"
)
RETRIES = Counter("thicket_retries", "Requests sent again after a transient failure, by target", ["target"])
PREFIX_CACHE_HIT_RATIO = Gauge(
    "thicket_prefix_cache_hit_ratio", "Share of prompt tokens served from vLLM's prefix cache since the run began"
)

for _target in RETRY_TARGETS:
    RETRIES.labels(_target)  # each target shows up at 0 from the start


def count_retry(target: RetryTarget) -> Callable[[Any], None]:
    """A tenacity `before_sleep` callback that counts one retry of `target`."""
    retries = RETRIES.labels(target)
    return lambda _state: retries.inc()


@dataclass(frozen=True)
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(port: int, host: str = "0.0.0.0") -> MetricsServer:
    """Serve GET /metrics on a daemon thread (port 0: any free port; see .port)."""
    try:
        server, thread = start_http_server(port, addr=host)
    except OSError as err:
        raise BadInput(f"--metrics-port: cannot listen on {host}:{port}: {err.strerror or err}") from None
    metrics = MetricsServer(server, thread)
    log.info("metrics at http://%s:%d/metrics", host, metrics.port, extra={"port": metrics.port})
    return metrics


@contextlib.contextmanager
def metrics_served(port: int, host: str = "0.0.0.0") -> Iterator[MetricsServer | None]:
    """The endpoint for the duration of the block; port 0 serves nothing."""
    if not port:
        yield None
        return
    metrics = serve_metrics(port, host)
    try:
        yield metrics
    finally:
        metrics.close()
