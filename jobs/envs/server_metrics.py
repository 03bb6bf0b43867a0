"""The env server's Prometheus metrics (GET /metrics).

/step is the server's hot route, so a request counts with a dict add (and a bisect for a step's
time) rather than through prometheus_client's metric objects, which take a lock a sample (their
counter and histogram cost a /step about 1 µs, against 0.3 µs). At a scrape, ServerMetrics
hands the counts to prometheus_client as a custom collector, and prometheus_client writes the
text format.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# The live instances by family, and the snapshots they keep (read at each scrape).
Census = Callable[[], tuple[Mapping[str, int], int]]


class ServerMetrics(Collector):
    def __init__(self, families: tuple[str, ...], census: Census) -> None:
        self.families = families
        self.census = census
        self.created: Counter[str] = Counter()
        self.steps: Counter[str] = Counter()
        self.resets: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.reaped = 0
        self.step_counts = [0] * (len(STEP_BUCKETS) + 1)  # per bucket; the last is past the largest bound
        self.step_seconds = 0.0

    def count_step(self, family: str, seconds: float) -> None:
        self.steps[family] += 1
        self.step_counts[bisect.bisect_left(STEP_BUCKETS, seconds)] += 1
        self.step_seconds += seconds

    def render(self) -> bytes:
        return generate_latest(self)

    def collect(self) -> Iterator[Metric]:
        live, snapshots = self.census()
        families = sorted(set(live) | set(self.created) | set(self.families))

        def by_family(metric: GaugeMetricFamily | CounterMetricFamily, counts: Mapping[str, int]) -> Metric:
            for family in families:
                metric.add_metric([family], counts.get(family, 0))
            return metric

        yield by_family(GaugeMetricFamily("thicket_env_instances", "Live env instances.", labels=["family"]), live)
        yield by_family(
            CounterMetricFamily("thicket_env_instances_created", "Env instances created.", labels=["family"]),
            self.created,
        )
        yield CounterMetricFamily("thicket_env_instances_reaped", "Idle env instances closed by the reaper.", self.reaped)
        yield GaugeMetricFamily("thicket_env_snapshots", "Snapshots kept by the live instances.", snapshots)
        yield by_family(CounterMetricFamily("thicket_env_steps", "Env steps taken.", labels=["family"]), self.steps)
        yield by_family(
            CounterMetricFamily("thicket_env_resets", "Env resets (a create resets too).", labels=["family"]),
            self.resets,
        )
        errors = CounterMetricFamily("thicket_env_errors", "Error answers, by error code.", labels=["code"])
        for code, n in sorted(self.errors.items()):
            errors.add_metric([code], n)
        yield errors
        bounds = [*map(floatToGoString, STEP_BUCKETS), "+Inf"]
        yield HistogramMetricFamily(
            "thicket_env_step_seconds", "Time in the /step handler (JSON in to JSON out).",
            list(zip(bounds, itertools.accumulate(self.step_counts), strict=True)), self.step_seconds,
        )
